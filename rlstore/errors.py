"""The exceptions the command line turns into exit statuses."""

from __future__ import annotations

import errno
import threading


class UsageError(Exception):
    """A user mistake: the CLI prints the message on one line and exits with status 2."""


class Diverged(UsageError):
    """A loss or a parameter became NaN or inf: the run stops before it writes them (its
    last checkpoint kept), in one line, exit 2."""


class TrainingInterrupted(Exception):
    """SIGINT or SIGTERM arrived and a checkpoint was written; the CLI exits 130 or 143."""

    def __init__(self, signum: int) -> None:
        super().__init__(f"interrupted by signal {signum}")
        self.exit_code = 128 + signum


class DiskFull(Exception):
    """The disk filled while a run was writing; what is already written stays whole (every
    file is written atomically). The CLI prints the message on one line and exits with
    status 1."""


def is_disk_full(error: BaseException | None) -> bool:
    """Whether `error` is a write that found no room (the disk, or the user's quota, full)."""
    return isinstance(error, OSError) and error.errno in (errno.ENOSPC, errno.EDQUOT)


def quiet_disk_full_in_threads() -> None:
    """TensorBoard writes events from a thread of its own; on a full disk that thread's
    traceback would precede the one line the main thread's DiskFull prints (the main thread
    meets the same error at its next write). Other threads' errors print as before."""
    previous = threading.excepthook
    if getattr(previous, "quiet_disk_full", False):
        return  # (main() runs more than once in one process: in tests)

    def hook(args: threading.ExceptHookArgs) -> None:
        if not is_disk_full(args.exc_value):
            previous(args)

    hook.quiet_disk_full = True  # type: ignore[attr-defined]
    threading.excepthook = hook
