"""Pieces shared by the on-policy algorithms: building, the collect loop, small math."""

from __future__ import annotations

import sys

import numpy as np
import torch
from gymnasium import spaces

from rlstore.checkpoint import env_state, load_env_state
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
        if not isinstance(action_space, (spaces.Discrete, spaces.Box)) or (
            isinstance(action_space, spaces.Box) and len(action_space.shape) != 1
        ):
            self.envs.close()
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

    def policy_info(self) -> dict:
        """What the final model file needs to rebuild the policy (see rlstore.evaluate)."""
        space = self.envs.single_action_space
        info = {
            "network": "actor_critic",
            "obs_shape": list(self.envs.single_observation_space.shape),
            "action_dim": int(space.n) if isinstance(space, spaces.Discrete) else space.shape[0],
            "continuous": self.agent.continuous,
        }
        if self.agent.continuous:
            info.update(action_low=space.low.tolist(), action_high=space.high.tolist())
        return info

    def snapshot(self, optimizer: torch.optim.Optimizer) -> dict:
        """Everything a checkpoint needs from the algorithm's side."""
        return {
            "model": self.agent.state_dict(),
            "optimizer": optimizer.state_dict(),
            **self.state_dict(),
        }

    def restore(self, state: dict, optimizer: torch.optim.Optimizer, seed: int) -> None:
        """The inverse of snapshot()."""
        self.agent.load_state_dict(state["model"])
        optimizer.load_state_dict(state["optimizer"])
        self.load_state_dict(state, seed)

    def state_dict(self) -> dict:
        """Envs, storage (the rollout boundary: last obs, episodes in progress) and stats."""
        return {
            "envs": env_state(self.envs),
            "storage": self.storage.state_dict(),
            "stats": {k: torch.from_numpy(v.copy()) for k, v in self.stats.state_dict().items()},
        }

    def load_state_dict(self, state: dict, seed: int) -> None:
        """Restore; envs that cannot be saved restart from a fresh reset (said on one line)."""
        if state["envs"] is None:
            print(
                f"rlstore: {self.envs.spec.id if self.envs.spec else 'this env'} cannot be "
                "saved; resuming with freshly reset envs",
                file=sys.stderr,
            )
            obs, _ = self.envs.reset(seed=seed)
            self.storage.reset(obs)
            return
        load_env_state(self.envs, state["envs"])
        self.storage.load_state_dict(state["storage"])
        self.stats.load_state_dict({k: v.numpy() for k, v in state["stats"].items()})

    def compute_returns(self, gamma: float, gae_lambda: float, use_gae: bool) -> None:
        with torch.inference_mode():
            next_value = self.agent.value(self.storage.current_obs)
        self.storage.compute_returns(next_value, gamma, gae_lambda, use_gae)
