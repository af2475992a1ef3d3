"""How a ReplayBuffer draws its batches' slots: uniformly over the transitions it can sample,
or in proportion to their priorities (storage/priorities.py). Both take the buffer's one
random generator, so a seed gives the same draws whatever else the buffer does with it.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import torch

from rlstore.storage.priorities import Priorities
from rlstore.storage.ring import Ring


class UniformSampler:
    """Flat slots drawn uniformly from the sampleable ones: valid and not blocked (a frame
    stack that can no longer be rebuilt), by rejection (few are not)."""

    priorities = None

    def draw(
        self,
        batch_size: int,
        beta: float,
        ring: Ring,
        blocked: np.ndarray | None,
        count: int,
        generator: np.random.Generator,
    ) -> tuple[np.ndarray, np.ndarray]:
        """(flat slots, importance weights: ones)."""
        valid = ring.flat("valid")

        def rejected(flat: np.ndarray) -> np.ndarray:
            return ~valid[flat] if blocked is None else ~valid[flat] | blocked[flat]

        high = min(ring.added, ring.rows) * ring.num_envs  # slots ever written
        flat = generator.integers(0, high, batch_size)
        redraw = rejected(flat)
        for _ in range(8):
            if not redraw.any():
                return flat, np.ones(batch_size)
            flat[redraw] = generator.integers(0, high, int(redraw.sum()))
            redraw = rejected(flat)
        if redraw.any():  # mostly invalid slots (tiny buffers): draw from the valid list
            valid_flat = np.flatnonzero(valid if blocked is None else valid & ~blocked)
            flat[redraw] = valid_flat[generator.integers(0, len(valid_flat), redraw.sum())]
        return flat, np.ones(batch_size)

    def written(self, row: int, following: int, valid: np.ndarray) -> None:
        """New transitions in `row`, and `following` emptied: nothing to keep."""

    def forget(self, flat: np.ndarray) -> None:
        """Slots that can no longer be sampled: the draw's rejection sees them."""

    def state_dict(self) -> dict[str, Any]:
        return {"priorities": None, "max_priority": 1.0}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        if state["priorities"] is not None:
            raise ValueError("prioritized and uniform buffers cannot load each other's state")


class PrioritizedSampler:
    """Flat slots drawn in proportion to priority^alpha, with importance weights for beta
    (Schaul et al. 2016; the priorities and their sum tree: storage/priorities.py)."""

    def __init__(self, rows: int, num_envs: int, alpha: float, eps: float) -> None:
        self.priorities = Priorities(rows * num_envs, alpha, eps)
        self.envs = np.arange(num_envs)

    @staticmethod
    def memory_bytes(slots: int) -> int:
        return 2 * (1 << max(slots - 1, 0).bit_length()) * 8  # the sum tree's float64 nodes

    def draw(
        self,
        batch_size: int,
        beta: float,
        ring: Ring,
        blocked: np.ndarray | None,
        count: int,
        generator: np.random.Generator,
    ) -> tuple[np.ndarray, np.ndarray]:
        """(flat slots, importance weights); slots that cannot be sampled have priority 0."""
        return self.priorities.draw(batch_size, count, beta, generator)

    def written(self, row: int, following: int, valid: np.ndarray) -> None:
        """New transitions in `row` (the valid ones at the largest priority so far), and
        `following` emptied (the ring's new cursor row)."""
        N = len(self.envs)
        self.priorities.add(row * N + self.envs, valid, cleared=following * N + self.envs)

    def forget(self, flat: np.ndarray) -> None:
        if len(flat):
            self.priorities.clear(flat)

    def update(self, flat: np.ndarray, td_errors: np.ndarray) -> None:
        self.priorities.update(flat, td_errors)

    def state_dict(self) -> dict[str, Any]:
        return {
            "priorities": self.priorities.leaves(),
            "max_priority": self.priorities.max_priority,
        }

    def load_state_dict(self, state: dict[str, Any]) -> None:
        leaves: torch.Tensor | None = state["priorities"]
        if leaves is None:
            raise ValueError("prioritized and uniform buffers cannot load each other's state")
        self.priorities.load(leaves, float(state["max_priority"]))
