"""What several algorithms' loops share: schedules, target updates, the optimizer's
parameters, and the replay buffer's memory check."""

from __future__ import annotations

from typing import Any

import numpy as np
import torch
from torch import nn

from rlstore.run import check_memory
from rlstore.storage.replay import ReplayBuffer


def linear_schedule(start: float, end: float, duration: int, t: int) -> float:
    """`start` at t = 0, moving linearly to `end` at t = duration, then staying there."""
    if t >= duration:
        return end
    return start + max(t, 0) / duration * (end - start)


def crossings(before: int, after: int, every: int) -> int:
    """How many multiples of `every` lie in (before, after]: schedules count env steps."""
    return after // every - before // every


def optimizer_params(optimizer: torch.optim.Optimizer) -> list[torch.Tensor]:
    """The optimizer's parameters, in the order the module gave them: what gradient clipping
    needs, without walking the module tree (Module.parameters() does, at every call)."""
    return [p for group in optimizer.param_groups for p in group["params"]]


@torch.no_grad()
def update_target(target_network: nn.Module, online_network: nn.Module, tau: float) -> None:
    """A hard copy (tau = 1) or a Polyak step towards the online network:
    target <- tau * online + (1 - tau) * target, parameter by parameter."""
    pairs = zip(target_network.parameters(), online_network.parameters(), strict=True)
    for target, online in pairs:
        if tau == 1.0:
            target.copy_(online)
        else:
            target.lerp_(online, tau)


def check_replay_fits(
    device: torch.device,
    capacity: int,
    num_envs: int,
    obs_shape: tuple[int, ...],
    obs_dtype: np.dtype | torch.dtype,
    **buffer_args: Any,
) -> None:
    """Refuse a replay buffer (ReplayBuffer's arguments; observations on `device`) larger
    than the memory left, before it is allocated."""
    obs_bytes, host_bytes = ReplayBuffer.memory_bytes(
        capacity, num_envs, obs_shape, obs_dtype, **buffer_args
    )
    needed = {torch.device("cpu"): host_bytes}
    needed[device] = needed.get(device, 0) + obs_bytes
    per = (obs_bytes + host_bytes) / capacity
    check_memory(
        needed,
        f"--buffer-size {capacity:,} ({per:,.0f} bytes per transition)",
        "lower --buffer-size" + (", or --buffer-device cpu" if device.type == "cuda" else ""),
    )
