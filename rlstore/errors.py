"""The exceptions the command line turns into exit statuses."""

from __future__ import annotations


class UsageError(Exception):
    """A user mistake: the CLI prints the message on one line and exits with status 2."""


class TrainingInterrupted(Exception):
    """SIGINT or SIGTERM arrived and a checkpoint was written; the CLI exits 130 or 143."""

    def __init__(self, signum: int) -> None:
        super().__init__(f"interrupted by signal {signum}")
        self.exit_code = 128 + signum


class DiskFull(Exception):
    """The disk filled while a run was writing; what is already written stays whole (every
    file is written atomically). The CLI prints the message on one line and exits with
    status 1."""
