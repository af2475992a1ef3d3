"""DQN (Mnih et al. 2015) with the usual options: Double DQN, dueling head, n-step returns,
prioritized replay, hard or soft target updates.

Reads top to bottom: the config, the TD loss as a pure function, then train(): build, and
the loop of act (epsilon-greedy) -> store -> every train_frequency steps a gradient step on
a replay batch -> every target_network_frequency steps a target update -> log; last, its
registry entry (ALGORITHM).

Its variants (c51.py, qrdqn.py, rainbow.py) run this loop with their own network and loss
(a QVariant), as ddpg.py runs td3.py's.
"""

from __future__ import annotations

import copy
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Annotated, Any, Literal

import gymnasium as gym
import numpy as np
import torch
import tyro
from torch import nn
from torch.nn import functional as F

from rlstore.action_heads import masked_q
from rlstore.algos import Algorithm
from rlstore.algos._shared import (
    ReplayConfig,
    check_replay_fits,
    crossings,
    image_options,
    linear_schedule,
    make_hindsight,
    optimizer_params,
    update_target,
)
from rlstore.callbacks import Callback
from rlstore.collect import ReplayCollector
from rlstore.config import Bound, Count, Fraction, NonNegativeInt, Positive, check_widths
from rlstore.encoders import encoder_for, stored_dtype, stored_shape
from rlstore.envs import is_frame_stack, make_training_envs
from rlstore.errors import UsageError
from rlstore.host_updates import HostDQNStep, host_td_loss
from rlstore.machine import optimizer_step, resolve_device
from rlstore.masks import masks_of
from rlstore.networks import CnnQNetwork, QNetwork, policy_spec
from rlstore.parts import first_part
from rlstore.run import Run, TrainingState, TrainResult
from rlstore.storage.replay import ReplayBatch, ReplayBuffer


@dataclass
class QLearningConfig(ReplayConfig):
    """What DQN and its variants share: DQN's options less its choice of TD loss."""

    num_envs: Count = 1
    """Number of parallel environments (step counters count env steps, summed over envs)."""
    learning_rate: Positive = 2.5e-4
    """Adam learning rate."""
    buffer_size: Count = 10_000
    """Replay buffer capacity in transitions."""
    buffer_device: str = "auto"
    """Where the replay buffer lives: auto (the training device), cpu or cuda."""
    gamma: Fraction = 0.99
    """Discount factor."""
    tau: Annotated[float, Bound(0, 1, low_open=True)] = 1.0
    """Target network update rate: 1.0 is a hard copy, less is a soft (Polyak) update."""
    target_network_frequency: Count = 500
    """Env steps between target network updates."""
    batch_size: Count = 128
    """Transitions per gradient step."""
    start_e: Fraction = 1.0
    """Exploration epsilon at the start."""
    end_e: Fraction = 0.05
    """Exploration epsilon at the end of the decay."""
    exploration_fraction: Fraction = 0.5
    """Fraction of total_timesteps over which epsilon decays linearly from start_e to end_e."""
    learning_starts: NonNegativeInt = 10_000
    """Env steps of pure collection before the first gradient step."""
    train_frequency: Count = 10
    """Env steps between training phases."""
    gradient_steps: Count = 1
    """Gradient steps per training phase."""
    max_grad_norm: Positive | None = None
    """Clip the gradient norm to this value (no clipping when unset)."""
    double_dqn: bool = False
    """Double DQN: the online network picks the next action, the target network values it."""
    dueling: bool = False
    """Dueling head: Q = V + A - mean(A)."""
    q_hidden: Annotated[tuple[int, ...], tyro.conf.arg(aliases=("--hidden",))] = (120, 84)
    """Widths of the Q-network's hidden ReLU layers (alias: --hidden)."""
    n_step: Count = 1
    """n-step returns (1 is the classic one-step target)."""
    prioritized: bool = False
    """Prioritized experience replay (proportional)."""
    per_alpha: Fraction = 0.6
    """PER priority exponent alpha in [0, 1] (0 is uniform)."""
    per_beta: Fraction = 0.4
    """PER importance-sampling exponent at the start; annealed linearly to 1 over training."""
    per_eps: Positive = 1e-6
    """Added to |TD error| so that no priority is zero."""

    def check(self) -> None:
        super().check()
        if self.buffer_size < self.num_envs:
            raise UsageError(
                f"--buffer-size {self.buffer_size} must be at least --num-envs {self.num_envs}"
            )
        if self.batch_size > self.buffer_size:
            raise UsageError(
                f"--batch-size {self.batch_size} must lie in [1, --buffer-size "
                f"{self.buffer_size}]; lower the batch size or enlarge the buffer"
            )
        check_widths("--q-hidden", self.q_hidden)
        if self.her and (self.n_step > 1 or self.prioritized):
            raise UsageError(
                "--her takes one-step targets and uniform replay (a relabelled n-step sum "
                "would need every reward of its window recomputed, and priorities belong to "
                "the stored transitions); drop --n-step or --prioritized"
            )
        if self.learning_starts > self.total_timesteps:
            raise UsageError(
                f"--learning-starts {self.learning_starts} is larger than --total-timesteps "
                f"{self.total_timesteps}: training would never start; lower it"
            )

    def optimizer_eps(self) -> float:
        """Adam's epsilon (torch's default for DQN, as CleanRL's dqn.py)."""
        return 1e-8


@dataclass
class DQNConfig(QLearningConfig):
    """Deep Q-Network (Mnih et al. 2015) with optional Double, dueling, n-step and PER."""

    loss: Literal["mse", "huber"] = "mse"
    """TD loss: mean squared error or Huber (smooth L1)."""


Loss = Callable[..., tuple[torch.Tensor, torch.Tensor, torch.Tensor]]


@dataclass(frozen=True)
class QVariant:
    """What a variant of DQN changes in its loop: the Q-network it builds,
    `network(cfg, obs_space, num_actions)`, and the loss of a replay batch,
    `loss(q_network, target_network, batch, cfg) -> (weighted loss, per-sample priority
    error, Q(s, a))`. A network with `reset_noise` (noisy layers) draws new noise in both
    networks before each gradient step."""

    network: Callable[[QLearningConfig, gym.Space, int], nn.Module]
    loss: Loss
    host_loss: Callable[[Any], Callable | None] | None = None
    """`host_loss(cfg)`: the same loss on the network's outputs in numpy, the form
    HostDQNStep takes (rlstore/host_updates.py's host_td_loss is DQN's), or None where the
    torch loss is the faster for that config."""


def td_loss(
    q_network: nn.Module, target_network: nn.Module, batch: ReplayBatch, cfg: DQNConfig
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """(weighted loss, TD errors, Q(s, a)) for a replay batch.

    target = rewards + discounts * (1 - terminated) * Q_target(next_obs, a'), where a' is the
    target network's argmax, or the online network's with Double DQN. With n-step replay the
    batch's rewards and discounts already span the window. With action masks, a' is the
    argmax over the actions the NEXT state allows (a next state that allows none, which
    only a done one may, bootstraps from 0).
    """
    allowed = batch.next_action_masks
    with torch.no_grad():
        next_q = target_network(batch.next_obs)
        if cfg.double_dqn:
            online = masked_q(q_network(batch.next_obs), allowed)
            next_value = next_q.gather(-1, online.argmax(-1, keepdim=True)).squeeze(-1)
        else:
            next_value = masked_q(next_q, allowed).amax(-1)
        if allowed is not None:
            next_value = next_value.masked_fill(~allowed.any(-1), 0.0)
        target = batch.rewards + batch.discounts * next_value.masked_fill(batch.terminated, 0.0)
    q_value = q_network(batch.obs).gather(-1, batch.actions.long().unsqueeze(-1)).squeeze(-1)
    if cfg.loss == "huber":
        elementwise = F.smooth_l1_loss(q_value, target, reduction="none")
    else:
        elementwise = F.mse_loss(q_value, target, reduction="none")
    # Uniform replay has unit weights: skipping the product saves a node in the backward pass.
    loss = (batch.weights * elementwise).mean() if cfg.prioritized else elementwise.mean()
    return loss, (q_value - target).detach(), q_value.detach()


def epsilon_greedy(
    greedy_actions: Callable[..., np.ndarray],
    obs: np.ndarray,
    epsilon: float,
    num_actions: int,
    masks: np.ndarray | None = None,
) -> np.ndarray:
    """One action per env: uniform with probability epsilon, else argmax Q; with action
    `masks` (num_envs, num_actions), both among the allowed actions only.

    The coin flips live on the host (numpy's seeded global RNG, checkpointed), and the
    network runs only when some env acts greedily."""
    num_envs = len(first_part(obs))
    coins = np.random.random((2, num_envs))  # one RNG call: explore?, which action
    if masks is not None:
        allowed = masks.sum(1)  # the k-th allowed action, k uniform in [0, allowed)
        pick = (masks.cumsum(1) > (coins[1] * allowed).astype(np.int64)[:, None]).argmax(1)
        greedy = greedy_actions(obs, masks) if (coins[0] >= epsilon).any() else pick
        return np.where(coins[0] < epsilon, pick, greedy)
    if num_envs == 1:  # one env (the default): Python floats cost less than array ops
        explore_one, which = coins.ravel().tolist()
        if explore_one < epsilon:
            return np.array([int(which * num_actions)])
        return greedy_actions(obs)
    explore = coins[0] < epsilon
    if explore.all():
        return (coins[1] * num_actions).astype(np.int64)
    action = greedy_actions(obs)
    if explore.any():
        action = np.where(explore, (coins[1] * num_actions).astype(np.int64), action)
    return action


def gradient_step(
    q_network: nn.Module,
    target_network: nn.Module,
    optimizer: torch.optim.Optimizer,
    buffer: ReplayBuffer,
    beta: float,
    cfg: QLearningConfig,
    fast_step: HostDQNStep | None = None,
    loss_of: Loss = td_loss,
) -> tuple[torch.Tensor, torch.Tensor]:
    """One gradient step on a replay batch (priorities updated with PER); (loss, Q(s, a)).
    `fast_step`, if given, takes the same step in numpy (rlstore/host_updates.py) on the same
    batch as numpy arrays; `loss_of` is a variant's loss (DQN's td_loss by default)."""
    if fast_step is not None:
        batch = buffer.sample_host(cfg.batch_size, beta=beta)
        loss, td_error, q_value = fast_step(batch, cfg)
    else:
        if hasattr(q_network, "reset_noise"):  # noisy layers: fresh noise for each step
            q_network.reset_noise()
            target_network.reset_noise()
        batch = buffer.sample(cfg.batch_size, beta=beta)
        loss, td_error, q_value = loss_of(q_network, target_network, batch, cfg)
        optimizer.zero_grad(set_to_none=True)
        loss.backward()
        if cfg.max_grad_norm is not None:
            nn.utils.clip_grad_norm_(optimizer_params(optimizer), cfg.max_grad_norm, foreach=True)
        optimizer_step(optimizer)
    if cfg.prioritized:
        buffer.update_priorities(batch.indices, td_error)
    return loss, q_value


def check_buffer_fits(
    cfg: QLearningConfig, obs_space: gym.Space, device: torch.device, frames: bool
) -> None:
    """Refuse a replay buffer larger than the memory left, before it is allocated."""
    check_replay_fits(
        device,
        cfg.buffer_size,
        cfg.num_envs,
        stored_shape(obs_space),
        stored_dtype(obs_space),
        prioritized=cfg.prioritized,
        frame_stack=obs_space.shape[0] if frames else 0,
        hindsight=cfg.her,
    )


def train(
    cfg: QLearningConfig,
    preset: Path | None = None,
    resume: Path | None = None,
    callbacks: Sequence[Callback] = (),
    algorithm: Algorithm | None = None,
    variant: QVariant | None = None,
) -> TrainResult:
    """Train DQN as configured, or continue the run in `resume` from its newest checkpoint;
    `callbacks` see the run after every vector step (rlstore.run.Callback). `algorithm`
    and `variant`: the variant whose run this is, its network and loss (DQN's by default).

    Returns the run's result (run dir, episode returns, model).
    """
    # -- build ---------------------------------------------------------------------------
    algorithm = algorithm or ALGORITHM
    run = Run(cfg, algorithm.name, preset, resume, callbacks)
    device = run.device
    envs = make_training_envs(cfg, algorithm)
    obs_space, action_space = envs.single_observation_space, envs.single_action_space
    buffer_device = device if cfg.buffer_device == "auto" else resolve_device(cfg.buffer_device)
    num_actions = int(action_space.n)
    masks = masks_of(envs)  # the env's action masks (None: it gives none)
    frames = is_frame_stack(obs_space)  # Atari: the Nature CNN, each frame stored once
    if variant is not None:
        q_network = variant.network(cfg, obs_space, num_actions).to(device)
    elif frames:
        q_network = CnnQNetwork(obs_space.shape, num_actions, cfg.dueling).to(device)
    else:
        encoder = encoder_for(obs_space, image_options(cfg))
        q_network = QNetwork(
            0,
            num_actions,
            cfg.q_hidden,
            dueling=cfg.dueling,
            fast=cfg.use_fast_paths,
            encoder=encoder,
        ).to(device)
    greedy_actions = q_network.greedy_action
    if cfg.use_fast_paths and hasattr(q_network, "greedy_actor"):
        # the same argmax in numpy (rlstore/host_networks.py), where the network has it
        greedy_actions = q_network.greedy_actor() or greedy_actions
    target_network = copy.deepcopy(q_network)
    optimizer = torch.optim.Adam(
        q_network.parameters(), lr=cfg.learning_rate, eps=cfg.optimizer_eps(), fused=True
    )
    check_buffer_fits(cfg, obs_space, buffer_device, frames)
    hindsight = make_hindsight(cfg)
    buffer = ReplayBuffer(
        cfg.buffer_size,
        cfg.num_envs,
        stored_shape(obs_space),
        obs_dtype=stored_dtype(obs_space),
        device=buffer_device,
        sample_device=device,
        n_step=cfg.n_step,
        gamma=cfg.gamma,
        prioritized=cfg.prioritized,
        alpha=cfg.per_alpha,
        priority_eps=cfg.per_eps,
        seed=cfg.seed,
        frame_stack=obs_space.shape[0] if frames else 0,
        action_mask_shape=None if masks is None else (num_actions,),
        hindsight=hindsight,
    )
    # The same gradient step in numpy, for MLP Q-networks and replay in host memory
    # (rlstore/host_updates.py)
    fast = cfg.use_fast_paths and buffer.device.type == "cpu"
    host_loss = host_td_loss if variant is None else variant.host_loss and variant.host_loss(cfg)
    fast = fast and host_loss is not None and HostDQNStep.supports(q_network, optimizer)
    fast_step = HostDQNStep(q_network, target_network, optimizer, host_loss) if fast else None
    loss_of = td_loss if variant is None else variant.loss
    obs, _ = envs.reset(seed=cfg.seed)
    spec = policy_spec(q_network, obs_space, action_space, masks and masks.source)
    state = TrainingState(
        envs, q_network, spec, obs, target_model=target_network, optimizer=optimizer, buffer=buffer
    )
    explore_steps = int(cfg.exploration_fraction * cfg.total_timesteps)
    last_update: tuple[torch.Tensor, torch.Tensor] | None = None  # (loss, Q(s, a)), for logging

    collector = ReplayCollector(envs, run, buffer)

    def act_and_store(epsilon: float) -> np.ndarray:
        """Act epsilon-greedily in every env, step them and store the transitions through
        the collect pipeline; the next observations."""
        mask = collector.action_mask
        action = epsilon_greedy(greedy_actions, state.obs, epsilon, num_actions, mask)
        return collector.step(state.obs, action)

    # The same step with one env, with fewer calls (rlstore/lean.py)
    one_env_step = (
        collector.one_env_step(greedy_actions, num_actions) if cfg.use_fast_paths else None
    )
    with run.start(state):
        for _ in run.iterations():
            # -- act and store: state.obs is where the envs are -------------------------
            epsilon = linear_schedule(cfg.start_e, cfg.end_e, explore_steps, run.global_step)
            before = run.global_step
            if one_env_step is not None:
                state.obs = one_env_step(state.obs, epsilon, act_and_store)
            else:
                state.obs = act_and_store(epsilon)

            # -- train -----------------------------------------------------------------
            if run.global_step > cfg.learning_starts:
                beta = linear_schedule(cfg.per_beta, 1.0, cfg.total_timesteps, run.global_step)
                phases = crossings(
                    max(before, cfg.learning_starts), run.global_step, cfg.train_frequency
                )
                for _ in range(phases * cfg.gradient_steps):
                    if not buffer.ready(cfg.batch_size):
                        break
                    last_update = gradient_step(
                        q_network, target_network, optimizer, buffer, beta, cfg, fast_step, loss_of
                    )
                if crossings(before, run.global_step, cfg.target_network_frequency):
                    update_target(target_network, q_network, cfg.tau)

            # -- log -----------------------------------------------------------------------
            if run.log_due():
                metrics = {"charts/epsilon": epsilon}
                if last_update is not None:
                    metrics["losses/td_loss"] = last_update[0].detach()
                    metrics["losses/q_values"] = last_update[1].mean()
                run.log_scalars(metrics)
        return run.finish()


ALGORITHM = Algorithm(
    name="dqn",
    summary="Deep Q-Network, with Double, dueling, n-step and prioritized replay as options",
    config=DQNConfig,
    train=train,
    action_spaces=(gym.spaces.Discrete,),
    networks=(QNetwork, CnnQNetwork),
    action_masks=True,
)
