"""rlstore/locks.py: a directory's lock is held by one holder at a time, names its pid, is
read without being made, and is no obstacle where the file system has no locks."""

import errno
import os

import pytest

from rlstore import locks
from rlstore.locks import LOCK_FILE, DirectoryLock, holder

pytestmark = pytest.mark.skipif(locks.fcntl is None, reason="no fcntl: nothing is locked")


def test_one_holder_at_a_time_and_it_names_its_pid(tmp_path):
    assert holder(tmp_path) is None and not (tmp_path / LOCK_FILE).exists()  # made by none
    first, second = DirectoryLock(tmp_path), DirectoryLock(tmp_path)
    assert first.acquire() is None
    assert holder(tmp_path) == str(os.getpid())
    assert second.acquire() == str(os.getpid())  # refused: the first holds it
    first.release()
    first.release()  # (again: nothing to do)
    assert holder(tmp_path) is None
    assert second.acquire() is None
    second.release()


def test_a_file_system_without_locks_locks_nothing(tmp_path, monkeypatch):
    def no_locks(*args):
        raise OSError(errno.ENOLCK, "No locks available")

    monkeypatch.setattr(locks.fcntl, "flock", no_locks)
    assert DirectoryLock(tmp_path).acquire() is None
    assert holder(tmp_path) is None
