"""The step's phases as contexts, each one timed on the step clock and, inside ``--profile``'s
window, a named range of the trace: one object drives both, so a phase's time and its range
begin and end together.

``with phases.data: ...`` starts the step's clock and stamps the end of the data phase;
``compute`` ends at the moment the strategy names (``Strategy.compute_end``) or now; ``sync``
and ``optimizer`` end now; ``after`` (the work after the optimizer's step: local SGD's
averaging, the divergence check's wait) ends the step, and is a ``sync`` range in the trace.
Outside the profiler's window a phase is its clock stamps alone: a context whose enter does
nothing (the data phase's starts the clock) and whose exit stamps; inside it, the same phases
wrapped in ``torch.profiler.record_function`` ranges, swapped in at the window's first step
and out after its last.
"""
from __future__ import annotations

from collections.abc import Callable
from typing import Any

from torch.profiler import record_function

from parascale.training.observe.measure import StepClock
from parascale.training.observe.profiling import Profiler


class _Phase:
    """A phase on the clock: ``ends`` stamps its end (not when the phase raised: the step
    failed, and its times with it)."""

    __slots__ = ("ends",)

    def __init__(self, ends: Callable[[], None]):
        self.ends = ends

    def __enter__(self) -> None:
        return None

    def __exit__(self, kind: Any, value: Any, traceback: Any) -> None:
        if kind is None:
            self.ends()


class _First(_Phase):
    """The step's first phase: the clock starts as it begins."""

    __slots__ = ("begins",)

    def __init__(self, begins: Callable[[], None], ends: Callable[[], None]):
        super().__init__(ends)
        self.begins = begins

    def __enter__(self) -> None:
        self.begins()


class _Traced:
    """A phase inside the profiler's window: timed as outside it, and a named range."""

    def __init__(self, phase: _Phase, name: str):
        self.phase, self.name = phase, f"parascale.{name}"
        self.range: Any = None

    def __enter__(self) -> None:
        self.phase.__enter__()
        self.range = record_function(self.name)
        self.range.__enter__()

    def __exit__(self, kind: Any, value: Any, traceback: Any) -> None:
        self.range.__exit__(kind, value, traceback)
        self.phase.__exit__(kind, value, traceback)


class StepPhases:
    """One rank's step phases: ``data``, ``compute``, ``sync``, ``optimizer`` and ``after``,
    each a context; ``begin`` and ``end`` around every step (the profiler's window)."""

    NAMES = ("data", "compute", "sync", "optimizer", "sync")  # the trace's name of each

    def __init__(self, clock: StepClock, profiler: Profiler,
                 compute_end: Callable[[], Any] = lambda: None):
        self.clock, self.profiler = clock, profiler

        def computed() -> None:
            clock.boundary(compute_end())

        self._timed = (_First(clock.start, clock.mark), _Phase(computed),
                       _Phase(clock.boundary), _Phase(clock.boundary), _Phase(clock.stop))
        self._traced = tuple(_Traced(phase, name)
                             for phase, name in zip(self._timed, self.NAMES))
        self._use(self._timed)
        self._tracing = False

    def _use(self, phases: tuple[Any, ...]) -> None:
        self.data, self.compute, self.sync, self.optimizer, self.after = phases

    def begin(self, step: int) -> None:
        """Before step ``step`` (1-based) takes its first batch."""
        profiler = self.profiler
        if profiler.window is None:
            return
        profiler.step_begins(step)
        if profiler.tracing != self._tracing:
            self._tracing = profiler.tracing
            self._use(self._traced if self._tracing else self._timed)

    def end(self, step: int) -> None:
        """After step ``step``: the profiler writes its trace after the window's last."""
        if self.profiler.window is not None:
            self.profiler.step_ends(step)
