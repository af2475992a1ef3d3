"""The `rlstore` command: parses and dispatches, nothing else.

rlstore train ppo --env CartPole-v1
rlstore train a2c --env CartPole-v1 --seed 2
rlstore train dqn --env CartPole-v1 --n-step 3 --prioritized
rlstore resume runs/CartPole-v1__ppo__1__1700000000
rlstore eval runs/CartPole-v1__ppo__1__1700000000 --episodes 20
"""

from __future__ import annotations

import dataclasses
import importlib
import json
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Annotated, Union

import tyro

from rlstore.config import (
    CONFIG_CLASSES,
    TrainingInterrupted,
    UsageError,
    apply_overrides,
    read_config,
    resolve_defaults,
    validate,
)

USAGE = """\
usage: rlstore {train,resume,eval} ...

rlstore: a reference RL trainer built around correct, resumable storage.

commands:
  train ppo    Proximal Policy Optimization
  train a2c    Advantage Actor-Critic
  train dqn    Deep Q-Network (Double, dueling, n-step, prioritized replay as options)
  resume DIR   continue an interrupted run from its newest checkpoint
  eval DIR     evaluate a run's trained policy

Run `rlstore train ppo --help` for every option. Monitor with `tensorboard --logdir runs`.
"""


@dataclass
class ResumeArgs:
    """Continue a run from its newest valid checkpoint, in the same run directory."""

    run_dir: tyro.conf.Positional[str]
    """The run directory, runs/{env}__{algo}__{seed}__{time}."""
    total_timesteps: int | None = None
    """Train to this many env steps instead of the run's own total (extends schedules)."""


@dataclass
class EvalArgs:
    """Roll out a run's trained policy; print mean +- std, write eval.json."""

    run_dir: tyro.conf.Positional[str]
    """The run directory, runs/{env}__{algo}__{seed}__{time}."""
    episodes: int = 10
    """Number of evaluation episodes."""
    deterministic: bool = False
    """Act with the policy's mode (argmax or Gaussian mean) instead of sampling."""
    video: bool = False
    """Record the first episode to {run_dir}/videos (needs moviepy: rlstore[video])."""
    checkpoint: str | None = None
    """Evaluate this checkpoint file instead of the final model."""


def parse_train(args: list[str]):
    """Parse `<algo> [flags]` into a config; presets and --config give the defaults."""
    if any(a == "--resume" or a.startswith("--resume=") for a in args):
        raise UsageError("to continue a run, use `rlstore resume runs/<dir>` (it reads the config)")
    algo = next((a for a in args if not a.startswith("-")), None)
    defaults, preset = None, None
    if algo in CONFIG_CLASSES:
        defaults, preset = resolve_defaults(algo, args[args.index(algo) + 1 :])
    choices = [
        Annotated[
            cls,
            tyro.conf.subcommand(
                name, default=defaults if name == algo else None, description=cls.__doc__
            ),
        ]
        for name, cls in CONFIG_CLASSES.items()
    ]
    cfg = tyro.cli(Union[tuple(choices)], args=args, prog="rlstore train")  # noqa: UP007
    return algo, cfg, preset


def parse_resume(args: list[str]):
    """The config saved in the run directory, with --total-timesteps applied."""
    parsed = tyro.cli(ResumeArgs, args=args, prog="rlstore resume")
    run_dir = Path(parsed.run_dir)
    record_path = run_dir / "config.json"
    if not record_path.is_file():
        raise UsageError(
            f"{run_dir} is not a run directory (it has no config.json); give runs/<dir>"
        )
    algo = json.loads(record_path.read_text()).get("algo")
    if algo not in CONFIG_CLASSES:
        raise UsageError(f"{record_path} names no known algorithm ({algo!r})")
    cfg = apply_overrides(CONFIG_CLASSES[algo](), read_config(record_path, "config"), "config")
    if parsed.total_timesteps is not None:
        cfg = dataclasses.replace(cfg, total_timesteps=parsed.total_timesteps)
    if not any((run_dir / "checkpoints").glob("step_*.pt")):
        raise UsageError(f"{run_dir} has no checkpoint to resume from")
    return algo, cfg, run_dir


def main(argv: list[str] | None = None) -> int:
    args = sys.argv[1:] if argv is None else list(argv)
    if not args or args[0] in ("-h", "--help"):
        print(USAGE, end="")
        return 0 if args else 2
    command, rest = args[0], args[1:]
    from_run = None
    try:
        if command == "train":
            algo, cfg, preset = parse_train(rest)
        elif command == "resume":
            algo, cfg, from_run = parse_resume(rest)
            preset = None
        elif command == "eval":
            parsed = tyro.cli(EvalArgs, args=rest, prog="rlstore eval")
            from rlstore.evaluate import evaluate

            evaluate(parsed.run_dir, parsed.episodes, parsed.deterministic, parsed.video,
                     parsed.checkpoint)  # fmt: skip
            return 0
        else:
            raise UsageError(f"unknown command '{command}'; try `rlstore --help`")
        validate(cfg)
        if from_run is None:
            print(f"rlstore: {algo} on {cfg.env_id}, preset: {preset or 'none (defaults)'}")
        module = importlib.import_module(f"rlstore.algos.{algo}")
        module.train(cfg, preset, resume=from_run)
    except UsageError as e:
        print(f"rlstore: error: {e}", file=sys.stderr)
        return 2
    except TrainingInterrupted as e:
        return e.exit_code
    except KeyboardInterrupt:
        print("rlstore: interrupted", file=sys.stderr)
        return 130
    return 0


if __name__ == "__main__":
    sys.exit(main())
