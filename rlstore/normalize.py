"""Observation normalization and reward scaling, the well-known PPO continuous-control
details, as state that belongs to the run rather than to env wrappers.

The arithmetic is Gymnasium's (NormalizeObservation, NormalizeReward, RunningMeanStd):
observations become (obs - mean) / sqrt(var + eps) as float32, clipped to +-clip; rewards
are divided by sqrt(var + eps) of the running discounted return, clipped to +-clip. The
statistics live in host memory as float64 (Gymnasium keeps the observation statistics in
the observation's dtype) and are updated from training data only: the
observation normalizer is saved with the policy (model.pt, checkpoints) and frozen when
a saved policy acts; the reward scaler is saved in checkpoints.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import torch


class RunningMeanStd:
    """Mean and variance of everything seen so far, merged batch by batch (Chan et al.'s
    parallel formula). Starts at mean 0, variance 1 and a count of 1e-4, as Gymnasium's."""

    def __init__(self, shape: tuple[int, ...] = ()) -> None:
        self.mean = np.zeros(shape, dtype=np.float64)
        self.var = np.ones(shape, dtype=np.float64)
        self.count = 1e-4

    def update(self, batch: np.ndarray) -> None:
        """Merge a batch of samples (first axis: the samples)."""
        if len(batch) == 1:  # one env: the same arithmetic without numpy's reductions
            delta = batch[0] - self.mean
            total = self.count + 1
            self.mean = self.mean + delta / total
            self.var = (self.var * self.count + np.square(delta) * self.count / total) / total
            self.count = total
            return
        batch_mean, batch_var, batch_count = batch.mean(axis=0), batch.var(axis=0), len(batch)
        delta = batch_mean - self.mean
        total = self.count + batch_count
        self.mean = self.mean + delta * batch_count / total
        m2 = self.var * self.count + batch_var * batch_count
        self.var = (m2 + np.square(delta) * self.count * batch_count / total) / total
        self.count = total

    def state_dict(self) -> dict[str, Any]:
        return {
            "mean": torch.from_numpy(np.array(self.mean)),
            "var": torch.from_numpy(np.array(self.var)),
            "count": self.count,
        }

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.mean = state["mean"].numpy().astype(np.float64)
        self.var = state["var"].numpy().astype(np.float64)
        self.count = float(state["count"])


class ObsNormalizer:
    """Normalizes a batch of observations; `update=True` (training) first merges the batch
    into the statistics, as Gymnasium's NormalizeObservation does for every observation an
    env returns (step and reset)."""

    def __init__(self, shape: tuple[int, ...], clip: float = 10.0, epsilon: float = 1e-8) -> None:
        self.rms, self.clip, self.epsilon = RunningMeanStd(shape), clip, epsilon

    def __call__(self, obs: np.ndarray, update: bool = False) -> np.ndarray:
        obs = np.asarray(obs)
        if update:
            self.rms.update(obs)
        normalized = np.float32((obs - self.rms.mean) / np.sqrt(self.rms.var + self.epsilon))
        return np.minimum(np.maximum(normalized, -self.clip), self.clip)  # np.clip, cheaper

    def state_dict(self) -> dict[str, Any]:
        return {**self.rms.state_dict(), "clip": self.clip, "epsilon": self.epsilon}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.rms.load_state_dict(state)
        self.clip, self.epsilon = float(state["clip"]), float(state["epsilon"])

    @classmethod
    def from_state_dict(cls, state: dict[str, Any]) -> ObsNormalizer:
        normalizer = cls(tuple(state["mean"].shape))
        normalizer.load_state_dict(state)
        return normalizer


class RewardScaler:
    """Divides rewards by the running std of each env's discounted return, clipped, as
    Gymnasium's NormalizeReward does for one env (the return accumulates with gamma and
    restarts after a termination). Pseudo-steps (the step after a done) do not count:
    an env wrapper never sees them."""

    def __init__(
        self, num_envs: int, gamma: float, clip: float = 10.0, epsilon: float = 1e-8
    ) -> None:
        self.rms, self.gamma, self.clip, self.epsilon = RunningMeanStd(), gamma, clip, epsilon
        self.returns = np.zeros(num_envs, dtype=np.float64)
        self.prev_done = np.zeros(num_envs, dtype=bool)

    def __call__(
        self, rewards: np.ndarray, terminated: np.ndarray, truncated: np.ndarray
    ) -> np.ndarray:
        if len(rewards) == 1:  # one env: the same arithmetic without boolean indexing
            if not self.prev_done[0]:
                self.returns[0] = self.returns[0] * self.gamma * (1 - terminated[0]) + rewards[0]
                self.rms.update(self.returns)
            self.prev_done = terminated | truncated
        else:
            live = ~self.prev_done
            self.prev_done = terminated | truncated
            self.returns[live] = (
                self.returns[live] * self.gamma * (1 - terminated[live]) + rewards[live]
            )
            if live.any():
                self.rms.update(self.returns[live])
        scaled = rewards / np.sqrt(self.rms.var + self.epsilon)
        return np.minimum(np.maximum(scaled, -self.clip), self.clip).astype(np.float32)

    def state_dict(self) -> dict[str, Any]:
        return {
            **self.rms.state_dict(),
            "returns": torch.from_numpy(self.returns.copy()),
            "prev_done": torch.from_numpy(self.prev_done.copy()),
        }

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.rms.load_state_dict(state)
        self.returns = state["returns"].numpy().astype(np.float64)
        self.prev_done = state["prev_done"].numpy().astype(bool)
