"""EpisodeStats: the returns and lengths of finished episodes, counted from a vector env's
steps (pseudo-steps add nothing), saved and restored with a run."""

from __future__ import annotations

import numpy as np
import torch


class EpisodeStats:
    """Returns and lengths of finished episodes, on the raw env rewards.

    Call `update` after every vector step with that step's rewards and flags. Pseudo-steps
    (the step after a done) add neither reward nor length.
    """

    def __init__(self, num_envs: int) -> None:
        self.returns = np.zeros(num_envs, dtype=np.float64)
        self.lengths = np.zeros(num_envs, dtype=np.int64)
        self.prev_done = np.zeros(num_envs, dtype=bool)

    def update(
        self, rewards: np.ndarray, terminated: np.ndarray, truncated: np.ndarray
    ) -> tuple[np.ndarray, np.ndarray]:
        """Record one step; return (returns, lengths) of the episodes that ended at it."""
        live = ~self.prev_done
        self.returns += np.where(live, rewards, 0.0)
        self.lengths += live
        done = terminated | truncated
        self.prev_done = done
        if not done.any():
            return _EMPTY_F, _EMPTY_I
        finished = self.returns[done].copy(), self.lengths[done].copy()
        self.returns[done] = 0.0
        self.lengths[done] = 0
        return finished

    def update_one(self, reward: float, done: bool) -> tuple[float, int] | None:
        """update() for one env (num_envs = 1) with Python scalars: the same state, and the
        (return, length) of the episode that ended at this step, if one did."""
        if not self.prev_done[0]:
            self.returns[0] += reward
            self.lengths[0] += 1
        self.prev_done[0] = done
        if not done:
            return None
        finished = float(self.returns[0]), int(self.lengths[0])
        self.returns[0], self.lengths[0] = 0.0, 0
        return finished

    def state_dict(self) -> dict[str, torch.Tensor]:
        """Copies, as tensors (a checkpoint holds no numpy arrays)."""
        return {
            "returns": torch.from_numpy(self.returns.copy()),
            "lengths": torch.from_numpy(self.lengths.copy()),
            "prev_done": torch.from_numpy(self.prev_done.copy()),
        }

    def load_state_dict(self, state: dict[str, torch.Tensor | np.ndarray]) -> None:
        def array(x: torch.Tensor | np.ndarray, dtype: type) -> np.ndarray:
            return (x.numpy() if isinstance(x, torch.Tensor) else np.asarray(x)).astype(dtype)

        self.returns = array(state["returns"], np.float64)
        self.lengths = array(state["lengths"], np.int64)
        self.prev_done = array(state["prev_done"], bool)


_EMPTY_F = np.zeros(0, dtype=np.float64)


_EMPTY_I = np.zeros(0, dtype=np.int64)
