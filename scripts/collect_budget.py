"""Where a step of PPO's collect loop goes, measured inside real `rlstore.algos.ppo.train`
runs: the loop's own calls (act_on_host -> envs.step -> storage.insert -> run.record_step)
and LeanRollout's (rlstore/lean.py), one run each, side by side.

    python scripts/collect_budget.py                  # PPO's CartPole defaults, 100k steps
    python scripts/collect_budget.py --steps 200000 -- --num-envs 2

The pieces are wrapped with timers in place, as scripts/dqn_budget.py does: the policy's
forward and sampling (HostActorCritic.sample), each env's own step and reset (its
outermost wrapper), the storage's insert and the run's episode statistics; the rest of
collect_rollout is the loop, the vector env's bookkeeping and the writes. Prints
microseconds per vector step. Single-threaded.
"""

from __future__ import annotations

import argparse
import tempfile

import gymnasium as gym
import torch
from dqn_budget import seconds, timed  # (this script's folder is on the path)

from rlstore.algos import ppo
from rlstore.cli import parse_train
from rlstore.host_networks import HostActorCritic
from rlstore.lean import LeanRollout
from rlstore.run import Run
from rlstore.storage import RolloutStorage

PIECES = {
    "collect": "collect_rollout, whole",
    "act": "  policy forward and sampling",
    "env": "  env steps and resets (each env's own)",
    "insert": "  storage.insert",
    "record": "  run.record_step (episode statistics)",
}


def budget(flags: list[str], lean: bool) -> tuple[dict[str, float], int]:
    """Seconds per piece of one run, and its vector steps."""
    seconds.clear()
    originals = {
        (ppo, "collect_rollout"): ppo.collect_rollout,
        (HostActorCritic, "sample"): HostActorCritic.sample,
        (gym.wrappers.TimeLimit, "step"): gym.wrappers.TimeLimit.step,
        (gym.wrappers.TimeLimit, "reset"): gym.wrappers.TimeLimit.reset,
        (RolloutStorage, "insert"): RolloutStorage.insert,
        (Run, "record_step"): Run.record_step,
    }
    names = ["collect", "act", "env", "env", "insert", "record"]
    for ((owner, attribute), fn), name in zip(originals.items(), names, strict=True):
        setattr(owner, attribute, timed(name, fn))
    supports = LeanRollout.supports
    if not lean:
        LeanRollout.supports = staticmethod(lambda *args: False)
    try:
        with tempfile.TemporaryDirectory() as logdir:
            args = ["ppo", *flags, "--logdir", logdir, "--no-progress", "--checkpoint-every", "0"]
            _, cfg, preset = parse_train(args)
            result = ppo.train(cfg, preset)
    finally:
        for (owner, attribute), fn in originals.items():
            setattr(owner, attribute, fn)
        LeanRollout.supports = supports
    return dict(seconds), result.global_step // cfg.num_envs


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=100_000)
    parser.add_argument("flags", nargs="*", help="more `rlstore train ppo` flags, after --")
    args = parser.parse_args()
    torch.set_num_threads(1)
    flags = ["--env", "CartPole-v1", "--total-timesteps", str(args.steps), *args.flags]
    runs = {"the loop's own calls": budget(flags, lean=False), "LeanRollout": budget(flags, True)}
    print(f"us per vector step, PPO {' '.join(flags)}\n")
    print("| piece | " + " | ".join(runs) + " |")
    print("|---|" + "---|" * len(runs))
    for key, label in PIECES.items():
        cells = [f"{spent.get(key, 0.0) / steps * 1e6:.1f}" for spent, steps in runs.values()]
        print(
            f"| {label.strip() if key == 'collect' else '- ' + label.strip()} | "
            + " | ".join(cells)
            + " |"
        )
    rest = []
    for spent, steps in runs.values():
        inner = sum(spent.get(key, 0.0) for key in PIECES if key != "collect")
        rest.append(f"{(spent['collect'] - inner) / steps * 1e6:.1f}")
    print("| - the rest (loop, vector env bookkeeping, writes) | " + " | ".join(rest) + " |")


if __name__ == "__main__":
    main()
