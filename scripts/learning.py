"""Does rlstore reach the published scores? Runs the learning checks of the foundation issue.

    python scripts/learning.py               # all checks, 2 runs in parallel
    python scripts/learning.py --only ppo-cartpole --jobs 1

For each run it reports the first env step at which the mean return of the last 20
training episodes reached the threshold (or '-'), and the final such mean. Results go to
docs/learning.md and docs/learning.json. Not part of CI: it takes tens of minutes.
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

import numpy as np

CHECKS = {
    # name: (algo, env, seeds, threshold, steps, how many seeds must pass, extra settings)
    "ppo-cartpole": ("ppo", "CartPole-v1", (1, 2, 3), 475.0, 500_000, 3, ()),
    "ppo-acrobot": ("ppo", "Acrobot-v1", (1, 2, 3), -100.0, 500_000, 3, ()),
    "a2c-cartpole": ("a2c", "CartPole-v1", (1, 2, 3), 475.0, 500_000, 2, ()),
    "dqn-cartpole": ("dqn", "CartPole-v1", (1, 2, 3), 475.0, 500_000, 2, ()),
    "dqn-cartpole-nstep3-per": (
        "dqn",
        "CartPole-v1",
        (1, 2, 3),
        475.0,
        500_000,
        1,
        (("n_step", 3), ("prioritized", True)),
    ),
}
WINDOW = 20


def first_reach(returns: list[float], steps: list[int], threshold: float) -> int | None:
    for i in range(WINDOW - 1, len(returns)):
        if np.mean(returns[i - WINDOW + 1 : i + 1]) >= threshold:
            return steps[i]
    return None


def one_run(job: tuple[str, str, int, int, tuple[str, ...]]) -> dict:
    import torch

    from rlstore.config import resolve

    torch.set_num_threads(1)
    algo, env_id, seed, steps, extra = job
    with tempfile.TemporaryDirectory() as logdir:
        overrides = dict(seed=seed, total_timesteps=steps, logdir=logdir, progress=False,
                         track_tensorboard=False, **dict(extra))  # fmt: skip
        cfg, preset = resolve(algo, env_id, overrides)
        result = importlib.import_module(f"rlstore.algos.{algo}").train(cfg, preset)
    return {
        "algo": algo,
        "env": env_id,
        "seed": seed,
        "steps": result.global_step,
        "seconds": round(result.seconds, 1),
        "sps": round(result.sps),
        "episode_returns": result.episode_returns,
        "episode_steps": result.episode_steps,
        "preset": str(preset.name) if preset else None,
        "flags": [list(item) for item in extra],
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--only", nargs="*", choices=sorted(CHECKS), default=sorted(CHECKS))
    parser.add_argument("--jobs", type=int, default=2)
    parser.add_argument("--out", default="docs/learning")
    args = parser.parse_args()

    jobs, wanted = [], {}
    for name in args.only:
        algo, env_id, seeds, _, steps, _, extra = CHECKS[name]
        for seed in seeds:
            jobs.append((algo, env_id, seed, steps, extra))
            wanted[(algo, env_id, seed, extra)] = name
    start = time.time()
    with mp.get_context("spawn").Pool(args.jobs) as pool:
        runs = pool.map(one_run, jobs, chunksize=1)

    commit = subprocess.run(["git", "rev-parse", "--short", "HEAD"], capture_output=True,
                            text=True).stdout.strip() or "?"  # fmt: skip
    lines = [
        "# Learning checks",
        "",
        f"`python scripts/learning.py` at commit {commit} on {platform.machine()} with "
        f"{mp.cpu_count()} cores, {time.strftime('%Y-%m-%d')}; each run single-threaded, "
        f"{args.jobs} at a time. Shipped presets apply (A2C on CartPole-v1 uses "
        "configs/a2c/CartPole-v1.toml); history is in git.",
        f"'reached at' is the first env step where the mean return of the last {WINDOW} "
        "training episodes met the threshold; 'final' is that mean at the end.",
        "",
        "| check | seed | threshold | reached at step | final mean | steps/s | pass |",
        "|---|---|---|---|---|---|---|",
    ]
    summary = {}
    for run in runs:
        name = wanted[(run["algo"], run["env"], run["seed"], tuple(map(tuple, run["flags"])))]
        threshold = CHECKS[name][3]
        reached = first_reach(run["episode_returns"], run["episode_steps"], threshold)
        final = float(np.mean(run["episode_returns"][-WINDOW:]))
        run.update(reached_at=reached, final_mean=round(final, 1), threshold=threshold)
        summary.setdefault(name, []).append(reached is not None)
        lines.append(
            f"| {name} | {run['seed']} | {threshold:g} | {reached if reached else '-'} | "
            f"{final:.1f} | {run['sps']:,} | {'yes' if reached else 'no'} |"
        )
    lines.append("")
    for name, passed in summary.items():
        need = CHECKS[name][5]
        verdict = "PASS" if sum(passed) >= need else "FAIL"
        lines.append(f"- {name}: {sum(passed)}/{len(passed)} seeds (need {need}): {verdict}")
    lines.append(f"\nTotal wall time {time.time() - start:.0f} s.")
    text = "\n".join(lines) + "\n"
    print(text)
    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    suffix = "" if set(args.only) == set(CHECKS) else "-" + "-".join(args.only)
    out.with_name(out.name + suffix + ".md").write_text(text)
    for run in runs:  # keep the JSON small: curves are summarized, not stored whole
        del run["episode_returns"], run["episode_steps"]
    out.with_name(out.name + suffix + ".json").write_text(json.dumps(runs, indent=2) + "\n")
    sys.exit(0 if all(sum(p) >= CHECKS[n][5] for n, p in summary.items()) else 1)


if __name__ == "__main__":
    main()
