"""What several algorithms' loops share: schedules, and the optimizer's parameters."""

from __future__ import annotations

import torch


def linear_schedule(start: float, end: float, duration: int, t: int) -> float:
    """`start` at t = 0, moving linearly to `end` at t = duration, then staying there."""
    if t >= duration:
        return end
    return start + max(t, 0) / duration * (end - start)


def optimizer_params(optimizer: torch.optim.Optimizer) -> list[torch.Tensor]:
    """The optimizer's parameters, in the order the module gave them: what gradient clipping
    needs, without walking the module tree (Module.parameters() does, at every call)."""
    return [p for group in optimizer.param_groups for p in group["params"]]
