"""Typed configs: one dataclass per algorithm is the CLI, the preset schema and the saved
record. Here: the fields every algorithm shares (CommonConfig, OnPolicyConfig), their
bounds and checks (`validate`), and the run directory's name. Presets and the resolution of
a run's config (defaults < preset < --config FILE < flags) are in rlstore/presets.py. This
module imports neither torch nor gymnasium so `rlstore --help` stays fast.
"""

from __future__ import annotations

import dataclasses
import tempfile
import types
import typing
from dataclasses import dataclass
from pathlib import Path
from typing import Annotated, Any, Literal

import tyro

from rlstore.errors import UsageError
from rlstore.text import plural


@dataclass(frozen=True)
class Bound:
    """The natural range of a numeric field; `validate` checks every field that has one."""

    low: float | None = None
    high: float | None = None
    low_open: bool = False  # the low end itself is outside the range

    def holds(self, value: float) -> bool:
        above = self.low is None or (value > self.low if self.low_open else value >= self.low)
        return above and (self.high is None or value <= self.high)  # NaN fails both

    def describe(self) -> str:
        if self.high is not None:
            return f"must lie in {'(' if self.low_open else '['}{self.low:g}, {self.high:g}]"
        if self.low_open:
            return f"must be > {self.low:g}"
        return f"must be at least {self.low:g}"


Positive = Annotated[float, Bound(0, low_open=True)]
NonNegative = Annotated[float, Bound(0)]
Fraction = Annotated[float, Bound(0, 1)]
Count = Annotated[int, Bound(1)]  # one or more
NonNegativeInt = Annotated[int, Bound(0)]

EnvId = Annotated[str, tyro.conf.arg(name="env", aliases=("--env-id",))]


@dataclass
class CommonConfig:
    env_id: EnvId = "CartPole-v1"
    """Gymnasium environment id (alias: --env-id)."""
    seed: NonNegativeInt = 1
    """Seed of python, numpy, torch and the environments."""
    total_timesteps: Count = 500_000
    """Total environment steps (summed over all parallel envs)."""
    num_envs: Count = 4
    """Number of parallel environments."""
    device: str = "auto"
    """Where networks and storage live: auto (CUDA when available), cpu, cuda or cuda:N."""
    torch_threads: Count | Literal["auto"] = "auto"
    """Torch intra-op threads of this process, and numpy's BLAS threads. auto: 1 for MLP
    policies (under the passive wait policy a second one slows them down); for CNN policies
    (Atari) and networks with a 1024 x 1024 weight matrix or larger, torch gets every core,
    divided among the runs of a suite or sweep; idle threads sleep, so
    that runs sharing the cores do not collapse (docs/guides/atari.md). A number overrides
    it."""
    vectorization: Literal["auto", "native", "sync", "async"] = "auto"
    """auto: the env's own vectorized implementation (when it has one) from 6 envs on,
    sync otherwise (faster for fewer envs); native, sync and async force a mode."""
    max_episode_steps: Count | None = None
    """Override the env's time limit (episodes are truncated after this many steps)."""
    env_kwargs: tuple[str, ...] = ()
    """Keyword arguments of the env's constructor, KEY=VALUE each, values read as Python
    literals (`--env-kwargs is_slippery=False map_name=8x8`: a value that is no literal is a
    string)."""
    wrapper: Annotated[tuple[str, ...], tyro.conf.UseAppendAction] = ()
    """A wrapper of each env, module:Callable (a class or function that takes the env and
    returns the wrapped env); repeat the flag for more, applied in order, before rlstore's
    own (`--wrapper gymnasium.wrappers:FlattenObservation`)."""
    drop_obs_keys: tuple[str, ...] = ()
    """Keys of Dict observations to leave out, after the wrappers: parts rlstore cannot
    encode, such as MiniGrid's text `mission` (`--drop-obs-keys mission`), or do not want."""
    action_masks: Literal["auto", "off"] = "auto"
    """auto: act under the env's action masks where it gives them, as info["action_mask"]
    (Taxi-v4) or an action_masks() method (sb3-contrib's); off: ignore them."""
    cnn_channels: tuple[int, ...] = (16, 32, 64)
    """Channels of the 2x2 convolutions of the CNN for images under 36 pixels a side
    (MiniGrid's 7x7 views; PPO, A2C, ppo_lstm, DQN). Larger images take the Nature CNN
    (32-64-64, as published); Atari frame stacks keep their own networks."""
    image_scale: Positive | Literal["auto"] = "auto"
    """What uint8 image observations are divided by inside the network. auto: 255 for
    images of 36 pixels a side or more (pixels), 1 for smaller ones, taken for grids of
    symbols (MiniGrid's object, colour and state indices); give 255 for small pixel
    images."""
    sticky_actions: bool = False
    """Atari only: repeat the previous action with probability 0.25 (the v5 ids' default).
    Off by default, as in the published tables rlstore compares with."""
    fire_on_life_loss: bool = False
    """Atari only: press FIRE after every lost life in games that need it (Breakout), as
    CleanRL's and baselines' wrappers do; that step is not a transition. Off by default: a
    policy learns to press FIRE itself, and ale-py's fast vector env cannot do it (with it
    on, Gymnasium's wrappers run instead: docs/guides/atari.md)."""
    sign_rewards: bool = False
    """Learn from the sign of each reward (-1, 0, 1), as DQN and PPO do on Atari (on by
    default there). Logged episode returns stay the env's own."""
    truncation_as_termination: bool = False
    """Treat a time-limit truncation as a termination (no bootstrap from the final
    observation), as CleanRL's ppo_continuous_action.py and other older code do: only to
    reproduce their results (docs/reference/episode-boundaries.md)."""
    logdir: str = "runs"
    """Parent directory of run directories."""
    exp_name: str | None = None
    """Run name used in the run directory (default: the algorithm name)."""
    track_tensorboard: bool = True
    """Write TensorBoard event files into the run directory."""
    progress: bool = True
    """Show a progress bar on stderr."""
    config: str | None = None
    """A TOML file of field = value overrides (applied after the preset, before flags), or
    the name of a packaged preset: `--config fast` is configs/<algo>/<env id>.fast.toml."""
    checkpoint_every: NonNegativeInt = 100_000
    """Write a checkpoint every this many env steps (0: only at the end and on SIGINT/SIGTERM)."""
    keep_checkpoints: Count = 3
    """Keep the newest K checkpoints."""
    eval_every: NonNegativeInt = 0
    """Evaluate the policy every this many env steps and at the end, on an env of its own
    (0: never, as CleanRL and the published tables rlstore compares with score training
    returns; docs/guides/evaluation.md). Keeps best_model.pt."""
    eval_episodes: Count = 10
    """Episodes per evaluation (seeds seed + 10000 + i, as `rlstore eval` plays them)."""
    eval_stochastic: bool = False
    """Evaluate with actions sampled from the policy instead of its mode (DQN: greedy)."""
    capture_video: bool = False
    """Record the first episode of every video_every-th evaluation to videos/ and to
    TensorBoard (needs --eval-every and the [video] extra)."""
    video_every: Count = 1
    """With --capture-video: record every K-th evaluation, the first included."""
    track: bool = False
    """Send the run to Weights & Biases (config, and TensorBoard's scalars synced), as
    CleanRL's --track does; needs the [wandb] extra; WANDB_MODE=offline works offline."""
    wandb_project: str = "rlstore"
    """With --track: the W&B project."""
    wandb_entity: str | None = None
    """With --track: the W&B entity (team or user; default: yours)."""
    fast_paths: Literal["auto", "off"] = "auto"
    """auto: rlstore's fast paths wherever they apply (numpy twins of the small networks'
    steps, lean env loops: docs/maintainers/fast-paths.md); off: the readable torch code and
    Gymnasium's own vector envs everywhere, the reference the fast paths are tested
    against (the same algorithm, slower; results differ from auto's by rounding)."""

    check_finite: Literal["on", "off"] = "on"
    """on: a NaN or inf in an observation or reward the env returns, or in a logged loss,
    stops the run with one line (its last checkpoint kept); off: train on them anyway."""

    @property
    def use_fast_paths(self) -> bool:
        """Whether the fast paths may run (fast_paths = "auto")."""
        return self.fast_paths == "auto"

    def check(self) -> None:
        """The checks of field combinations of this config class (validate() calls it after
        checking each field's range); subclasses add theirs."""
        from rlstore.custom_envs import parse_env_kwargs, split_callable_path

        parse_env_kwargs(self.env_kwargs)
        check_widths("--cnn-channels", self.cnn_channels)
        for path in self.wrapper:
            split_callable_path(path, "--wrapper")
        if self.capture_video and not self.eval_every:
            raise UsageError(
                "--capture-video records evaluation episodes; give --eval-every STEPS too"
            )
        if self.track and not self.track_tensorboard:
            raise UsageError(
                "--track syncs the TensorBoard scalars to W&B; drop --no-track-tensorboard"
            )

    @property
    def iteration_steps(self) -> int:
        """Env steps per iteration of the training loop (one vector step)."""
        return self.num_envs

    @property
    def steps_run(self) -> int:
        """The env steps the run takes: total_timesteps rounded up to whole iterations."""
        return -(-self.total_timesteps // self.iteration_steps) * self.iteration_steps


class Rollouts:
    """Iterations of whole rollouts of num_envs x num_steps env steps, for a config that has
    num_steps (the on-policy loops'): listed before CommonConfig among the bases, so that
    its iteration_steps and steps_run are the ones used."""

    @property
    def rollout_size(self) -> int:
        """Env steps per rollout: num_envs x num_steps."""
        return self.num_envs * self.num_steps

    @property
    def num_iterations(self) -> int:
        """Rollouts in the run: the run stops at the last whole one."""
        return self.total_timesteps // self.rollout_size

    @property
    def iteration_steps(self) -> int:
        return self.rollout_size

    @property
    def steps_run(self) -> int:
        return self.num_iterations * self.rollout_size

    def check_rollout(self) -> None:
        """A UsageError unless the run holds at least one whole rollout."""
        if self.total_timesteps < self.rollout_size:
            raise UsageError(
                f"--total-timesteps {self.total_timesteps} is smaller than one rollout "
                f"(num_envs x num_steps = {self.rollout_size}); raise --total-timesteps or "
                "lower --num-steps"
            )


@dataclass
class OnPolicyConfig(Rollouts, CommonConfig):
    """What PPO and A2C share: rollouts of num_envs x num_steps, returns, the loss weights."""

    learning_rate: Positive = 2.5e-4
    """Learning rate of the optimizer."""
    anneal_lr: bool = True
    """Anneal the learning rate linearly to 0 over training."""
    num_steps: Count = 128
    """Steps per environment per rollout."""
    gamma: Fraction = 0.99
    """Discount factor."""
    gae_lambda: Fraction = 0.95
    """GAE lambda (1.0 gives the classic n-step bootstrapped returns)."""
    use_gae: bool = True
    """Use GAE; without it, returns are bootstrapped discounted sums (lambda = 1)."""
    norm_adv: bool = True
    """Normalize advantages (per minibatch for PPO, over the rollout for A2C)."""
    ent_coef: NonNegative = 0.01
    """Entropy bonus coefficient."""
    vf_coef: NonNegative = 0.5
    """Value loss coefficient."""
    max_grad_norm: Positive = 0.5
    """Gradient norm clipping threshold."""
    norm_obs: bool = False
    """Normalize observations by their running mean and std, clipped to +-clip_obs (the
    statistics are saved with the policy and frozen when it is evaluated)."""
    norm_reward: bool = False
    """Scale rewards by the running std of the discounted return, clipped to +-clip_reward."""
    clip_obs: Positive = 10.0
    """Clip normalized observations to this magnitude."""
    clip_reward: Positive = 10.0
    """Clip scaled rewards to this magnitude."""
    hidden: tuple[int, ...] = (64, 64)
    """Widths of the hidden Tanh layers of the actor and of the critic (ppo_lstm: of the
    MLP heads after its LSTMs)."""

    def check(self) -> None:
        super().check()
        check_widths("--hidden", self.hidden)
        self.check_rollout()


def check_widths(flag: str, widths: tuple[int, ...]) -> None:
    """A network's hidden layer widths: one or more, each at least 1."""
    if not widths or min(widths) < 1:
        raise UsageError(f"{flag} needs one or more layer widths >= 1 (got {widths})")


def env_file_name(env_id: str) -> str:
    """An env id as a file name: '/' and ':' become '_'."""
    return env_id.replace("/", "_").replace(":", "_")


def run_dir_prefix(env_id: str, name: str, seed: int) -> str:
    """The start of a run directory's name, {env}__{name}__{seed}__, before its unix time
    (one owner: runs make it, executors look for it)."""
    return f"{env_file_name(env_id)}__{name}__{seed}__"


def validate(cfg: CommonConfig) -> None:
    """Every check that needs no env and no network: each numeric field against its
    Bound, then the combinations (the config class's `check`). Fails before anything is
    built."""
    hints = typing.get_type_hints(type(cfg), include_extras=True)
    for field in dataclasses.fields(cfg):
        value = getattr(cfg, field.name)
        bound = _bound(hints[field.name])
        if bound is not None and isinstance(value, (int, float)) and not bound.holds(value):
            raise UsageError(f"{flag(field.name)} {bound.describe()} (got {value})")
    cfg.check()


def check_writable_dir(path: Path, flag: str = "--logdir") -> None:
    """A UsageError unless `path` is, or can be made, a directory this process can write
    to. Creates nothing: the nearest existing ancestor is probed with a temporary file."""
    existing = path
    while not existing.exists() and existing != existing.parent:
        existing = existing.parent
    if not existing.is_dir():
        raise UsageError(f"{flag} {path}: {existing} is a file; give a directory")
    try:
        with tempfile.TemporaryFile(dir=existing):
            pass
    except OSError as e:
        raise UsageError(
            f"{flag} {path}: cannot write in {existing} ({e.strerror}); "
            "give a directory you can write to"
        ) from None


def not_a_run_dir(path: Path, fix: str = "") -> UsageError:
    """The error for a path without config.json; one that holds run directories (runs/, a
    suite's runs/) names them."""
    inside = sorted(p.parent.name for p in path.glob("*/config.json")) if path.is_dir() else []
    if inside:
        names = ", ".join(inside[:3]) + (", ..." if len(inside) > 3 else "")
        return UsageError(
            f"{path} is not a run directory but holds {plural(len(inside), 'run')} ({names}); "
            "give one of them"
        )
    return UsageError(f"{path} is not a run directory (it has no config.json){fix}")


def flag(name: str) -> str:
    """The command-line flag of a config field."""
    return "--" + name.replace("_", "-")


def _bound(tp: Any) -> Bound | None:
    """The Bound in a field's type (Annotated, possibly inside a union), if any."""
    if typing.get_origin(tp) is Annotated:
        return next((m for m in tp.__metadata__ if isinstance(m, Bound)), None)
    if typing.get_origin(tp) in (typing.Union, types.UnionType):
        return next(filter(None, map(_bound, typing.get_args(tp))), None)
    return None


# -- what a run will use, before it runs --------------------------------------------------------
