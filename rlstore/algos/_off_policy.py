"""What SAC, TD3, DDPG, TQC and CrossQ share: the config of an off-policy actor-critic for
continuous actions (and of a deterministic one, TD3's and DDPG's), its replay buffer, the
env check, the actions before learning starts, the schedule of gradient steps, and the
loop that runs them (collect_and_train), which steps the envs through the collect
pipeline's ReplayCollector."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Annotated, ClassVar, Literal

import gymnasium as gym
import numpy as np
import torch
import tyro
from torch import nn

from rlstore.algos._shared import ReplayConfig, check_replay_fits, make_hindsight
from rlstore.collect import ReplayCollector
from rlstore.config import (
    Bound,
    Count,
    Fraction,
    NonNegative,
    NonNegativeInt,
    Positive,
    check_widths,
)
from rlstore.encoders import stored_dtype, stored_shape
from rlstore.errors import UsageError
from rlstore.machine import resolve_device
from rlstore.parts import as_tensors
from rlstore.run import Run, TrainingState, TrainResult
from rlstore.storage.replay import ReplayBuffer


@dataclass
class ContinuousOffPolicyConfig(ReplayConfig):
    """What SAC and TD3 share (defaults: CleanRL's sac_continuous_action.py and
    td3_continuous_action.py)."""

    total_timesteps: Count = 1_000_000
    num_envs: Count = 1
    """Number of parallel environments (one, as the references run)."""
    # continuous actions take no masks: not a flag of theirs
    action_masks: tyro.conf.Suppress[Literal["auto", "off"]] = "off"
    buffer_size: Count = 1_000_000
    """Replay buffer capacity in transitions."""
    buffer_device: str = "auto"
    """Where the replay buffer's observations live: auto (the training device), cpu or cuda."""
    gamma: Fraction = 0.99
    """Discount factor."""
    tau: Annotated[float, Bound(0, 1, low_open=True)] = 0.005
    """Target networks' soft update rate: target <- tau * online + (1 - tau) * target."""
    batch_size: Count = 256
    """Transitions per gradient step."""
    learning_starts: NonNegativeInt = 25_000
    """Env steps taken with uniformly random actions before the first gradient step."""
    gradient_steps_per_env_step: Positive = 1.0
    """Gradient steps per env step (summed over envs): with --num-envs N, N gradient steps
    follow each vector step at 1.0; 0.25 takes one every 4 env steps."""
    policy_frequency: Count = 2
    """The actor learns at every policy_frequency-th gradient step of the critics."""
    hidden: tuple[int, ...] = (256, 256)
    """Widths of the hidden ReLU layers of the actor and of each critic."""
    anneal_lr: bool = False
    """Anneal every learning rate linearly to 0 over training (RL Zoo's lin_ schedules)."""

    def check(self) -> None:
        super().check()
        check_widths("--hidden", self.hidden)
        if self.batch_size > self.buffer_size:
            raise UsageError(
                f"--batch-size {self.batch_size} must lie in [1, --buffer-size "
                f"{self.buffer_size}]; lower the batch size or enlarge the buffer"
            )
        if self.buffer_size < self.num_envs:
            raise UsageError(
                f"--buffer-size {self.buffer_size} must be at least --num-envs {self.num_envs}"
            )
        if self.learning_starts > self.total_timesteps:
            raise UsageError(
                f"--learning-starts {self.learning_starts} is larger than --total-timesteps "
                f"{self.total_timesteps}: training would never start; lower it"
            )


@dataclass
class DeterministicOffPolicyConfig(ContinuousOffPolicyConfig):
    """What TD3 and DDPG share: one learning rate, and a deterministic actor that explores
    with Gaussian noise (defaults: CleanRL's td3_continuous_action.py and
    ddpg_continuous_action.py, which agree)."""

    learning_rate: Positive = 3e-4
    """Adam learning rate of the actor and of the critics."""
    exploration_noise: NonNegative = 0.1
    """Std of the Gaussian noise added to the actor's actions while training, in units of
    the action box's half-width."""
    # What td3.py's target and update read: TD3Config makes the smoothing noise flags,
    # DDPG keeps these (no smoothing, one critic).
    critics: ClassVar[int] = 1
    policy_noise: ClassVar[float] = 0.0
    noise_clip: ClassVar[float] = 0.0


def check_bounded_actions(envs: gym.vector.VectorEnv, env_id: str, algo: str) -> None:
    """A UsageError (the envs closed) unless every action bound is finite: the actor
    squashes its output into the box, which needs both ends."""
    space = envs.single_action_space
    if not (np.isfinite(space.low).all() and np.isfinite(space.high).all()):
        envs.close()
        raise UsageError(
            f"{env_id} has an unbounded action space {space}; {algo} squashes its actions "
            "into the box and needs finite bounds (wrap the env in gymnasium's "
            "ClipAction or RescaleAction with finite bounds)"
        )


def make_replay_buffer(
    cfg: ContinuousOffPolicyConfig, envs: gym.vector.VectorEnv, device: torch.device
) -> ReplayBuffer:
    """The run's replay buffer: observations as stored_dtype says (float vectors as
    float32), float32 actions, one-step targets, hindsight relabelling with --her, after
    checking that it fits in memory."""
    hindsight = make_hindsight(cfg)
    obs_shape = stored_shape(envs.single_observation_space)
    obs_dtype = stored_dtype(envs.single_observation_space)
    action_shape = envs.single_action_space.shape
    buffer_device = device if cfg.buffer_device == "auto" else resolve_device(cfg.buffer_device)
    shapes = dict(action_shape=action_shape, action_dtype=torch.float32)
    check_replay_fits(
        buffer_device,
        cfg.buffer_size,
        cfg.num_envs,
        obs_shape,
        obs_dtype,
        hindsight=hindsight is not None,
        **shapes,
    )
    return ReplayBuffer(
        cfg.buffer_size,
        cfg.num_envs,
        obs_shape,
        obs_dtype,
        **shapes,
        device=buffer_device,
        sample_device=device,
        gamma=cfg.gamma,
        seed=cfg.seed,
        hindsight=hindsight,
    )


def random_actions(space: gym.spaces.Box, num_envs: int) -> np.ndarray:
    """Uniform actions in the box, one per env, from numpy's global RNG (seeded, and
    checkpointed with the run)."""
    u = np.random.random((num_envs, *space.shape))
    return (space.low + u * (space.high - space.low)).astype(np.float32)


def explore(
    agent: nn.Module,
    obs: np.ndarray,
    run: Run,
    cfg: ContinuousOffPolicyConfig,
    space: gym.spaces.Box,
) -> np.ndarray:
    """The actions of the next vector step: uniformly random until learning_starts env
    steps are done, then the agent's exploring ones (`agent.act`), on the host."""
    if run.global_step < cfg.learning_starts:
        return random_actions(space, cfg.num_envs)
    with torch.no_grad():
        return agent.act(as_tensors(obs, run.device))[0].cpu().numpy()


def anneal_learning_rates(
    optimizers: list[torch.optim.Optimizer], base_rates: list[float], fraction_left: float
) -> None:
    """Set each optimizer's learning rate to its base rate times the fraction of training
    left (--anneal-lr), as SB3 does before each training phase."""
    for optimizer, rate in zip(optimizers, base_rates, strict=True):
        for group in optimizer.param_groups:
            group["lr"] = rate * fraction_left


def collect_and_train(
    run: Run,
    state: TrainingState,
    cfg: ContinuousOffPolicyConfig,
    gradient_step: Callable[[int], dict[str, torch.Tensor]],
    scalars: Callable[[], dict[str, torch.Tensor]] = dict,
) -> TrainResult:
    """The run of every algorithm here, from its built state (its replay buffer as the part
    `buffer`, its optimizers as the parts `NAME_optimizer`): act (random until
    learning_starts, then the agent's exploring actions) -> step the envs and store -> the
    learning rates annealed (--anneal-lr) -> the gradient steps due, `gradient_step(number)`
    each, which returns what it logs -> log the last ones' scalars, with `scalars()`."""
    buffer = state.parts["buffer"]
    collector = ReplayCollector(state.envs, run, buffer)
    annealed = [part for name, part in state.parts.items() if name.endswith("_optimizer")]
    base_rates = [o.param_groups[0]["lr"] for o in annealed]  # (before a resume restores them)
    with run.start(state):
        _loop(run, state, collector, cfg, gradient_step, annealed, base_rates, scalars)
        return run.finish()


def _loop(
    run: Run,
    state: TrainingState,
    collector: ReplayCollector,
    cfg: ContinuousOffPolicyConfig,
    gradient_step: Callable[[int], dict[str, torch.Tensor]],
    annealed: list[torch.optim.Optimizer],
    base_rates: list[float],
    scalars: Callable[[], dict[str, torch.Tensor]],
) -> None:
    logged: dict[str, torch.Tensor] = {}
    for _ in run.iterations():
        # -- act and store: state.obs is where the envs are ---------------------------------
        action = explore(state.policy, state.obs, run, cfg, state.envs.single_action_space)
        before = run.global_step
        state.obs = collector.step(state.obs, action)

        # -- train -------------------------------------------------------------------------
        if cfg.anneal_lr:
            anneal_learning_rates(annealed, base_rates, 1 - run.global_step / cfg.total_timesteps)
        for number in gradient_steps(cfg, before, run.global_step):
            if collector.buffer.ready(cfg.batch_size):
                logged |= gradient_step(number)

        # -- log ---------------------------------------------------------------------------
        if run.log_due() and logged:
            run.log_scalars(logged | scalars())


def gradient_steps(cfg: ContinuousOffPolicyConfig, before: int, after: int) -> range:
    """The numbers (1, 2, ...) of the gradient steps due when the env steps done go from
    `before` to `after`: gradient_steps_per_env_step per env step after learning_starts.
    A function of the step counts alone, so a resumed run takes the same ones."""

    def done(steps: int) -> int:
        return int(max(steps - cfg.learning_starts, 0) * cfg.gradient_steps_per_env_step)

    return range(done(before) + 1, done(after) + 1)


@contextmanager
def frozen(module: nn.Module) -> Iterator[None]:
    """Within it, `module`'s parameters take no gradient: the critics during the actor's
    step, where the gradient flows through them to the action and their own weights' would
    only be thrown away."""
    module.requires_grad_(False)
    try:
        yield
    finally:
        module.requires_grad_(True)
