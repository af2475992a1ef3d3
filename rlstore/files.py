"""Files that survive a crash and load without running code: what checkpoints, model files
and the storages' own save/load share."""

from __future__ import annotations

import errno
import os
import pickle
import tempfile
from pathlib import Path
from typing import Any

import numpy as np
import torch


def atomic_save(obj: Any, path: str | Path) -> None:
    """torch.save to a temporary file in the same folder, flush, fsync, then rename. The file
    gets the mode that open() would give it (mkstemp's own is private to the owner)."""
    path = Path(path)
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
    try:
        os.fchmod(fd, 0o666 & ~_umask())
        with os.fdopen(fd, "wb") as f:
            torch.save(obj, f)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException as e:
        written = os.path.getsize(tmp) if os.path.exists(tmp) else 0
        Path(tmp).unlink(missing_ok=True)
        # torch.save reports a short write on a full disk as a RuntimeError ("unexpected
        # pos"): name the cause, as a plain write would (OSError ENOSPC)
        if isinstance(e, RuntimeError) and no_room_for(written, path.parent):
            raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC), str(path)) from e
        raise


def atomic_write_bytes(path: Path, data: bytes) -> None:
    """`data` into `path` through a temporary file beside it, then a rename."""
    tmp = path.with_name(f".{path.name}.tmp")
    try:
        tmp.write_bytes(data)
        os.replace(tmp, path)
    finally:
        tmp.unlink(missing_ok=True)


def no_room_for(size: int, folder: Path) -> bool:
    """Whether `folder`'s file system lacks room for `size` more bytes (and some slack)."""
    try:
        stat = os.statvfs(folder)
    except OSError:
        return False
    return stat.f_bavail * stat.f_frsize < size + (64 << 20)


def _umask() -> int:
    mask = os.umask(0)  # reading the umask means setting it: put it straight back
    os.umask(mask)
    return mask


def safe_load(path: str | Path) -> Any:
    """torch.load without executing code; a clear ValueError when the file is not readable."""
    try:  # mmap: a large replay buffer is copied from the page cache, not held twice in memory
        return torch.load(path, map_location="cpu", weights_only=True, mmap=True)
    except Exception:  # not a zip archive, or broken: the plain load tells why
        pass
    try:
        return torch.load(path, map_location="cpu", weights_only=True)
    except Exception as e:  # truncated, garbage or foreign files all land here
        raise ValueError(f"{path} is not a readable checkpoint ({_load_failure(e)})") from None


def _load_failure(error: Exception) -> str:
    """Why torch.load failed, in a few words (its own messages run to paragraphs)."""
    if isinstance(error, pickle.UnpicklingError):
        return "not a file of tensors and plain values"
    if isinstance(error, EOFError) or "zip archive" in str(error):
        return "truncated or corrupt"
    line = str(error).strip().splitlines()[0] if str(error).strip() else type(error).__name__
    return line if len(line) <= 120 else line[:120].rsplit(" ", 1)[0] + " ..."


# torch.save in torch 2.4 (the oldest rlstore allows) cannot write uint16, uint32 or
# uint64 tensors ("dtype torch.uint32 is not recognized"), and numpy's global generator keeps
# its key as uint32: such arrays are saved as the signed integers of the same bits, with
# their dtype beside.
_SIGNED_OF = {
    np.dtype(np.uint16): np.int16,
    np.dtype(np.uint32): np.int32,
    np.dtype(np.uint64): np.int64,
}


def array_to_saved(array: np.ndarray) -> torch.Tensor | dict[str, Any]:
    """A copy of `array` that torch.save writes and torch.load(weights_only=True) reads."""
    signed = _SIGNED_OF.get(array.dtype)
    if signed is None:
        return torch.from_numpy(array.copy())
    return {"__unsigned__": torch.from_numpy(array.view(signed).copy()), "dtype": array.dtype.name}


def saved_to_array(saved: torch.Tensor | dict[str, Any]) -> np.ndarray:
    """The array `array_to_saved` saved (or a plain tensor's, as older checkpoints hold)."""
    if isinstance(saved, dict):
        return saved["__unsigned__"].numpy().view(np.dtype(saved["dtype"])).copy()
    return saved.numpy().copy()
