"""The collect pipeline: the one place the training loops step their envs.

A vector step is: act (the algorithm's) -> envs.step -> what the storage learns from
(observations normalized with --norm-obs, rewards scaled with --norm-reward and signed
with --sign-rewards) and the episode boundaries it keeps (terminated, truncated, an Atari
life lost, the next observations' action masks) -> store -> count the env steps and the
episodes that ended (Run.record_step). `Collector` holds the steps every storage shares;
`RolloutCollector` stores into a RolloutStorage (PPO, A2C, recurrent PPO, PQN) and
`ReplayCollector` into a ReplayBuffer (the DQN family, SAC, TD3, DDPG, TQC, CrossQ).

Their fast forms (rlstore/lean.py: LeanRollout, LeanDQNStep) step a LeanSyncVectorEnv's
envs one by one and batch the stores, with this pipeline's own transforms
(`Collector.learnt_rewards`, its normalizer, `ActionMasks.read_envs`); each collector takes
its fast form where it applies, so an algorithm says how it acts and what it stores, not
how the envs are stepped.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import gymnasium as gym
import numpy as np

from rlstore.lean import LeanDQNStep, LeanRollout
from rlstore.masks import masks_of


@dataclass
class VectorStep:
    """What one vector step gave, as the pipeline hands it to a storage."""

    obs: Any  # the envs' own next observations
    stored_obs: Any  # as stored: normalized with --norm-obs
    reward: np.ndarray  # the envs' own rewards (the episode statistics count these)
    learnt_reward: np.ndarray  # scaled (--norm-reward), then signed (--sign-rewards)
    terminated: np.ndarray
    truncated: np.ndarray
    life_lost: np.ndarray | None  # Atari: a life ended without the game ending
    action_mask: np.ndarray | None  # the next observations' masks (None: the env has none)
    info: dict[str, Any]


class Collector:
    """Steps a run's vector env and applies, in this one place, what every storage learns
    from: the observation normalizer and reward scaler (`obs_norm`, `reward_scale`, as
    configured), rewards learnt by their sign (the run's --sign-rewards), Atari's lost
    lives and the env's action masks."""

    def __init__(
        self, envs: gym.vector.VectorEnv, run: Any, obs_norm: Any = None, reward_scale: Any = None
    ) -> None:
        self.envs, self.run = envs, run
        self.obs_norm, self.reward_scale = obs_norm, reward_scale
        self.sign_rewards = bool(run.cfg.sign_rewards)
        self.lives = envs if hasattr(envs, "life_lost") else None  # Atari
        self.masks = masks_of(envs)  # (None: the env gives none)

    @property
    def action_mask(self) -> np.ndarray | None:
        """The masks of the envs' current observations (None: the env gives none)."""
        return None if self.masks is None else self.masks.masks

    @property
    def changes_rewards(self) -> bool:
        """Whether the rewards learnt differ from the env's (scaled or signed)."""
        return self.reward_scale is not None or self.sign_rewards

    def learnt_rewards(
        self, reward: np.ndarray, terminated: np.ndarray, truncated: np.ndarray
    ) -> np.ndarray:
        """The rewards a storage learns from: scaled (the scaler keeps a running return,
        so it sees each step once), then signed."""
        learnt = self.reward_scale(reward, terminated, truncated) if self.reward_scale else reward
        return np.sign(learnt) if self.sign_rewards else learnt

    def env_step(self, env_action: Any) -> VectorStep:
        """Step every env with `env_action`: the step with its transforms applied (the
        normalizer's statistics and the scaler's running return updated)."""
        obs, reward, terminated, truncated, info = self.envs.step(env_action)
        return VectorStep(
            obs,
            self.obs_norm(obs, update=True) if self.obs_norm else obs,
            reward,
            self.learnt_rewards(reward, terminated, truncated),
            terminated,
            truncated,
            None if self.lives is None else self.lives.life_lost,
            self.action_mask,
            info,
        )

    def record(self, step: VectorStep) -> None:
        """Count the step's env steps and the episodes it ended, by the envs' own rewards."""
        self.run.record_step(step.reward, step.terminated, step.truncated, step.info)


class RolloutCollector(Collector):
    """The pipeline into a RolloutStorage: each step is stored at the storage's current
    observations, which it advances."""

    def __init__(
        self,
        envs: gym.vector.VectorEnv,
        run: Any,
        storage: Any,
        obs_norm: Any = None,
        reward_scale: Any = None,
    ) -> None:
        super().__init__(envs, run, obs_norm, reward_scale)
        self.storage = storage

    def step(
        self, env_action: Any, action: Any, log_prob: Any, value: Any, **stored: Any
    ) -> VectorStep:
        """Step the envs with `env_action` and store the step with what the policy gave at
        the current observations (`action` as sampled, its `log_prob`, the `value`, and
        `stored`: a recurrent storage's recurrent_state)."""
        step = self.env_step(env_action)
        self.storage.insert(
            step.stored_obs,
            action,
            log_prob,
            value,
            step.learnt_reward,
            step.terminated,
            step.truncated,
            step.life_lost,
            action_mask=step.action_mask,
            **stored,
        )
        self.record(step)
        return step

    def collect(self, step: Callable[[], Any], act_on_host: Any = None) -> None:
        """Fill the rest of the rollout, `step()` at a time (the algorithm's act, then
        self.step); with `act_on_host`, the policy acting in numpy, the same steps through
        the fast form where it applies (rlstore/lean.py's LeanRollout)."""
        storage = self.storage
        if act_on_host is not None and LeanRollout.supports(self.envs, storage, act_on_host):
            LeanRollout(self, act_on_host).collect(general_step=step)
            return
        while storage.step < storage.num_steps:
            step()


class ReplayCollector(Collector):
    """The pipeline into a ReplayBuffer: each transition is stored with the observations
    it was taken at (and their masks, where the env gives them)."""

    def __init__(self, envs: gym.vector.VectorEnv, run: Any, buffer: Any) -> None:
        super().__init__(envs, run)
        self.buffer = buffer

    def step(self, obs: Any, action: Any) -> Any:
        """Step the envs with `action` taken at `obs` and store the transitions (the
        buffer keeps the true final observation a truncation bootstraps from, and skips
        the autoreset pseudo-steps); the next observations."""
        mask = self.action_mask
        step = self.env_step(action)
        both = {} if mask is None else {"action_mask": mask, "next_action_mask": step.action_mask}
        self.buffer.add(
            obs,
            action,
            step.learnt_reward,
            step.obs,
            step.terminated,
            step.truncated,
            step.life_lost,
            **both,
        )
        self.record(step)
        return step.obs

    def one_env_step(self, greedy_actions: Any, num_actions: int) -> LeanDQNStep | None:
        """The fast form of an epsilon-greedy step for one env (rlstore/lean.py's
        LeanDQNStep), where it applies."""
        if not LeanDQNStep.supports(self.envs, self.buffer):
            return None
        return LeanDQNStep(self, greedy_actions, num_actions)


def env_actions(action: np.ndarray, space: gym.Space, head: Any = None) -> np.ndarray:
    """A policy's sampled actions as the env takes them: a Box's clipped to its bounds (the
    storage keeps the raw sample, whose log-probability was taken), and a head's
    (MultiDiscrete's start, MultiBinary's shape) as its space has them."""
    if isinstance(space, gym.spaces.Box):
        return np.clip(action, space.low, space.high)
    if head is not None:
        return head.env_action(action)
    return action
