"""Errors that the command line turns into one clear line and exit code 2."""
import sysconfig
import traceback


class UsageError(Exception):
    """Bad input from the user: the message says what is wrong and what would be right.

    Raised before anything is written or any process starts; the CLI prints it as one line
    (``parascale: error: <message>``) and exits with code 2.
    """


class WorkerFailure(RuntimeError):
    """A training worker raised, died or stalled. The message names the rank and the cause."""

    def __init__(self, message: str, rank: int | None = None):
        super().__init__(message)
        self.rank = rank


class KnownFailure(RuntimeError):
    """A known way for training to fail (a diverging loss, an unreadable data file) whose message
    says all the user needs: a worker reports it as one line, without a traceback on the
    terminal (the run record's ``detail`` keeps the traceback).

    ``secondary`` marks a rank that stops only because another rank's failure was decided
    collectively, so that the launcher names the rank where it happened.
    """

    def __init__(self, message: str, secondary: bool = False):
        super().__init__(message)
        self.secondary = secondary


class NoSpace(KnownFailure, UsageError):
    """A file could not be written because its file system (or the user's quota) is full.

    One line wherever it happens: a worker reports it as a known failure (no traceback, no
    restart: the disk is as full after one), and the command ends with exit code 2, as for an
    --out it cannot write, keeping the previous results (``parascale.files.no_space``).
    """


def where(exc: BaseException) -> str:
    """' (file.py:12)': the deepest frame of the traceback in the user's own code, not in the
    standard library or an installed package (the line to look at), or '' if there is none.
    The first frame is the caller's own call of the user's function, skipped."""
    libraries = tuple({sysconfig.get_path(k) for k in ("stdlib", "platstdlib", "purelib",
                                                       "platlib")})
    frames = traceback.extract_tb(exc.__traceback__)[1:]
    own = [f for f in frames if not f.filename.startswith(libraries)]
    return f" ({own[-1].filename}:{own[-1].lineno})" if own else ""
