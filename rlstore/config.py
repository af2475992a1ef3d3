"""Typed configs: one dataclass per algorithm is the CLI, the preset schema and the saved record.

Precedence when resolving a config: dataclass defaults < preset from configs/ < --config FILE
< command-line flags. This module imports neither torch nor gymnasium so `rlstore --help`
stays fast.
"""

from __future__ import annotations

import dataclasses
import difflib
import json
import types
import typing
from dataclasses import dataclass
from pathlib import Path
from typing import Annotated, Any, Literal

import tomllib
import tyro


class UsageError(Exception):
    """A user mistake: the CLI prints the message on one line and exits with status 2."""


class TrainingInterrupted(Exception):
    """SIGINT or SIGTERM arrived and a checkpoint was written; the CLI exits 130 or 143."""

    def __init__(self, signum: int) -> None:
        super().__init__(f"interrupted by signal {signum}")
        self.exit_code = 128 + signum


EnvId = Annotated[str, tyro.conf.arg(name="env", aliases=("--env-id",))]


@dataclass
class CommonConfig:
    env_id: EnvId = "CartPole-v1"
    """Gymnasium environment id (alias: --env-id)."""
    seed: int = 1
    """Seed of python, numpy, torch and the environments."""
    total_timesteps: int = 500_000
    """Total environment steps (summed over all parallel envs)."""
    num_envs: int = 4
    """Number of parallel environments."""
    device: str = "auto"
    """Where networks and storage live: auto (CUDA when available), cpu, cuda or cuda:N."""
    vectorization: Literal["auto", "native", "sync", "async"] = "auto"
    """auto: the env's own vectorized implementation (when it has one) from 6 envs on,
    sync otherwise (faster for fewer envs); native, sync and async force a mode."""
    max_episode_steps: int | None = None
    """Override the env's time limit (episodes are truncated after this many steps)."""
    logdir: str = "runs"
    """Parent directory of run directories."""
    exp_name: str | None = None
    """Run name used in the run directory (default: the algorithm name)."""
    track_tensorboard: bool = True
    """Write TensorBoard event files into the run directory."""
    progress: bool = True
    """Show a progress bar on stderr."""
    config: str | None = None
    """A TOML file of field = value overrides (applied after the preset, before flags)."""
    checkpoint_every: int = 100_000
    """Write a checkpoint every this many env steps (0: only at the end and on SIGINT/SIGTERM)."""
    keep_checkpoints: int = 3
    """Keep the newest K checkpoints."""


@dataclass
class PPOConfig(CommonConfig):
    """Proximal Policy Optimization (clipped objective, GAE, minibatch updates)."""

    learning_rate: float = 2.5e-4
    """Adam learning rate."""
    anneal_lr: bool = True
    """Anneal the learning rate linearly to 0 over training."""
    num_steps: int = 128
    """Steps per environment per rollout."""
    gamma: float = 0.99
    """Discount factor."""
    gae_lambda: float = 0.95
    """GAE lambda."""
    use_gae: bool = True
    """Use GAE; without it, returns are bootstrapped discounted sums (lambda = 1)."""
    num_minibatches: int = 4
    """Minibatches per epoch."""
    update_epochs: int = 4
    """Epochs over each rollout."""
    norm_adv: bool = True
    """Normalize advantages per minibatch."""
    clip_coef: float = 0.2
    """Surrogate clipping coefficient."""
    clip_vloss: bool = True
    """Clip the value loss around the old value estimates."""
    ent_coef: float = 0.01
    """Entropy bonus coefficient."""
    vf_coef: float = 0.5
    """Value loss coefficient."""
    max_grad_norm: float = 0.5
    """Gradient norm clipping threshold."""
    adam_eps: float = 1e-5
    """Adam epsilon."""
    target_kl: float | None = None
    """Stop the update epochs early when the approximate KL exceeds this."""

    @property
    def batch_size(self) -> int:
        return self.num_envs * self.num_steps

    @property
    def minibatch_size(self) -> int:
        return self.batch_size // self.num_minibatches

    @property
    def num_iterations(self) -> int:
        return self.total_timesteps // self.batch_size


@dataclass
class A2CConfig(CommonConfig):
    """Advantage Actor-Critic (synchronous, one update per rollout)."""

    learning_rate: float = 7e-4
    """RMSprop learning rate."""
    anneal_lr: bool = False
    """Anneal the learning rate linearly to 0 over training."""
    num_steps: int = 5
    """Steps per environment per rollout."""
    gamma: float = 0.99
    """Discount factor."""
    gae_lambda: float = 1.0
    """GAE lambda (1.0 gives the classic n-step bootstrapped returns)."""
    use_gae: bool = True
    """Use GAE; without it, returns are bootstrapped discounted sums (lambda = 1)."""
    norm_adv: bool = False
    """Normalize advantages over the rollout."""
    ent_coef: float = 0.01
    """Entropy bonus coefficient."""
    vf_coef: float = 0.5
    """Value loss coefficient."""
    max_grad_norm: float = 0.5
    """Gradient norm clipping threshold."""
    rmsprop_alpha: float = 0.99
    """RMSprop smoothing constant."""
    rmsprop_eps: float = 1e-5
    """RMSprop epsilon."""

    @property
    def batch_size(self) -> int:
        return self.num_envs * self.num_steps

    @property
    def num_iterations(self) -> int:
        return self.total_timesteps // self.batch_size


@dataclass
class DQNConfig(CommonConfig):
    """Deep Q-Network (Mnih et al. 2015) with optional Double, dueling, n-step and PER."""

    num_envs: int = 1
    """Number of parallel environments (step counters count env steps, summed over envs)."""
    learning_rate: float = 2.5e-4
    """Adam learning rate."""
    buffer_size: int = 10_000
    """Replay buffer capacity in transitions."""
    buffer_device: str = "auto"
    """Where the replay buffer lives: auto (the training device), cpu or cuda."""
    gamma: float = 0.99
    """Discount factor."""
    tau: float = 1.0
    """Target network update rate: 1.0 is a hard copy, less is a soft (Polyak) update."""
    target_network_frequency: int = 500
    """Env steps between target network updates."""
    batch_size: int = 128
    """Transitions per gradient step."""
    start_e: float = 1.0
    """Exploration epsilon at the start."""
    end_e: float = 0.05
    """Exploration epsilon at the end of the decay."""
    exploration_fraction: float = 0.5
    """Fraction of total_timesteps over which epsilon decays linearly from start_e to end_e."""
    learning_starts: int = 10_000
    """Env steps of pure collection before the first gradient step."""
    train_frequency: int = 10
    """Env steps between training phases."""
    gradient_steps: int = 1
    """Gradient steps per training phase."""
    loss: Literal["mse", "huber"] = "mse"
    """TD loss: mean squared error or Huber (smooth L1)."""
    max_grad_norm: float | None = None
    """Clip the gradient norm to this value (no clipping when unset)."""
    double_dqn: bool = False
    """Double DQN: the online network picks the next action, the target network values it."""
    dueling: bool = False
    """Dueling head: Q = V + A - mean(A)."""
    n_step: int = 1
    """n-step returns (1 is the classic one-step target)."""
    prioritized: bool = False
    """Prioritized experience replay (proportional)."""
    per_alpha: float = 0.6
    """PER priority exponent alpha in [0, 1] (0 is uniform)."""
    per_beta: float = 0.4
    """PER importance-sampling exponent at the start; annealed linearly to 1 over training."""
    per_eps: float = 1e-6
    """Added to |TD error| so that no priority is zero."""


CONFIG_CLASSES: dict[str, type[CommonConfig]] = {
    "ppo": PPOConfig,
    "a2c": A2CConfig,
    "dqn": DQNConfig,
}
PRESET_DIR = Path(__file__).resolve().parent / "configs"  # installed: rlstore/configs
if not PRESET_DIR.is_dir():  # a source checkout: configs/ at the repository top
    PRESET_DIR = Path(__file__).resolve().parent.parent / "configs"


def preset_path(algo: str, env_id: str) -> Path:
    """configs/{algo}/{env id}.toml (a '/' or ':' in the id becomes '_')."""
    safe = env_id.replace("/", "_").replace(":", "_")
    return PRESET_DIR / algo / f"{safe}.toml"


def _type_ok(value: Any, tp: Any) -> bool:
    origin = typing.get_origin(tp)
    if origin is Annotated:
        return _type_ok(value, typing.get_args(tp)[0])
    if origin in (typing.Union, types.UnionType):
        return any(_type_ok(value, arg) for arg in typing.get_args(tp))
    if origin is Literal:
        return value in typing.get_args(tp)
    if tp is type(None):
        return value is None
    if tp is float:
        return isinstance(value, (int, float)) and not isinstance(value, bool)
    if tp is int:
        return isinstance(value, int) and not isinstance(value, bool)
    return isinstance(value, tp)


def apply_overrides(cfg: CommonConfig, overrides: dict[str, Any], source: str) -> CommonConfig:
    """Return a copy of cfg with overrides applied; unknown keys and wrong types are UsageErrors."""
    hints = typing.get_type_hints(type(cfg), include_extras=True)
    names = [f.name for f in dataclasses.fields(cfg)]
    changes = {}
    for key, value in overrides.items():
        name = key.replace("-", "_")
        if name == "env":
            name = "env_id"
        if name not in names or name == "config":
            close = difflib.get_close_matches(name, names, n=1)
            hint = f" (did you mean '{close[0]}'?)" if close else ""
            raise UsageError(f"{source}: unknown key '{key}'{hint}")
        if not _type_ok(value, hints[name]):
            raise UsageError(
                f"{source}: '{key}' = {value!r} has the wrong type; expected {hints[name]}"
            )
        if hints[name] is float and isinstance(value, int):
            value = float(value)
        changes[name] = value
    return dataclasses.replace(cfg, **changes)


def read_config(path: Path, what: str) -> dict[str, Any]:
    """A flat table of overrides from a TOML file (or JSON, such as a run's config.json)."""
    if not path.is_file():
        raise UsageError(f"{what} '{path}' does not exist; give the path of a TOML file")
    try:
        if path.suffix == ".json":
            data = json.loads(path.read_text())
            for key in ("algo", "preset", "config"):  # bookkeeping of a run's config.json
                data.pop(key, None)
            return data
        with open(path, "rb") as f:
            return tomllib.load(f)
    except (tomllib.TOMLDecodeError, json.JSONDecodeError, UnicodeDecodeError) as e:
        reason = str(e).splitlines()[0] if str(e) else type(e).__name__
        raise UsageError(f"{what} '{path}' is not valid: {reason}") from None


def _scan_flag(args: list[str], names: tuple[str, ...]) -> str | None:
    """The last value given for any of `names` in args (`--x v` or `--x=v`), as argparse would."""
    found = None
    for i, arg in enumerate(args):
        for name in names:
            if arg == name and i + 1 < len(args):
                found = args[i + 1]
            elif arg.startswith(name + "="):
                found = arg[len(name) + 1 :]
    return found


def resolve_defaults(algo: str, args: list[str]) -> tuple[CommonConfig, Path | None]:
    """Defaults for the CLI of `algo`: dataclass defaults < preset < --config file.

    Flags are applied afterwards by tyro. Returns the config and the preset used (or None).
    """
    cfg = CONFIG_CLASSES[algo]()
    config_file = _scan_flag(args, ("--config",))
    file_overrides = read_config(Path(config_file), "--config file") if config_file else {}
    env_id = _scan_flag(args, ("--env", "--env-id"))
    if env_id is None:
        env_id = file_overrides.get("env_id", file_overrides.get("env", cfg.env_id))
    preset = preset_path(algo, str(env_id))
    if preset.is_file():
        cfg = apply_overrides(cfg, read_config(preset, "preset"), f"preset {preset}")
    else:
        preset = None
    if config_file:
        cfg = apply_overrides(cfg, file_overrides, f"--config file {config_file}")
        cfg = dataclasses.replace(cfg, config=config_file)
    return cfg, preset


def validate(cfg: CommonConfig) -> None:
    """Cheap checks that need no env and no network: fail before anything is built."""
    if cfg.num_envs < 1:
        raise UsageError(f"--num-envs must be at least 1 (got {cfg.num_envs})")
    if cfg.checkpoint_every < 0 or cfg.keep_checkpoints < 1:
        raise UsageError("--checkpoint-every must be >= 0 and --keep-checkpoints >= 1")
    if cfg.max_episode_steps is not None and cfg.max_episode_steps < 1:
        raise UsageError(f"--max-episode-steps must be at least 1 (got {cfg.max_episode_steps})")
    if getattr(cfg, "num_steps", 1) < 1:
        raise UsageError(f"--num-steps must be at least 1 (got {cfg.num_steps})")
    batch = getattr(cfg, "batch_size", None)
    if batch is not None and cfg.total_timesteps < batch:
        raise UsageError(
            f"--total-timesteps {cfg.total_timesteps} is smaller than one rollout "
            f"(num_envs x num_steps = {batch}); raise --total-timesteps or lower --num-steps"
        )
    if isinstance(cfg, PPOConfig):
        if cfg.num_minibatches < 1 or cfg.batch_size % cfg.num_minibatches:
            raise UsageError(
                f"--num-minibatches {cfg.num_minibatches} does not divide the batch "
                f"(num_envs x num_steps = {cfg.batch_size}); pick a divisor of {cfg.batch_size}"
            )
        if cfg.update_epochs < 1:
            raise UsageError(f"--update-epochs must be at least 1 (got {cfg.update_epochs})")
    if isinstance(cfg, DQNConfig):
        _validate_dqn(cfg)
    for name in ("gamma", "gae_lambda"):
        value = getattr(cfg, name, None)
        if value is not None and not 0.0 <= value <= 1.0:
            flag = "--" + name.replace("_", "-")
            raise UsageError(f"{flag} must lie in [0, 1] (got {value})")


def _validate_dqn(cfg: DQNConfig) -> None:
    if cfg.buffer_size < cfg.num_envs:
        raise UsageError(
            f"--buffer-size {cfg.buffer_size} must be at least --num-envs {cfg.num_envs}"
        )
    if cfg.batch_size < 1 or cfg.batch_size > cfg.buffer_size:
        raise UsageError(
            f"--batch-size {cfg.batch_size} must lie in [1, --buffer-size {cfg.buffer_size}]; "
            "lower the batch size or enlarge the buffer"
        )
    if cfg.learning_starts > cfg.total_timesteps:
        raise UsageError(
            f"--learning-starts {cfg.learning_starts} is larger than --total-timesteps "
            f"{cfg.total_timesteps}: training would never start; lower it"
        )
    if cfg.n_step < 1:
        raise UsageError(f"--n-step must be at least 1 (got {cfg.n_step})")
    if not 0.0 <= cfg.per_alpha <= 1.0:
        raise UsageError(f"--per-alpha must lie in [0, 1] (got {cfg.per_alpha})")
    if not 0.0 <= cfg.per_beta <= 1.0:
        raise UsageError(f"--per-beta must lie in [0, 1] (got {cfg.per_beta})")
    if not 0.0 < cfg.tau <= 1.0:
        raise UsageError(f"--tau must lie in (0, 1] (got {cfg.tau})")
    for name in ("target_network_frequency", "train_frequency", "gradient_steps"):
        if getattr(cfg, name) < 1:
            flag = "--" + name.replace("_", "-")
            raise UsageError(f"{flag} must be at least 1 (got {getattr(cfg, name)})")
    for name in ("start_e", "end_e", "exploration_fraction"):
        if not 0.0 <= getattr(cfg, name) <= 1.0:
            flag = "--" + name.replace("_", "-")
            raise UsageError(f"{flag} must lie in [0, 1] (got {getattr(cfg, name)})")
