"""Does rlstore reach the published scores? The learning checks, suite by suite.

    python scripts/learning.py                        # classic control -> docs/learning.md
    python scripts/learning.py --suite box2d          # -> docs/learning-box2d.md
    python scripts/learning.py --suite mujoco         # -> docs/learning-mujoco.md
    python scripts/learning.py --only ppo-cartpole --jobs 1

Every run uses the defaults rlstore applies to its env (presets included), one torch
thread, two runs at a time on 2 cores. Per run: the first env step at which the mean of
the last 20 training returns reached the check's threshold, that mean at the end, and the
mean of the last 100 training returns. A check passes on enough seeds reaching the
threshold, or, as the published tables score, on the mean over seeds of each seed's last
100 training returns ("score"). Some checks add the deterministic `rlstore eval` score
over 100 episodes. Not part of CI: a suite takes tens of minutes.
"""

from __future__ import annotations

import argparse
import importlib
import json
import multiprocessing as mp
import platform
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import NamedTuple

import numpy as np


class Check(NamedTuple):
    suite: str
    algo: str
    env: str
    threshold: float  # for "reached at": the last-20 mean
    steps: int
    seeds: tuple[int, ...] = (1, 2, 3)
    need: int | None = None  # seeds that must reach the threshold, or
    score: float | None = None  # the least mean over seeds of the last-100 means
    extra: tuple[tuple[str, object], ...] = ()
    eval_episodes: int = 0  # deterministic evaluation episodes after training


MUJOCO_TARGETS = {"HalfCheetah": 1400.0, "Hopper": 2100.0, "Walker2d": 1700.0}
CHECKS = {
    "ppo-cartpole": Check("classic", "ppo", "CartPole-v1", 475.0, 500_000, need=3),
    "ppo-acrobot": Check("classic", "ppo", "Acrobot-v1", -100.0, 500_000, need=3),
    "a2c-cartpole": Check("classic", "a2c", "CartPole-v1", 475.0, 500_000, need=2),
    "dqn-cartpole": Check("classic", "dqn", "CartPole-v1", 475.0, 500_000, need=2),
    "dqn-cartpole-nstep3-per": Check("classic", "dqn", "CartPole-v1", 475.0, 500_000, need=1,
                                     extra=(("n_step", 3), ("prioritized", True))),
    "ppo-pendulum": Check("box2d", "ppo", "Pendulum-v1", -300.0, 500_000, need=2),
    "ppo-lunarlander": Check("box2d", "ppo", "LunarLander-v3", 200.0, 1_000_000, score=200.0,
                             eval_episodes=100),
    "a2c-lunarlander": Check("box2d", "a2c", "LunarLander-v3", 100.0, 500_000, score=100.0,
                             eval_episodes=100),
    "dqn-lunarlander": Check("box2d", "dqn", "LunarLander-v3", 100.0, 200_000, score=100.0,
                             eval_episodes=100),
    **{
        f"ppo-{env.lower()}-v{version}": Check(
            "mujoco" if version == 4 else "mujoco-v5", "ppo", f"{env}-v{version}", target,
            1_000_000, score=target if version == 4 else None,
        )
        for version in (4, 5)
        for env, target in MUJOCO_TARGETS.items()
    },
}  # fmt: skip
WINDOW = 20


def first_reach(returns: list[float], steps: list[int], threshold: float) -> int | None:
    for i in range(WINDOW - 1, len(returns)):
        if np.mean(returns[i - WINDOW + 1 : i + 1]) >= threshold:
            return steps[i]
    return None


def one_run(job: tuple[str, int]) -> dict:
    import torch

    from rlstore.config import resolve
    from rlstore.evaluate import evaluate

    torch.set_num_threads(1)
    name, seed = job
    check = CHECKS[name]
    with tempfile.TemporaryDirectory() as logdir:
        overrides = dict(seed=seed, total_timesteps=check.steps, logdir=logdir, progress=False,
                         track_tensorboard=False, **dict(check.extra))  # fmt: skip
        cfg, preset = resolve(check.algo, check.env, overrides)
        result = importlib.import_module(f"rlstore.algos.{check.algo}").train(cfg, preset)
        evaluated = None
        if check.eval_episodes:
            evaluated = evaluate(result.run_dir, check.eval_episodes, deterministic=True)
    returns = result.episode_returns
    return {
        "check": name,
        "seed": seed,
        "steps": result.global_step,
        "seconds": round(result.seconds, 1),
        "sps": round(result.sps),
        "reached_at": first_reach(returns, result.episode_steps, check.threshold),
        "final_mean_20": round(float(np.mean(returns[-WINDOW:])), 1),
        "mean_last_100": round(float(np.mean(returns[-100:])), 1),
        "eval_mean": None if evaluated is None else round(evaluated["mean_return"], 1),
        "preset": str(preset.name) if preset else None,
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--suite", default="classic",
                        choices=sorted({c.suite for c in CHECKS.values()}))  # fmt: skip
    parser.add_argument("--only", nargs="*", choices=sorted(CHECKS))
    parser.add_argument("--jobs", type=int, default=2)
    args = parser.parse_args()
    names = args.only or [n for n, c in CHECKS.items() if c.suite == args.suite]
    start = time.time()
    jobs = [(name, seed) for name in names for seed in CHECKS[name].seeds]
    with mp.get_context("spawn").Pool(args.jobs) as pool:
        runs = pool.map(one_run, jobs, chunksize=1)

    commit = subprocess.run(["git", "rev-parse", "--short", "HEAD"], capture_output=True,
                            text=True).stdout.strip() or "?"  # fmt: skip
    command = "python scripts/learning.py" + (
        f" --only {' '.join(args.only)}" if args.only else f" --suite {args.suite}"
    )
    lines = [
        f"# Learning checks: {args.suite if not args.only else ', '.join(args.only)}",
        "",
        f"`{command}` at commit {commit} on {platform.machine()} with {mp.cpu_count()} cores, "
        f"{time.strftime('%Y-%m-%d')}; each run single-threaded, {args.jobs} at a time, with "
        "the defaults and presets rlstore applies to the env. History is in git.",
        "",
        f"'reached at': the first env step where the mean of the last {WINDOW} training "
        "returns met the threshold; 'last 20' that mean at the end; 'last 100' the mean of "
        "the last 100 training returns; 'eval': the deterministic `rlstore eval` mean over "
        "100 episodes. A check's score is the mean over seeds of 'last 100', as published "
        "tables score.",
        "",
        "| check | seed | threshold | reached at step | last 20 | last 100 | eval | steps/s |",
        "|---|---|---|---|---|---|---|---|",
    ]
    verdicts = {}
    for run in runs:
        check = CHECKS[run["check"]]
        lines.append(
            f"| {run['check']} | {run['seed']} | {check.threshold:g} | "
            f"{run['reached_at'] or '-'} | {run['final_mean_20']:.1f} | "
            f"{run['mean_last_100']:.1f} | "
            f"{'-' if run['eval_mean'] is None else format(run['eval_mean'], '.1f')} | "
            f"{run['sps']:,} |"
        )
    lines.append("")
    for name in names:
        check = CHECKS[name]
        mine = [r for r in runs if r["check"] == name]
        reached = sum(r["reached_at"] is not None for r in mine)
        score = float(np.mean([r["mean_last_100"] for r in mine]))
        spread = float(np.std([r["mean_last_100"] for r in mine]))
        if check.need is not None:
            ok = reached >= check.need
            rule = f"{reached}/{len(mine)} seeds reached {check.threshold:g} (need {check.need})"
        elif check.score is not None:
            ok = score >= check.score
            rule = f"score {score:.1f} +- {spread:.1f} (need {check.score:g})"
        else:
            ok, rule = True, f"score {score:.1f} +- {spread:.1f} (quoted, no target)"
        verdicts[name] = ok
        lines.append(f"- {name}: {rule}: {'PASS' if ok else 'FAIL'}")
    lines.append(f"\nTotal wall time {time.time() - start:.0f} s.")
    text = "\n".join(lines) + "\n"
    print(text)
    page = "-".join(args.only) if args.only else args.suite
    out = Path("docs") / ("learning" if page == "classic" else f"learning-{page}")
    out.with_suffix(".md").write_text(text)
    out.with_suffix(".json").write_text(json.dumps(runs, indent=2) + "\n")
    sys.exit(0 if all(verdicts.values()) else 1)


if __name__ == "__main__":
    main()
