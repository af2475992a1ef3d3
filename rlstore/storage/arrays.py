"""What both storages share: checked conversions of the arrays given to them, and copies
into their tensors that never wait for a GPU."""

from __future__ import annotations

import functools
from typing import Any

import numpy as np
import torch

from rlstore.parts import check_parts, map_parts

Array = torch.Tensor | np.ndarray


def checked(x: Array, name: str, shape: tuple[int, ...], dtype: torch.dtype) -> torch.Tensor:
    """x as a tensor after checking its shape and that its dtype fits `dtype` losslessly."""
    if not isinstance(x, torch.Tensor):
        x = torch.from_numpy(x) if isinstance(x, np.ndarray) else torch.as_tensor(x)
    if x.shape != shape:
        raise ValueError(f"{name} has shape {tuple(x.shape)}, expected {tuple(shape)}")
    if x.dtype != dtype and not _fits(x.dtype, dtype):
        raise TypeError(f"{name} has dtype {x.dtype}, expected {dtype}")
    return x


def host_array(x: Array, name: str, shape: tuple[int, ...], dtype: torch.dtype) -> np.ndarray:
    """x as a numpy array in host memory, after the same checks as `checked`."""
    if type(x) is not np.ndarray:  # the usual case first: isinstance(x, Tensor) costs more
        x = x.detach().cpu().numpy() if isinstance(x, torch.Tensor) else np.asarray(x)
    if x.shape != shape:
        raise ValueError(f"{name} has shape {tuple(x.shape)}, expected {tuple(shape)}")
    if not _numpy_fits(x.dtype, dtype):
        raise TypeError(f"{name} has dtype {torch_dtype(x.dtype)}, expected {dtype}")
    return x


@functools.cache
def _numpy_fits(src: np.dtype, dst: torch.dtype) -> bool:
    return _fits(torch_dtype(src), dst)


def copy_in(dst: torch.Tensor, src: torch.Tensor) -> None:
    """dst.copy_(src) without a host/device synchronisation.

    A host source for a CUDA destination is staged in pinned memory and copied
    asynchronously (PyTorch's pinned-memory cache keeps the staging block alive until the
    copy has run). Everywhere else this is a plain copy.
    """
    if dst.is_cuda and not src.is_cuda:  # convert on the host: the staged copy is then exact
        dst.copy_(src.to(dst.dtype).pin_memory(), non_blocking=True)
    else:
        dst.copy_(src)


def to_device(x: torch.Tensor, device: torch.device) -> torch.Tensor:
    """x on `device`, moved like `copy_in` moves it: no synchronisation for host -> CUDA."""
    if device.type == "cuda" and not x.is_cuda:
        return x.pin_memory().to(device, non_blocking=True)
    return x.to(device)


def load_tensors(owner: Any, names: tuple[str, ...], state: dict[str, Any]) -> None:
    """Copy state[name] into owner.name for each name, in place, after checking them all
    (a tensor, or a tree of them: observations made of parts)."""

    def check(theirs: Any, name: str, mine: torch.Tensor) -> torch.Tensor:
        if not isinstance(theirs, torch.Tensor):
            raise ValueError(f"{name} is a {type(theirs).__name__}, not a tensor")
        if mine.shape != theirs.shape or mine.dtype != theirs.dtype:
            raise ValueError(
                f"{name} is {tuple(theirs.shape)} {theirs.dtype}, "
                f"this {type(owner).__name__} holds {tuple(mine.shape)} {mine.dtype}"
            )
        return theirs

    checked_state = {
        name: check_parts(check, state[name], getattr(owner, name), f"state {name!r}")
        for name in names
    }
    for name in names:
        map_parts(torch.Tensor.copy_, getattr(owner, name), checked_state[name])


def torch_dtype(dtype: torch.dtype | np.dtype | type) -> torch.dtype:
    if isinstance(dtype, torch.dtype):
        return dtype
    return torch.from_numpy(np.zeros(0, dtype=dtype)).dtype


def _fits(src: torch.dtype, dst: torch.dtype) -> bool:
    """Whether values of dtype src go into storage of dtype dst without changing meaning."""
    if dst == torch.bool:
        return src == torch.bool
    if dst.is_floating_point:
        # float64 env rewards and integer rewards are fine as float32.
        return src != torch.bool and not src.is_complex
    # Integer storage (discrete actions, uint8 images): integers only.
    return not src.is_floating_point and src != torch.bool and not src.is_complex
