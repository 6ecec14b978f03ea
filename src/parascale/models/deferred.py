"""A model built without storage, whose parameters are computed later one tensor at a time,
bit for bit as its constructor would have made them.

:func:`build` calls the model's factory on the meta device (torch's: shapes and dtypes, no
data) under a dispatch mode that writes down every operation the construction makes: the one
that made each storage, and every in-place operation on it after (an initialiser's
``normal_``, ``zero_``, ``copy_`` from another tensor, a fill through a view). Random operations
note the state of their generator first, and then draw the same numbers on a scratch tensor
of the same layout, so the generator moves as the real construction moves it: what the
constructor draws after, and what training draws once the model is built, is the same as in
a run that built the model whole.

:meth:`Recipe.value` replays the operations of one parameter or buffer on the CPU, setting
each random operation's generator to its noted state, and returns the tensor whole; a
strategy that shards the parameters (sync/fsdp.py) keeps its own part and frees the rest, so
a rank never holds more of the model than one tensor at a time. CPU kernels are
deterministic, so the replay equals the construction exactly.

What cannot be replayed raises :class:`NotReplayable` with the reason: a construction that
reads a value (``.item()``, a branch on the data: meta tensors have none), resizes or
re-points a storage, makes a parameter on a device of its own, or keeps a tensor where
``to_empty`` cannot see it. The caller then builds the model whole.
"""
from __future__ import annotations

import weakref
from dataclasses import dataclass, field
from typing import Any, Callable

import torch
from torch import nn
from torch.overrides import TorchFunctionMode
# torch documents its dispatch modes and pytrees in these modules (no public alias exists)
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils._pytree import tree_flatten, tree_map

__all__ = ["NotReplayable", "Recipe", "build", "materialise", "recipe_of"]

_META = torch.device("meta")
_CPU = torch.device("cpu")
_SEEDED = torch.Tag.nondeterministic_seeded
#: operations that change which memory a tensor stands on, not what it holds: a replay on
#: views of a fresh tensor cannot follow them
_REFUSED = ("set_", "resize_", "resize_as_", "_unsafe_set")


class NotReplayable(Exception):
    """The construction did something its replay could not repeat (the message says what)."""


@dataclass(eq=False)
class _Op:
    """One operation of the construction: tensors among its arguments are :class:`_View` s of
    recorded storages or (cloned) constants; ``writes`` the position of the argument it writes
    into, if any; ``rng`` the generator and its state before it ran, for a random one."""

    func: Callable[..., Any]
    args: tuple
    kwargs: dict
    writes: int | None = None
    rng: tuple[torch.Generator, torch.Tensor] | None = None


@dataclass(eq=False)
class _Storage:
    """A storage the construction made on the meta device: output ``index`` of ``made``, then
    the in-place operations on it, each with the view it wrote through."""

    made: _Op
    index: int
    keep: torch.Tensor  # a tensor on it, so that its address is never another storage's
    changes: list[tuple[_View, _Op]] = field(default_factory=list)


@dataclass(frozen=True, eq=False)
class _View:
    """A tensor as it stood: its storage after ``version`` of its changes, and its layout."""

    storage: _Storage
    version: int
    size: tuple[int, ...]
    stride: tuple[int, ...]
    offset: int


def _on_cpu(value: Any) -> Any:
    return _CPU if isinstance(value, torch.device) and value.type == "meta" else value


def _is_meta(value: Any) -> bool:
    return isinstance(value, torch.Tensor) and value.is_meta


def _written(func) -> int | None:
    """The position of the first argument ``func`` writes into (``Tensor(a!)``), or None."""
    return next((i for i, a in enumerate(func._schema.arguments)
                 if a.alias_info is not None and a.alias_info.is_write), None)


class _Constants(TorchFunctionMode):
    """Tensors made from Python data (``torch.tensor(0)``, a BatchNorm's count) are made on
    the meta device without an operation the dispatch mode sees, and their values are lost:
    this makes them on the CPU and moves them, which it sees (a copy of a constant)."""

    def __torch_function__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        if func in _FROM_DATA and kwargs.get("device") is None:
            return func(*args, **{**kwargs, "device": _CPU}).to(_META)
        return func(*args, **kwargs)


_FROM_DATA = (torch.tensor, torch.as_tensor, torch.asarray, torch.Tensor.new_tensor)

#: torch.nn.init's initialisers that return at once on a meta tensor (they draw a number of
#: values that depends on the values, or use the values): recorded as one operation each
_SKIP_META = ("_no_grad_trunc_normal_", "orthogonal_", "sparse_", "dirac_")


class _Recorder(TorchDispatchMode):
    """Writes down what the construction does to tensors on the meta device."""

    def __init__(self) -> None:
        super().__init__()
        self.storages: dict[int, _Storage] = {}

    def storage(self, t: torch.Tensor) -> _Storage:
        found = self.storages.get(t.untyped_storage()._cdata)
        if found is None:
            raise NotReplayable("it makes a tensor on the meta device in a way parascale does "
                                "not see")
        return found

    def view(self, t: torch.Tensor) -> _View:
        s = self.storage(t)
        if t.dtype != s.keep.dtype:
            raise NotReplayable("it views a tensor's memory as another dtype")
        return _View(s, len(s.changes), tuple(t.shape), tuple(t.stride()),
                     int(t.storage_offset()))

    def noted(self, value: Any) -> Any:
        """An argument as the replay needs it: a view of a recorded storage, or a constant."""
        if not isinstance(value, torch.Tensor):
            return value
        if value.is_meta:
            return self.view(value)
        return value.detach().clone()  # a constant; the construction may change it later

    def record(self, func, args: tuple, kwargs: dict, writes: int | None,
               seeded: bool) -> _Op:
        """``func``'s operation, noted before it runs (a random one draws what it would)."""
        op = _Op(func, tuple(tree_map(self.noted, list(args))), tree_map(self.noted, kwargs),
                 writes)
        if seeded:
            op.rng = self.advance(func, args, kwargs, writes)
        if writes is not None and writes < len(args) and _is_meta(args[writes]):
            target = args[writes]
            self.storage(target).changes.append((op.args[writes], op))
        elif writes is not None and writes >= len(args):
            raise NotReplayable(f"it writes into an output argument ({func})")
        return op

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        name = func.overloadpacket.__name__
        if name in _REFUSED:
            raise NotReplayable(f"it calls {name} on a tensor, which the replay cannot follow")
        flat = tree_flatten((args, kwargs))[0]
        if not any(_is_meta(a) or (isinstance(a, torch.device) and a.type == "meta")
                   for a in flat):
            return func(*args, **kwargs)  # on real tensors alone: nothing of the model
        op = self.record(func, args, kwargs, _written(func), _SEEDED in func.tags)
        out = func(*args, **kwargs)
        for index, t in enumerate(tree_flatten(out)[0]):
            if _is_meta(t) and t.untyped_storage()._cdata not in self.storages:
                self.storages[t.untyped_storage()._cdata] = _Storage(op, index, t)
        return out

    def initialiser(self, original: Callable[..., Any]) -> Callable[..., Any]:
        """``original`` (one of ``_SKIP_META``), recorded as one operation on a meta tensor."""
        def recorded(tensor, *args, **kwargs):
            if not _is_meta(tensor):
                return original(tensor, *args, **kwargs)
            self.record(original, (tensor, *args), kwargs, 0, True)
            return tensor

        return recorded

    def advance(self, func, args, kwargs, writes: int | None) -> tuple[torch.Generator,
                                                                        torch.Tensor]:
        """The generator's state before ``func``, after drawing what ``func`` draws: into a
        scratch tensor of the written tensor's layout (an initialiser fills it whatever it
        held), on the other tensors' replayed values."""
        generator = kwargs.get("generator") or torch.default_generator
        state = generator.get_state()
        with torch.device(_CPU):  # what it makes without naming a device: real, on the CPU
            real = [torch.empty_strided(a.shape, a.stride(), dtype=a.dtype)
                    if i == writes and _is_meta(a) else _replayed(self.view(a)) if _is_meta(a)
                    else _on_cpu(a) for i, a in enumerate(args)]
            real_kwargs = tree_map(lambda v: _replayed(self.view(v)) if _is_meta(v)
                                   else _on_cpu(v), kwargs)
            generator.set_state(state)  # replaying the other arguments may have drawn
            func(*real, **real_kwargs)
        return generator, state


def _replayed(view: _View, memo: dict | None = None) -> torch.Tensor:
    """The tensor ``view`` stood for, computed on the CPU."""
    base = _storage_at(view.storage, view.version, {} if memo is None else memo)
    return base.as_strided(view.size, view.stride, view.offset)


def _storage_at(storage: _Storage, version: int, memo: dict) -> torch.Tensor:
    """A fresh tensor on ``storage``'s whole memory as it was after ``version`` changes."""
    key = (id(storage), version)
    if key in memo:
        return memo[key]
    base = tree_flatten(_run(storage.made, memo))[0][storage.index]
    for view, op in storage.changes[:version]:
        _run(op, memo, base.as_strided(view.size, view.stride, view.offset))
    memo[key] = base
    return base


def _run(op: _Op, memo: dict, target: torch.Tensor | None = None) -> Any:
    """``op`` on real tensors, writing into ``target`` (its written argument) when given."""
    def real(value: Any) -> Any:
        return _replayed(value, memo) if isinstance(value, _View) else _on_cpu(value)

    args = [target if i == op.writes and target is not None else tree_map(real, a)
            for i, a in enumerate(op.args)]
    kwargs = tree_map(real, op.kwargs)
    if op.rng is None:
        return op.func(*args, **kwargs)
    generator, state = op.rng
    before = generator.get_state()
    generator.set_state(state)
    try:
        return op.func(*args, **kwargs)
    finally:
        generator.set_state(before)


_EMPTY = ("empty", "empty_strided", "empty_like", "new_empty", "new_empty_strided")


def _never_written(storage: _Storage) -> bool:
    """Made empty and never changed: what an initialiser that returns at once on a meta
    tensor (and was not recorded) leaves, where the real construction wrote values."""
    func = storage.made.func
    return not storage.changes and getattr(func, "overloadpacket", func).__name__ in _EMPTY


class Recipe:
    """How to compute each parameter, buffer and tensor attribute of a model built by
    :func:`build`, by its name in the model."""

    def __init__(self, tensors: dict[str, _View], attributes: dict[tuple[str, str], _View]):
        self.tensors = tensors
        self.attributes = attributes

    def value(self, name: str) -> torch.Tensor:
        """Parameter or buffer ``name``, whole, on the CPU, as the construction made it."""
        return _replayed(self.tensors[name])


_RECIPES: weakref.WeakKeyDictionary[nn.Module, Recipe] = weakref.WeakKeyDictionary()


def recipe_of(model: nn.Module) -> Recipe | None:
    """The recipe of a model :func:`build` made (not yet materialised), else None."""
    return _RECIPES.get(model)


def build(factory: Callable[[], nn.Module]) -> nn.Module:
    """``factory()`` on the meta device, its operations written down (:func:`recipe_of`). The
    global generator ends where ``factory()`` would leave it; where the construction cannot be
    replayed, it is as it was before, and NotReplayable says why."""
    recorder = _Recorder()
    state = torch.get_rng_state()
    originals = {name: getattr(nn.init, name) for name in _SKIP_META}
    try:
        for name, original in originals.items():
            setattr(nn.init, name, recorder.initialiser(original))
        with torch.device(_META), _Constants(), recorder:
            model = factory()
        if isinstance(model, nn.Module):  # anything else: the caller says what is wrong
            _RECIPES[model] = _recipe(model, recorder)
        return model
    except Exception as exc:  # noqa: BLE001 - whatever meta tensors cannot do, in one line
        torch.set_rng_state(state)
        cause: BaseException = exc
        while cause.__cause__ is not None:  # the model's own error, not a wrapper's words
            cause = cause.__cause__
        if isinstance(cause, NotReplayable):
            raise NotReplayable(str(cause)) from exc
        first = (str(cause).strip().splitlines() or [""])[0][:200]
        raise NotReplayable(f"building it without storage failed: {type(cause).__name__}: "
                            f"{first}") from exc
    finally:
        for name, original in originals.items():
            setattr(nn.init, name, original)


def _recipe(model: nn.Module, recorder: _Recorder) -> Recipe:
    """The recipe of every parameter, buffer and tensor attribute of ``model``."""
    tensors: dict[str, _View] = {}
    for name, t in [*model.named_parameters(remove_duplicate=False),
                    *model.named_buffers(remove_duplicate=False)]:
        if not t.is_meta:
            raise NotReplayable(f"its {name} was made on {t.device} by the model itself")
        view = recorder.view(t)
        if _never_written(view.storage):
            raise NotReplayable(f"its {name} is never written as it is built without storage "
                                "(by an initialiser that skips meta tensors?)")
        tensors[name] = view
    attributes = {}
    for path, module in model.named_modules():
        for attr, value in vars(module).items():
            if isinstance(value, torch.Tensor) and value.is_meta:
                attributes[(path, attr)] = recorder.view(value)
            elif isinstance(value, (list, tuple, dict)) and any(
                    isinstance(v, torch.Tensor) and v.is_meta for v in tree_flatten(value)[0]) \
                    and attr not in ("_parameters", "_buffers", "_modules"):
                raise NotReplayable(f"{path or 'the model'}.{attr} holds tensors that are "
                                    "neither parameters nor buffers")
    return Recipe(tensors, attributes)


def _copy(target: torch.Tensor, whole: torch.Tensor) -> None:
    target.copy_(whole)


def materialise(model: nn.Module, device: torch.device,
                fill: Callable[[torch.Tensor, torch.Tensor], None] = _copy) -> None:
    """Give ``model`` (built by :func:`build`, perhaps sharded since) its storage on ``device``
    and its values, one tensor at a time; ``fill(target, whole)`` puts into ``target`` its part
    of the whole tensor (a shard of it, or all of it)."""
    recipe = _RECIPES.pop(model)
    tied: dict[int, list[str]] = {}
    for name, p in model.named_parameters(remove_duplicate=False):
        tied.setdefault(id(p), []).append(name)
    model.to_empty(device=device)
    for first, *others in tied.values():  # to_empty makes a new parameter for each module
        for name in others:
            path, _, attr = name.rpartition(".")
            setattr(model.get_submodule(path), attr, model.get_parameter(first))
    with torch.no_grad():
        for name, t in [*model.named_parameters(), *model.named_buffers()]:
            fill(t, recipe.value(name))
        for (path, attr), view in recipe.attributes.items():
            setattr(model.get_submodule(path), attr, _replayed(view).clone().to(device))
