"""What evaluation during training costs: the same training runs with and without
--eval-every, side by side, as users start them (`rlstore train`, default options and
threads), alternating per seed; medians of env steps/s and their ratio.

    python scripts/eval_cost.py                       # -> results/evaluation-cost.md
    python scripts/eval_cost.py --seeds 1 --quick     # a quicker look

Each case evaluates 10 episodes (the default) at a cadence of about 1/10 of its budget
and at the end, the "evaluate ten times a run" users reach for; the page also gives the
evaluation's env steps against the training's, which the cost follows.
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

# (algo, env, training steps, eval every) -- quick: a tenth of the budget
CASES = [
    ("ppo", "CartPole-v1", 100_000, 10_000),
    ("dqn", "CartPole-v1", 50_000, 5_000),
    ("sac", "Pendulum-v1", 7_000, 1_000),
]


def one_run(algo: str, env: str, steps: int, every: int, seed: int, logdir: Path) -> dict:
    command = [
        sys.executable,
        "-m",
        "rlstore",
        "train",
        algo,
        "--env",
        env,
        "--seed",
        str(seed),
        "--total-timesteps",
        str(steps),
        "--logdir",
        str(logdir),
        "--no-progress",
        "--checkpoint-every",
        "0",
    ]
    if every:
        command += ["--eval-every", str(every)]
    subprocess.run(command, check=True, capture_output=True)
    (summary_file,) = logdir.glob("*/summary.json")
    summary = json.loads(summary_file.read_text())
    evaluations = summary.get("evaluations", [])
    return {
        "steps_per_second": summary["global_step"] / summary["wall_seconds"],
        "evaluations": len(evaluations),
        "eval_env_steps": sum(sum(e["lengths"]) for e in evaluations),
        "training_steps": summary["global_step"],
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seeds", type=int, nargs="+", default=[1, 2, 3])
    parser.add_argument("--quick", action="store_true", help="a tenth of each budget")
    parser.add_argument("--out", default="results/evaluation-cost")
    args = parser.parse_args()
    rows = []
    for algo, env, steps, every in CASES:
        if args.quick:
            steps, every = steps // 10, every // 10
        runs: dict[str, list[dict]] = {"off": [], "on": []}
        with tempfile.TemporaryDirectory() as tmp:
            for seed in args.seeds:
                for mode in ("off", "on"):  # alternating: a noisy machine hits both alike
                    logdir = Path(tmp) / f"{mode}{seed}"
                    runs[mode].append(
                        one_run(algo, env, steps, every if mode == "on" else 0, seed, logdir)
                    )
        off = statistics.median(r["steps_per_second"] for r in runs["off"])
        on = statistics.median(r["steps_per_second"] for r in runs["on"])
        eval_steps = statistics.median(r["eval_env_steps"] for r in runs["on"])
        rows.append(
            {
                "algo": algo,
                "env": env,
                "steps": steps,
                "eval_every": every,
                "evaluations": runs["on"][0]["evaluations"],
                "eval_env_steps": eval_steps,
                "off_sps": off,
                "on_sps": on,
                "ratio": on / off,
                "runs": runs,
            }
        )
        print(f"{algo} {env}: {off:,.0f} -> {on:,.0f} steps/s (x{on / off:.3f})", flush=True)
    commit = subprocess.run(
        ["git", "rev-parse", "--short", "HEAD"], capture_output=True, text=True
    ).stdout.strip()
    from rlstore.machine import machine_name  # (here: importing rlstore sets OMP_WAIT_POLICY)

    made = f"at commit {commit} on {machine_name()}, {time.strftime('%Y-%m-%d')}"
    seeds = " ".join(map(str, args.seeds))
    command = f"python scripts/eval_cost.py --seeds {seeds}" + (" --quick" if args.quick else "")
    lines = [
        "# The cost of evaluation during training",
        "",
        f"Made by `{command}` {made}: each case trained with and without `--eval-every` "
        "(10 episodes per evaluation, the default), alternating, one process at a time with "
        "rlstore's default options and threads. steps/s: training env steps over the run's "
        f"wall time, median over seeds {seeds}.",
        "",
        "| algo | env | training steps | --eval-every | evaluations | eval env steps (median) "
        "| steps/s without | steps/s with | with / without |",
        "|---|---|---|---|---|---|---|---|---|",
    ]
    for r in rows:
        lines.append(
            f"| {r['algo']} | {r['env']} | {r['steps']:,} | {r['eval_every']:,} | "
            f"{r['evaluations']} | {r['eval_env_steps']:,.0f} | {r['off_sps']:,.0f} | "
            f"{r['on_sps']:,.0f} | x{r['ratio']:.3f} |"
        )
    Path(args.out + ".md").write_text("\n".join(lines) + "\n")
    Path(args.out + ".json").write_text(
        json.dumps({"command": command, "made": made, "rows": rows}, indent=1)
    )
    print(f"written {args.out}.md and .json")


if __name__ == "__main__":
    main()
