"""The `rlstore` command: parses and dispatches, nothing else.

rlstore train ppo --env CartPole-v1
rlstore train a2c --env CartPole-v1 --seed 2
"""

from __future__ import annotations

import importlib
import sys
from typing import Annotated, Union

import tyro

from rlstore.config import CONFIG_CLASSES, UsageError, resolve_defaults, validate

USAGE = """\
usage: rlstore train {ppo,a2c,dqn} [OPTIONS]

rlstore: a reference RL trainer built around correct, resumable storage.

commands:
  train ppo    Proximal Policy Optimization
  train a2c    Advantage Actor-Critic
  train dqn    Deep Q-Network (Double, dueling, n-step, prioritized replay as options)

Run `rlstore train ppo --help` for every option. Monitor with `tensorboard --logdir runs`.
"""


def parse_train(args: list[str]):
    """Parse `train <algo> [flags]` into a config; presets and --config give the defaults."""
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


def main(argv: list[str] | None = None) -> int:
    args = sys.argv[1:] if argv is None else list(argv)
    if not args or args[0] in ("-h", "--help"):
        print(USAGE, end="")
        return 0 if args else 2
    command, rest = args[0], args[1:]
    try:
        if command != "train":
            raise UsageError(f"unknown command '{command}'; try `rlstore train ppo --help`")
        algo, cfg, preset = parse_train(rest)
        validate(cfg)
        print(f"rlstore: {algo} on {cfg.env_id}, preset: {preset or 'none (defaults)'}")
        module = importlib.import_module(f"rlstore.algos.{algo}")
        module.train(cfg, preset)
    except UsageError as e:
        print(f"rlstore: error: {e}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        print("rlstore: interrupted", file=sys.stderr)
        return 130
    return 0


if __name__ == "__main__":
    sys.exit(main())
