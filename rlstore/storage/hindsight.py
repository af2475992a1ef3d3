"""Hindsight experience replay (Andrychowicz et al. 2017) for the ReplayBuffer.

Goal-conditioned envs (Gymnasium-Robotics' convention) observe a dict with `observation`,
`achieved_goal` and `desired_goal`, and compute their reward from the two goals with
`compute_reward(achieved_goal, desired_goal, info)`. HER replays a stored transition with a
goal the agent did reach in the same episode, and so learns from episodes that missed theirs.

Relabelling happens when a batch is sampled, from transitions stored once. The first
goals * batch_size // (goals + 1) transitions of a batch are relabelled (SB3's fraction
1 - 1 / (1 + goals)): the relabelled goal replaces `desired_goal` in obs and next_obs, the
reward is recomputed by the env's `compute_reward` (one call per batch, on arrays), and the
termination too where the env has `compute_terminated` (else the stored one is kept).

Where the goal comes from (t: the sampled transition; the goal of step j is the
achieved_goal of step j's next observation, s_{j+1}):
    future   j uniform over the episode's transitions at or after t,
    final    j the episode's last transition,
    episode  j uniform over all of the episode's transitions.
An episode is one env's stream from a reset to the step that ended it (terminated,
truncated) or to the last step before its stream broke (a manual or partial reset: the
episode was abandoned, and the stream's next steps are another episode, resume included).
An episode still running relabels from the steps stored so far. Only steps still in the
buffer count: when the ring has overwritten an episode's first steps, `episode` draws from
the rest (and `future` and `final` never need the steps before t).

EpisodeIndex keeps, for each slot of the ring, the write numbers (ReplayBuffer.added at the
time) of its episode's first and last transitions, the last being -1 while it runs.
Relabelling is the buffer's sample-time transform: the episode index, kept as the ring is
written, and the relabelling of a gathered batch.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Literal

import numpy as np
import torch

Strategy = Literal["future", "final", "episode"]
STRATEGIES: tuple[str, ...] = ("future", "final", "episode")
GOAL_KEYS = ("observation", "achieved_goal", "desired_goal")


@dataclass(frozen=True)
class Hindsight:
    """How a ReplayBuffer relabels: the env's reward (and termination) function, the goals
    per real transition and the strategy. The functions take arrays of goals, one row per
    transition, and `info`, a list of one empty dict per transition (rlstore keeps no
    infos)."""

    compute_reward: Callable[[np.ndarray, np.ndarray, Any], Any]
    compute_terminated: Callable[[np.ndarray, np.ndarray, Any], Any] | None = None
    goals: int = 4
    strategy: Strategy = "future"

    def __post_init__(self) -> None:
        if self.goals < 0:
            raise ValueError(f"goals must be at least 0, got {self.goals}")
        if self.strategy not in STRATEGIES:
            raise ValueError(f"strategy must be one of {', '.join(STRATEGIES)}")

    def relabelled(self, batch_size: int) -> int:
        """How many transitions of a batch are relabelled (the first ones)."""
        return batch_size * self.goals // (self.goals + 1)

    def rewards_and_terminations(
        self, next_achieved: np.ndarray, goals: np.ndarray, terminated: np.ndarray
    ) -> tuple[np.ndarray, np.ndarray]:
        """The env's rewards of reaching `next_achieved` when aiming at `goals`, and the
        terminations (`terminated`, the stored ones, without compute_terminated)."""
        n = len(goals)
        info = [{}] * n  # (one dict shared: the functions only read it)
        rewards = np.asarray(self.compute_reward(next_achieved, goals, info), dtype=np.float64)
        if rewards.shape != (n,):
            raise ValueError(
                f"compute_reward returned shape {rewards.shape} for {n} goals, not ({n},): "
                "it must take arrays of goals, one per row"
            )
        if self.compute_terminated is not None:
            done = self.compute_terminated(next_achieved, goals, info)
            terminated = np.broadcast_to(np.asarray(done, dtype=bool), (n,)).copy()
        return rewards, terminated


class EpisodeIndex:
    """For each (row, env) slot of a ReplayBuffer's ring, the write numbers of the first and
    of the last transition of its episode (-1 while the episode runs); the running
    episode's first write per env (-1: none)."""

    def __init__(self, rows: int, num_envs: int) -> None:
        self.rows, self.num_envs = rows, num_envs
        self.start = np.full((rows, num_envs), -1, dtype=np.int64)
        self.end = np.full((rows, num_envs), -1, dtype=np.int64)
        self.running = np.full(num_envs, -1, dtype=np.int64)

    @staticmethod
    def memory_bytes(slots: int, num_envs: int) -> int:
        return slots * 16 + num_envs * 8  # int64 first and last per slot, running per env

    def cut(self, write: int, broken: np.ndarray) -> None:
        """The streams of the `broken` envs break at row `write` (a break row): their
        running episodes were abandoned at their last step, write - 1."""
        for env in np.flatnonzero(broken & (self.running >= 0)):
            self._close(int(env), write - 1)

    def add(self, write: int, valid: np.ndarray, done: np.ndarray) -> None:
        """Row `write` holds a transition for the `valid` envs; `done` ones end there."""
        envs = np.flatnonzero(valid)
        row = write % self.rows
        self.running[envs] = np.where(self.running[envs] < 0, write, self.running[envs])
        self.start[row, envs] = self.running[envs]
        self.end[row, envs] = -1
        for env in np.flatnonzero(valid & done):
            self._close(int(env), write)

    def _close(self, env: int, last: int) -> None:
        """Write the end into the stored rows of env's running episode."""
        first = max(int(self.running[env]), last - self.rows + 2)  # (the rows still stored)
        self.end[np.arange(first, last + 1) % self.rows, env] = last
        self.running[env] = -1

    def goal_slots(
        self,
        flat: np.ndarray,
        added: int,
        valid: np.ndarray,
        strategy: str,
        generator: np.random.Generator,
    ) -> np.ndarray:
        """For transitions at flat slots `flat` of a buffer that has written `added` rows
        (`valid`: its flat valid flags), the flat slots of the next observations whose
        achieved goals relabel them."""
        R, N = self.rows, self.num_envs
        row, env = np.divmod(flat, N)
        write = added - 1 - (added - 1 - row) % R  # the transition's write number
        oldest = added - R + 1  # the oldest transition still stored
        start = np.maximum(self.start.reshape(-1)[flat], oldest)
        end = self.end.reshape(-1)[flat]
        end = np.where(end < 0, added - 1, end)  # running: up to the newest step
        if strategy == "final":
            step = end
        else:
            low = write if strategy == "future" else start
            step = generator.integers(low, end + 1)
            # A step the stream went on over (a bridge row, no transition): draw again, so
            # that the episode's transitions stay equally likely.
            redraw = ~valid[(step % R) * N + env]
            while redraw.any():
                step[redraw] = generator.integers(low[redraw], end[redraw] + 1)
                redraw = ~valid[(step % R) * N + env]
        return ((step + 1) % R) * N + env

    _NAMES = ("start", "end", "running")

    def state_dict(self) -> dict[str, torch.Tensor]:
        return {
            f"episode_{name}": torch.from_numpy(getattr(self, name).copy()) for name in self._NAMES
        }

    def load_state_dict(self, state: dict[str, Any]) -> None:
        for name in self._NAMES:
            getattr(self, name)[...] = state[f"episode_{name}"].numpy()


def check_relabelling(obs_shape: Any, n_step: int, prioritized: bool, frame_stack: int) -> None:
    """A ValueError unless relabelling can apply: goal Dict observations, one-step targets
    (an n-step sum would need every reward of the window recomputed), uniform sampling
    (priorities belong to the stored transitions, not the relabelled ones)."""
    shape = obs_shape
    if not (isinstance(shape, dict) and "achieved_goal" in shape and "desired_goal" in shape):
        raise ValueError(
            "hindsight relabelling needs Dict observations with 'achieved_goal' and "
            f"'desired_goal' parts, got {shape}"
        )
    if shape["achieved_goal"] != shape["desired_goal"]:
        raise ValueError(
            f"achieved_goal {shape['achieved_goal']} and desired_goal "
            f"{shape['desired_goal']} must have the same shape to relabel"
        )
    if n_step != 1 or prioritized or frame_stack:
        raise ValueError("hindsight relabelling takes n_step=1, uniform sampling, no stacks")


class Relabelling:
    """A ReplayBuffer's hindsight: its episodes (EpisodeIndex) as the ring is written, and the
    relabelling of sampled batches. `goals_of(tree)` picks the goal parts' dict out of an
    observation tree (the first of the pair when the buffer keeps action masks)."""

    def __init__(
        self, hindsight: Hindsight, rows: int, num_envs: int, goals_of: Callable[[Any], Any]
    ) -> None:
        self.hindsight, self.goals_of = hindsight, goals_of
        self.episodes = EpisodeIndex(rows, num_envs)

    def relabel(
        self,
        obs: Any,
        flat: np.ndarray,
        next_flat: np.ndarray,
        rewards: np.ndarray,
        terminated: np.ndarray,
        achieved: Callable[[np.ndarray], np.ndarray],
        added: int,
        valid: np.ndarray,
        generator: np.random.Generator,
    ) -> tuple[np.ndarray, np.ndarray]:
        """Give the batch's first transitions goals their episodes reached. `obs` holds the
        batch's obs and next_obs, stacked (as gathered); their desired goals are replaced in
        place. `achieved(slots)`: the stored achieved goals of flat slots. Returns the
        rewards and terminations, the relabelled ones recomputed."""
        n = self.hindsight.relabelled(len(flat))
        if n == 0:
            return rewards, terminated
        goal_flat = self.episodes.goal_slots(
            flat[:n], added, valid, self.hindsight.strategy, generator
        )
        both = achieved(np.concatenate((next_flat[:n], goal_flat)))
        next_achieved, goals = both[:n], both[n:]
        desired = self.goals_of(obs)["desired_goal"]  # (2, batch, *goal_shape)
        desired[:, :n] = goals if isinstance(desired, np.ndarray) else torch.from_numpy(goals)
        relabelled, ends = self.hindsight.rewards_and_terminations(
            next_achieved, goals, terminated[:n]
        )
        rewards, terminated = rewards.copy(), terminated.copy()
        rewards[:n], terminated[:n] = relabelled, ends
        return rewards, terminated

    def state_dict(self) -> dict[str, torch.Tensor]:
        return self.episodes.state_dict()

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.episodes.load_state_dict(state)
