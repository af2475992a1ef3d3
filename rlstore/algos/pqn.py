"""PQN, parallelised Q-network (Gallici et al. 2024), as CleanRL's pqn.py: Q-learning
without a replay buffer or a target network. Vectorized envs collect a short rollout
epsilon-greedily into the RolloutStorage; its Q(lambda) returns are the targets of a few
epochs of minibatch regression; a LayerNorm after every hidden layer keeps it stable.

Q(lambda) returns (Peng's, as PQN computes them) are the lambda-returns of the values
V(s) = max_a Q(s, a):
    G_t = r_t + gamma * (1 - terminated_t) * [V'_t + lambda * (1 - done_t) * (G_{t+1} - V'_t)]
with V'_t the value of the next observation (the final one at a truncation) and the
rollout's last step bootstrapped from V. That is GAE's return (advantage + V) with these
values, so the storage's compute_returns gives them, pseudo-steps and time limits as
for PPO (docs/reference/episode-boundaries.md; tests/test_pqn.py checks it against the
recursion above).

Reads top to bottom: the config, the network, the loss, max Q (acting and the values) and
the update's epochs of minibatch steps, then train(): build, and the loop of collect ->
returns -> update -> log; last, its registry entry.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import torch
from gymnasium import spaces
from torch import nn
from torch.nn import functional as F

from rlstore.action_heads import masked_q
from rlstore.algos import Algorithm
from rlstore.algos._shared import image_options, linear_schedule, optimizer_params
from rlstore.algos.dqn import epsilon_greedy
from rlstore.callbacks import Callback
from rlstore.collect import RolloutCollector
from rlstore.config import CommonConfig, Count, Fraction, Positive, Rollouts, check_widths
from rlstore.encoders import (
    description_of_spec,
    encoder_for,
    encoder_from_description,
    layer_init,
    stored_dtype,
    stored_shape,
)
from rlstore.envs import make_training_envs
from rlstore.errors import UsageError
from rlstore.machine import optimizer_step
from rlstore.masks import masks_of
from rlstore.networks import policy_spec
from rlstore.parts import as_tensors
from rlstore.run import Run, TrainingState, TrainResult
from rlstore.storage import RolloutStorage


@dataclass
class PQNConfig(Rollouts, CommonConfig):
    """PQN (defaults: CleanRL's pqn.py)."""

    learning_rate: Positive = 2.5e-4
    """RAdam learning rate."""
    anneal_lr: bool = True
    """Anneal the learning rate linearly to 0 over training."""
    num_steps: Count = 128
    """Steps per environment per rollout."""
    num_minibatches: Count = 4
    """Minibatches per epoch."""
    update_epochs: Count = 4
    """Epochs over each rollout."""
    gamma: Fraction = 0.99
    """Discount factor."""
    q_lambda: Fraction = 0.65
    """Lambda of the Q(lambda) returns (0: one-step targets, 1: Monte Carlo returns)."""
    start_e: Fraction = 1.0
    """Exploration epsilon at the start."""
    end_e: Fraction = 0.05
    """Exploration epsilon at the end of the decay."""
    exploration_fraction: Fraction = 0.5
    """Fraction of total_timesteps over which epsilon decays linearly from start_e to end_e."""
    max_grad_norm: Positive = 10.0
    """Gradient norm clipping threshold."""
    q_hidden: tuple[int, ...] = (120, 84)
    """Widths of the Q-network's hidden layers (each: linear, LayerNorm, ReLU)."""

    def check(self) -> None:
        super().check()
        check_widths("--q-hidden", self.q_hidden)
        self.check_rollout()
        if self.num_minibatches > self.rollout_size:
            raise UsageError(
                f"--num-minibatches {self.num_minibatches} is more than the "
                f"{self.rollout_size} steps of a rollout; lower it"
            )


class LayerNormQNetwork(nn.Module):
    """PQN's Q-network: the observation's encoder, then per hidden width a linear layer, a
    LayerNorm and a ReLU, then a linear layer to one Q-value per action; orthogonal
    weights (gain sqrt 2) and zero biases, as CleanRL's."""

    SPEC_NAME = "layernorm_q_network"

    def __init__(self, num_actions: int, hidden: tuple[int, ...], encoder: nn.Module) -> None:
        super().__init__()
        self.num_actions, self.hidden, self.encoder = num_actions, tuple(hidden), encoder
        layers: list[nn.Module] = []
        width = encoder.out_dim
        for out in self.hidden:
            layers += [layer_init(nn.Linear(width, out)), nn.LayerNorm(out), nn.ReLU()]
            width = out
        layers.append(layer_init(nn.Linear(width, num_actions), std=math.sqrt(2)))
        self.q = nn.Sequential(*layers)

    def forward(self, obs: Any) -> torch.Tensor:
        return self.q(self.encoder(obs))

    def q_values(self, obs: Any) -> torch.Tensor:
        """Q(obs, a) for every action, shape (batch, num_actions)."""
        return self(obs)

    def greedy_action(self, obs: Any, masks: np.ndarray | None = None) -> np.ndarray:
        """argmax Q (over the actions `masks` allows) for a batch of host observations."""
        device = self.q[-1].weight.device
        with torch.inference_mode():
            q = self(as_tensors(obs, device))
            allowed = None if masks is None else torch.as_tensor(masks, device=device)
            return masked_q(q, allowed).argmax(-1).cpu().numpy()

    def spec_args(self) -> dict:
        return {"action_dim": self.num_actions, "hidden": list(self.hidden)}

    @classmethod
    def from_spec(cls, spec: dict) -> LayerNormQNetwork:
        encoder = encoder_from_description(description_of_spec(spec))
        return cls(spec["action_dim"], tuple(spec["hidden"]), encoder)


def q_loss(q_network: nn.Module, obs: Any, actions: torch.Tensor, returns: torch.Tensor):
    """(mean squared error of Q(s, a) against the Q(lambda) returns, Q(s, a))."""
    q_value = q_network(obs).gather(-1, actions.long().unsqueeze(-1)).squeeze(-1)
    return F.mse_loss(q_value, returns), q_value.detach()


def max_q(
    q_network: nn.Module, obs: Any, mask: torch.Tensor | None
) -> tuple[torch.Tensor, torch.Tensor]:
    """(V(s) = max Q, the greedy actions) over the allowed actions, left on the network's
    device: only the actions cross to the host, at the env boundary. An observation whose
    mask allows no action (an episode's end may) has V = 0, not -inf: its value is never
    bootstrapped from (a termination's, or a pseudo-step's), and 0 * -inf would be NaN."""
    with torch.inference_mode():
        value, greedy = masked_q(q_network(obs), mask).max(-1)
        if mask is not None:
            value = value.masked_fill(~mask.any(-1), 0.0)
        return value, greedy


def pqn_update(
    q_network: nn.Module, optimizer: torch.optim.Optimizer, storage: RolloutStorage, cfg: PQNConfig
) -> tuple[torch.Tensor, torch.Tensor]:
    """Epochs of minibatch regression of Q(s, a) onto the rollout's Q(lambda) returns;
    the last minibatch's (loss, Q(s, a))."""
    for _ in range(cfg.update_epochs):
        for batch in storage.minibatches(cfg.num_minibatches):
            loss, q_value = q_loss(q_network, batch.obs, batch.actions, batch.returns)
            optimizer.zero_grad(set_to_none=True)
            loss.backward()
            nn.utils.clip_grad_norm_(optimizer_params(optimizer), cfg.max_grad_norm, foreach=True)
            optimizer_step(optimizer)
    return loss, q_value


def train(
    cfg: PQNConfig,
    preset: Path | None = None,
    resume: Path | None = None,
    callbacks: Sequence[Callback] = (),
) -> TrainResult:
    """Train PQN as configured, or continue the run in `resume` from its newest checkpoint;
    `callbacks` see the run as it goes (rlstore.run.Callback).

    Returns the run's result (run dir, episode returns, model).
    """
    # -- build ---------------------------------------------------------------------------
    run = Run(cfg, ALGORITHM.name, preset, resume, callbacks)
    device = run.device
    envs = make_training_envs(cfg, ALGORITHM)
    obs_space, action_space = envs.single_observation_space, envs.single_action_space
    num_actions = int(action_space.n)
    masks = masks_of(envs)  # the env's action masks (None: it gives none)
    encoder = encoder_for(obs_space, image_options(cfg))
    q_network = LayerNormQNetwork(num_actions, cfg.q_hidden, encoder).to(device)
    optimizer = torch.optim.RAdam(q_network.parameters(), lr=cfg.learning_rate)
    storage = RolloutStorage(
        cfg.num_steps,
        cfg.num_envs,
        stored_shape(obs_space),
        obs_dtype=stored_dtype(obs_space),
        device=device,
        action_mask_shape=None if masks is None else (num_actions,),
    )

    def start(obs: np.ndarray) -> None:  # the first observations, and after fresh resets
        storage.reset(obs, None if masks is None else masks.masks)

    obs, _ = envs.reset(seed=cfg.seed)
    start(obs)
    spec = policy_spec(q_network, obs_space, action_space, masks and masks.source)
    state = TrainingState(
        envs, q_network, spec, on_fresh_envs=start, storage=storage, optimizer=optimizer
    )
    explore_steps = int(cfg.exploration_fraction * cfg.total_timesteps)
    no_log_prob = np.zeros(cfg.num_envs, dtype=np.float32)
    collector = RolloutCollector(envs, run, storage)

    def step() -> None:
        """One vector step: act epsilon-greedily, store it with max Q of the obs acted at."""
        epsilon = linear_schedule(cfg.start_e, cfg.end_e, explore_steps, run.global_step)
        value, greedy = max_q(q_network, storage.current_obs, storage.current_action_mask)
        greedy = greedy.cpu().numpy()  # the env boundary
        mask = collector.action_mask
        action = epsilon_greedy(lambda *_: greedy, storage.current_obs, epsilon, num_actions, mask)
        collector.step(action, action, no_log_prob, value)

    with run.start(state):
        for iteration in run.iterations():
            lr = cfg.learning_rate
            if cfg.anneal_lr:
                lr = linear_schedule(cfg.learning_rate, 0.0, cfg.num_iterations, iteration)
                optimizer.param_groups[0]["lr"] = lr

            # -- collect, and the Q(lambda) returns -----------------------------------------
            collector.collect(step)
            next_value = max_q(q_network, storage.current_obs, storage.current_action_mask)[0]
            storage.compute_returns(next_value, cfg.gamma, cfg.q_lambda)

            # -- update: epochs of minibatch regression onto the returns ----------------------
            loss, q_value = pqn_update(q_network, optimizer, storage, cfg)

            # -- log -----------------------------------------------------------------------
            if run.log_due():
                epsilon = linear_schedule(cfg.start_e, cfg.end_e, explore_steps, run.global_step)
                run.log_scalars(
                    {
                        "losses/td_loss": loss.detach(),
                        "losses/q_values": q_value.mean(),
                        "charts/epsilon": epsilon,
                        "charts/learning_rate": lr,
                    }
                )
            storage.after_update()
        return run.finish()


ALGORITHM = Algorithm(
    name="pqn",
    summary="Parallelised Q-network: Q(lambda) on vectorized rollouts, no replay or target",
    config=PQNConfig,
    train=train,
    action_spaces=(spaces.Discrete,),
    defaults="CleanRL's pqn.py",
    networks=(LayerNormQNetwork,),
    action_masks=True,
)
