"""The on-policy loop that PPO and A2C share: build the actor-critic and its rollout storage,
collect a rollout, compute its returns."""

from __future__ import annotations

import numpy as np
import torch
from gymnasium import spaces

from rlstore.algos import Algorithm
from rlstore.algos._shared import image_options
from rlstore.collect import RolloutCollector, env_actions
from rlstore.config import OnPolicyConfig
from rlstore.encoders import stored_dtype, stored_shape
from rlstore.envs import make_training_envs
from rlstore.errors import UsageError
from rlstore.masks import masks_of
from rlstore.networks import ActorCritic, actor_critic_for, policy_spec
from rlstore.normalize import ObsNormalizer, RewardScaler
from rlstore.run import Run, TrainingState
from rlstore.storage import RolloutStorage


def explained_variance(predicted: torch.Tensor, target: torch.Tensor) -> torch.Tensor:
    """1 - Var(target - predicted) / Var(target); NaN when the target is constant."""
    var_target = target.var()
    return torch.where(var_target == 0, torch.nan, 1 - (target - predicted).var() / var_target)


def obs_normalizer_for(cfg: OnPolicyConfig, obs_space: spaces.Space) -> ObsNormalizer | None:
    """The observation normalizer of --norm-obs (None without it), which takes float Box
    observations only: one-hots and images have their scale."""
    if not cfg.norm_obs:
        return None
    # (Dict and Tuple observations are refused too: normalizing their parts is not built)
    if not (isinstance(obs_space, spaces.Box) and obs_space.dtype.kind == "f"):
        raise UsageError(
            f"--norm-obs normalizes float vector observations; {cfg.env_id} has {obs_space}, "
            "which rlstore's encoder scales itself: drop --norm-obs"
        )
    return ObsNormalizer(obs_space.shape, cfg.clip_obs)


def build_actor_critic(
    cfg: OnPolicyConfig, algorithm: Algorithm, device: torch.device
) -> tuple[ActorCritic, RolloutStorage, TrainingState]:
    """Envs, actor-critic, rollout storage and (as configured) the observation normalizer
    and reward scaler of an on-policy algorithm, in their TrainingState (the optimizer
    joins it)."""
    envs = make_training_envs(cfg, algorithm)
    obs_space, action_space = envs.single_observation_space, envs.single_action_space
    agent = actor_critic_for(
        obs_space, action_space, cfg.use_fast_paths, cfg.hidden, image_options(cfg)
    ).to(device)
    if agent.continuous and not np.isfinite([action_space.low, action_space.high]).all():
        print(
            f"rlstore: {cfg.env_id} has unbounded actions ({action_space}): where a bound is "
            "infinite, the Gaussian policy's samples go to the env unclipped"
        )
    obs_norm = obs_normalizer_for(cfg, obs_space)
    reward_scale = (
        RewardScaler(cfg.num_envs, cfg.gamma, cfg.clip_reward) if cfg.norm_reward else None
    )
    masks = masks_of(envs)
    storage = RolloutStorage(
        cfg.num_steps,
        cfg.num_envs,
        stored_shape(obs_space),
        action_space.shape if agent.head is None else agent.head.stored_shape,
        obs_dtype=stored_dtype(obs_space),
        action_dtype=np.float32 if agent.continuous else np.int64,
        device=device,
        action_mask_shape=None if masks is None else (masks.width,),
    )

    def start(obs: np.ndarray) -> None:  # the first observations, and after fresh resets
        storage.reset(
            obs_norm(obs, update=True) if obs_norm else obs, None if masks is None else masks.masks
        )

    obs, _ = envs.reset(seed=cfg.seed)
    start(obs)
    spec = policy_spec(agent, obs_space, action_space, masks and masks.source)
    parts = {"storage": storage} | ({"reward_scaler": reward_scale} if reward_scale else {})
    state = TrainingState(envs, agent, spec, on_fresh_envs=start, obs_normalizer=obs_norm, **parts)
    return agent, storage, state


def collect_rollout(agent: ActorCritic, storage: RolloutStorage, state: TrainingState, run: Run):
    """Fill the storage with one rollout, acting with the current policy, through the
    collect pipeline (rlstore/collect.py: normalized observations and scaled or signed
    rewards stored, the env's own rewards counted, Atari's lost lives cutting the
    bootstrap: docs/reference/episode-boundaries.md)."""
    envs, space = state.envs, state.envs.single_action_space
    collector = RolloutCollector(
        envs, run, storage, state.obs_normalizer, state.parts.get("reward_scaler")
    )
    act_on_host = agent.act_on_host  # numpy, for MLPs in host memory (None: torch)

    def step() -> None:
        host_obs = storage.current_obs_on_host
        acted = (
            act_on_host(host_obs, collector.action_mask)
            if act_on_host and host_obs is not None
            else None
        )
        if acted is not None:
            action, log_prob, value = acted
            sent = action
        else:
            with torch.inference_mode():
                action, log_prob, value = agent.act(
                    storage.current_obs, storage.current_action_mask
                )
            sent = action.cpu().numpy()  # the env boundary: the one device -> host copy
        collector.step(env_actions(sent, space, agent.head), action, log_prob, value)

    collector.collect(step, act_on_host)


def log_update(run: Run, storage: RolloutStorage, losses: dict, lr: float) -> None:
    """Log an update's losses (less the loss itself), the explained variance of the
    rollout's values and the learning rate, when the run's logging is due."""
    if not run.log_due():
        return
    data = storage.flatten()
    losses = {k: v for k, v in losses.items() if k != "loss"}
    losses["losses/explained_variance"] = explained_variance(data["values"], data["returns"])
    losses["charts/learning_rate"] = lr
    run.log_scalars(losses)


def compute_returns(agent: ActorCritic, storage: RolloutStorage, cfg: OnPolicyConfig) -> None:
    """Advantages and returns of the rollout, bootstrapped from V(the last observation)."""
    host_obs, act_on_host = storage.current_obs_on_host, agent.act_on_host
    next_value = act_on_host.value(host_obs) if act_on_host and host_obs is not None else None
    if next_value is None:
        with torch.inference_mode():
            next_value = agent.value(storage.current_obs)
    storage.compute_returns(next_value, cfg.gamma, cfg.gae_lambda, cfg.use_gae)
