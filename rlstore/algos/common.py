"""Pieces shared by the on-policy algorithms: building, the collect loop, small math."""

from __future__ import annotations

import numpy as np
import torch
from gymnasium import spaces

from rlstore.config import CommonConfig, UsageError
from rlstore.envs import EpisodeStats, make_vec_env
from rlstore.networks import ActorCritic, actor_critic_for
from rlstore.run import Run
from rlstore.storage import RolloutStorage


def linear_schedule(start: float, end: float, duration: int, t: int) -> float:
    """`start` at t = 0, moving linearly to `end` at t = duration, then staying there."""
    if t >= duration:
        return end
    return start + max(t, 0) / duration * (end - start)


def explained_variance(predicted: torch.Tensor, target: torch.Tensor) -> torch.Tensor:
    """1 - Var(target - predicted) / Var(target); NaN when the target is constant."""
    var_target = target.var()
    return torch.where(var_target == 0, torch.nan, 1 - (target - predicted).var() / var_target)


class OnPolicySetup:
    """Envs, actor-critic, rollout storage and episode statistics for PPO and A2C."""

    def __init__(self, cfg: CommonConfig, device: torch.device) -> None:
        self.envs = make_vec_env(
            cfg.env_id, cfg.num_envs, cfg.seed, cfg.vectorization, cfg.max_episode_steps
        )
        obs_space, action_space = self.envs.single_observation_space, self.envs.single_action_space
        if not isinstance(obs_space, spaces.Box):
            raise UsageError(f"{cfg.env_id} has observation space {obs_space}; rlstore needs a Box")
        if not isinstance(action_space, (spaces.Discrete, spaces.Box)) or (
            isinstance(action_space, spaces.Box) and len(action_space.shape) != 1
        ):
            raise UsageError(
                f"{cfg.env_id} has action space {action_space}; "
                "PPO and A2C here support Discrete and 1-d Box actions"
            )
        self.agent: ActorCritic = actor_critic_for(obs_space, action_space).to(device)
        self.storage = RolloutStorage(
            cfg.num_steps,
            cfg.num_envs,
            obs_space.shape,
            action_space.shape,
            obs_dtype=obs_space.dtype,
            action_dtype=np.float32 if self.agent.continuous else np.int64,
            device=device,
        )
        self.stats = EpisodeStats(cfg.num_envs)
        if self.agent.continuous:
            self.action_low, self.action_high = action_space.low, action_space.high
        obs, _ = self.envs.reset(seed=cfg.seed)
        self.storage.reset(obs)

    def collect_rollout(self, run: Run) -> None:
        """Fill the storage with one rollout, acting with the current policy."""
        agent, storage, envs = self.agent, self.storage, self.envs
        for _ in range(storage.num_steps):
            with torch.inference_mode():
                action, log_prob, value = agent.act(storage.current_obs)
            env_action = action.cpu().numpy()
            if agent.continuous:  # store the raw sample, send the clipped one
                env_action = np.clip(env_action, self.action_low, self.action_high)
            next_obs, reward, terminated, truncated, _ = envs.step(env_action)
            storage.insert(next_obs, action, log_prob, value, reward, terminated, truncated)
            run.global_step += storage.num_envs
            returns, lengths = self.stats.update(reward, terminated, truncated)
            if len(returns):
                run.log_episodes(returns, lengths)

    def compute_returns(self, gamma: float, gae_lambda: float, use_gae: bool) -> None:
        with torch.inference_mode():
            next_value = self.agent.value(self.storage.current_obs)
        self.storage.compute_returns(next_value, gamma, gae_lambda, use_gae)
