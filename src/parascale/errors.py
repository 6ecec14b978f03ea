"""Errors that the command line turns into one clear line and exit code 2."""


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
