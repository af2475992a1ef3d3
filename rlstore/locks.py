"""Locks that say a run or a suite is going on, so that a second process does not resume,
remove or overwrite what the first is writing. A lock is an advisory `flock` on a file in
the directory, held for as long as the process trains and released by the system when the
process ends, however it ends: a lock is never stale. The file holds the holder's pid, for
the message. Where there is no `fcntl` (Windows), nothing is locked and nothing refused.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import IO

try:
    import fcntl
except ImportError:  # pragma: no cover (Windows)
    fcntl = None  # type: ignore[assignment]

LOCK_FILE = ".lock"


class DirectoryLock:
    """The lock of one directory, taken by `acquire` and given back by `release`."""

    def __init__(self, directory: Path) -> None:
        self.path = Path(directory) / LOCK_FILE
        self._file: IO[str] | None = None

    def acquire(self) -> str | None:
        """Take the lock: None, or (taking nothing) the pid of the process that holds it."""
        if fcntl is None or self._file is not None:
            return None
        file = open(self.path, "a+")  # noqa: SIM115 (held open while the lock is held)
        try:
            fcntl.flock(file, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            file.seek(0)
            pid = file.read().strip() or "?"
            file.close()
            return pid
        except OSError:  # a file system without locks (some network mounts): go on unlocked
            file.close()
            return None
        file.truncate(0)
        file.write(str(os.getpid()))
        file.flush()
        self._file = file
        return None

    def release(self) -> None:
        """Give the lock back (closing the file does); safe to call again."""
        if self._file is not None:
            self._file.close()
            self._file = None


def holder(directory: Path) -> str | None:
    """The pid of the process that holds `directory`'s lock, or None when none does. Reads
    only: it creates and changes nothing."""
    path = Path(directory) / LOCK_FILE
    if fcntl is None or not path.is_file():
        return None
    with open(path) as file:
        try:
            fcntl.flock(file, fcntl.LOCK_SH | fcntl.LOCK_NB)
        except BlockingIOError:
            return file.read().strip() or "?"
        except OSError:  # (no locks on this file system)
            return None
    return None
