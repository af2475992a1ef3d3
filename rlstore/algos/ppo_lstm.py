"""Recurrent PPO: PPO with an LSTM actor-critic, for partially observable tasks.

PPO's loss (rlstore/algos/ppo.py) on sequences: the RecurrentRolloutStorage keeps the state each
step acted from and hands out minibatches of whole sequences (`sequences`), which the
policy replays from their first state, zeroing it where an episode starts. Reads top to
bottom: the config, the recurrent state as a part of the run, collect, update, train(),
the registry entry.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import torch
from gymnasium import spaces
from torch import nn

from rlstore.algos import Algorithm
from rlstore.algos._on_policy import log_update, obs_normalizer_for
from rlstore.algos._shared import image_options, linear_schedule, optimizer_params
from rlstore.algos.ppo import PPOConfig, iteration_config, ppo_loss
from rlstore.callbacks import Callback
from rlstore.collect import RolloutCollector, env_actions
from rlstore.config import Count
from rlstore.encoders import stored_dtype, stored_shape
from rlstore.envs import make_training_envs
from rlstore.errors import UsageError
from rlstore.machine import optimizer_step
from rlstore.masks import masks_of
from rlstore.networks import policy_spec
from rlstore.normalize import RewardScaler
from rlstore.parts import map_parts
from rlstore.recurrent_networks import (
    CnnRecurrentActorCritic,
    RecurrentActorCritic,
    RecurrentActorCriticBase,
    recurrent_actor_critic_for,
)
from rlstore.run import Run, TrainingState, TrainResult
from rlstore.storage import RecurrentRolloutStorage, RolloutBatch
from rlstore.storage.arrays import to_device


@dataclass
class PPOLSTMConfig(PPOConfig):
    """PPO with an LSTM actor-critic (sb3-contrib's RecurrentPPO layout); the other
    defaults are PPO's."""

    lstm_hidden_size: Count = 256
    """Units of each LSTM (the actor's and the critic's; sb3-contrib's default)."""
    sequence_length: Count | None = None
    """Steps per training sequence; it must divide num_steps (default: the whole rollout
    of each env, CleanRL's way). Shorter sequences give more, smaller minibatches, each
    starting from the state stored at its first step."""

    def check(self) -> None:
        super(PPOConfig, self).check()  # PPO's minibatches split steps; these split sequences
        length = self.sequence_length or self.num_steps
        if self.num_steps % length:
            raise UsageError(
                f"--sequence-length {length} does not divide --num-steps {self.num_steps}"
            )
        sequences = self.num_envs * (self.num_steps // length)
        if self.num_minibatches > sequences:
            raise UsageError(
                f"--num-minibatches {self.num_minibatches} is more than the {sequences} "
                "sequences of a rollout (num_envs x num_steps / sequence_length); lower it"
            )


class RecurrentState:
    """The LSTM state the next action is taken from, one row per env: a part of the run's
    TrainingState, so that checkpoints keep it and a resumed run acts as the
    uninterrupted one."""

    def __init__(self, initial: torch.Tensor) -> None:
        self.state = initial

    def state_dict(self) -> dict[str, Any]:
        return {"state": self.state.clone()}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.state.copy_(state["state"])


def zero_at_starts(state: torch.Tensor, starts: np.ndarray) -> torch.Tensor:
    """`state` with the rows of envs whose observation begins an episode zeroed."""
    keep = torch.from_numpy(~starts).to(state.device, state.dtype)
    return state * keep[:, None, None]


def collect(
    agent: RecurrentActorCriticBase,
    storage: RecurrentRolloutStorage,
    state: TrainingState,
    run: Run,
) -> None:
    """Fill the storage with one rollout through the collect pipeline (rlstore/collect.py),
    carrying the LSTM state from step to step. Atari: a lost life cuts the bootstrap; the
    state carries on through it, as the game does."""
    envs, memory = state.envs, state.parts["recurrent_state"]
    space = envs.single_action_space
    collector = RolloutCollector(
        envs, run, storage, state.obs_normalizer, state.parts.get("reward_scaler")
    )

    def step() -> None:
        acting = zero_at_starts(memory.state, storage.current_episode_starts)
        with torch.inference_mode():
            action, log_prob, value, memory.state = agent.act(
                storage.current_obs, acting, storage.current_action_mask
            )
        sent = env_actions(action.cpu().numpy(), space, agent.head)  # the env boundary
        collector.step(sent, action, log_prob, value, recurrent_state=acting)

    collector.collect(step)


def compute_returns(
    agent: RecurrentActorCriticBase,
    storage: RecurrentRolloutStorage,
    memory: RecurrentState,
    cfg: PPOConfig,
) -> None:
    """Advantages and returns, bootstrapped from V(the last observation) at its state."""
    with torch.inference_mode():
        acting = zero_at_starts(memory.state, storage.current_episode_starts)
        next_value = agent.value(storage.current_obs, acting)
    storage.compute_returns(next_value, cfg.gamma, cfg.gae_lambda, cfg.use_gae)


def valid_batch(batch: Any, log_prob: torch.Tensor, entropy: torch.Tensor, value: torch.Tensor):
    """The real transitions of a sequence minibatch (pseudo-steps left out), flat, as PPO's
    loss takes them: (RolloutBatch, log_prob, entropy, value). They are picked by index,
    found from the batch's host flags: a mask would be read back from the device."""
    index = to_device(batch.valid.reshape(-1).nonzero().squeeze(-1), log_prob.device)

    def pick(x: torch.Tensor) -> torch.Tensor:  # (L, B, ...) -> (valid steps, ...)
        return x.reshape(-1, *x.shape[2:])[index]

    fields = (batch.actions, batch.log_probs, batch.values, batch.advantages, batch.returns)
    flat = RolloutBatch(map_parts(pick, batch.obs), *(pick(x) for x in fields))
    return flat, pick(log_prob), pick(entropy), pick(value)


def update(
    agent: RecurrentActorCriticBase,
    optimizer: torch.optim.Optimizer,
    storage: RecurrentRolloutStorage,
    cfg: PPOLSTMConfig,
) -> dict[str, torch.Tensor]:
    """Epochs of minibatch gradient steps on sequences; returns the last minibatch's losses."""
    last = cfg.num_minibatches - 1
    for _epoch in range(cfg.update_epochs):
        for i, batch in enumerate(storage.sequences(cfg.num_minibatches, cfg.sequence_length)):
            out = agent.evaluate_sequences(
                batch.obs,
                batch.actions,
                batch.initial_state,
                batch.episode_starts,
                batch.action_masks,
            )
            flat, log_prob, entropy, value = valid_batch(batch, *out)
            losses = ppo_loss(log_prob, value, entropy, flat, cfg, diagnostics=i == last)
            optimizer.zero_grad(set_to_none=True)
            losses["loss"].backward()
            nn.utils.clip_grad_norm_(optimizer_params(optimizer), cfg.max_grad_norm, foreach=True)
            optimizer_step(optimizer)
        if cfg.target_kl is not None and losses["losses/approx_kl"] > cfg.target_kl:
            break
    return losses


def build(cfg: PPOLSTMConfig, device: torch.device):
    """Envs, the LSTM actor-critic, its rollout storage and the run's TrainingState."""
    envs = make_training_envs(cfg, ALGORITHM)
    obs_space, action_space = envs.single_observation_space, envs.single_action_space
    agent = recurrent_actor_critic_for(
        obs_space, action_space, cfg.lstm_hidden_size, cfg.hidden, image_options(cfg)
    ).to(device)
    obs_norm = obs_normalizer_for(cfg, obs_space)
    masks = masks_of(envs)
    reward_scale = (
        RewardScaler(cfg.num_envs, cfg.gamma, cfg.clip_reward) if cfg.norm_reward else None
    )
    storage = RecurrentRolloutStorage(
        cfg.num_steps,
        cfg.num_envs,
        stored_shape(obs_space),
        action_space.shape if agent.head is None else agent.head.stored_shape,
        obs_dtype=stored_dtype(obs_space),
        action_dtype=np.float32 if agent.continuous else np.int64,
        device=device,
        recurrent_state_shape=agent.state_shape,
        action_mask_shape=None if masks is None else (masks.width,),
    )

    def start(obs: np.ndarray) -> None:  # the first observations, and after fresh resets
        storage.reset(
            obs_norm(obs, update=True) if obs_norm else obs, None if masks is None else masks.masks
        )

    obs, _ = envs.reset(seed=cfg.seed)
    start(obs)
    memory = RecurrentState(agent.initial_state(cfg.num_envs, device))
    parts = {"storage": storage, "recurrent_state": memory}
    parts |= {"reward_scaler": reward_scale} if reward_scale else {}
    spec = policy_spec(agent, obs_space, action_space, masks and masks.source)
    state = TrainingState(envs, agent, spec, on_fresh_envs=start, obs_normalizer=obs_norm, **parts)
    return agent, storage, memory, state


def train(
    cfg: PPOLSTMConfig,
    preset: Path | None = None,
    resume: Path | None = None,
    callbacks: Sequence[Callback] = (),
) -> TrainResult:
    """Train recurrent PPO as configured, or continue the run in `resume`; `callbacks` see
    the run as it goes (rlstore.run.Callback)."""
    run = Run(cfg, ALGORITHM.name, preset, resume, callbacks)
    agent, storage, memory, state = build(cfg, run.device)
    # fused: one kernel for all parameters instead of a Python loop over them
    optimizer = torch.optim.Adam(
        agent.parameters(), lr=cfg.learning_rate, eps=cfg.adam_eps, fused=True
    )
    state.parts["optimizer"] = optimizer

    with run.start(state):
        for iteration in run.iterations():
            lr = cfg.learning_rate
            if cfg.anneal_lr:
                lr = linear_schedule(cfg.learning_rate, 0.0, cfg.num_iterations, iteration)
                optimizer.param_groups[0]["lr"] = lr
            collect(agent, storage, state, run)
            compute_returns(agent, storage, memory, cfg)
            losses = update(agent, optimizer, storage, iteration_config(cfg, iteration))
            log_update(run, storage, losses, lr)
            storage.after_update()
        return run.finish()


ALGORITHM = Algorithm(
    name="ppo_lstm",
    summary="Recurrent PPO: an LSTM actor-critic trained on whole sequences",
    config=PPOLSTMConfig,
    train=train,
    action_spaces=(spaces.Discrete, spaces.Box, spaces.MultiDiscrete, spaces.MultiBinary),
    networks=(RecurrentActorCritic, CnnRecurrentActorCritic),
    defaults="rlstore's PPO defaults, sb3-contrib RecurrentPPO's LSTM layout",
    action_masks=True,
)
