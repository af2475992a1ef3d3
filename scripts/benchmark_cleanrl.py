"""rlstore against CleanRL's single-file scripts, side by side in one command, on
CartPole-v1 at CleanRL's own defaults (which are rlstore's for these algorithms), as users
run both: each run its own process, default options and threads.

    python scripts/benchmark_cleanrl.py --cleanrl-dir ../shared/anchors/cleanrl
    python scripts/benchmark_cleanrl.py --cleanrl-dir ~/cleanrl/cleanrl --algos c51 pqn \\
        --steps 100000 --seeds 1 2 3 --parallel 1 2

--cleanrl-dir is a folder with CleanRL's ppo.py, dqn.py, c51.py and pqn.py (a CleanRL
checkout's cleanrl/ folder, with cleanrl_utils beside or inside it; ../shared/anchors/cleanrl
holds copies patched only for Gymnasium 1.x's autoreset). For each K of --parallel, K
copies of the same command (seeds 1..K, or --seeds) go at once and the aggregate env steps/s
is the sum of the copies' own (steps over seconds from launch to end, imports and start-up
included); the trainers alternate, rlstore first for even seeds. Each row gives the
median over --seeds of the aggregate at each K and the ratio rlstore / CleanRL. Writes
results/benchmark-cleanrl.md and .json.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
ALGOS = ("ppo", "dqn", "c51", "pqn")


def command(trainer: str, algo: str, steps: int, seed: int, cleanrl: Path, logdir: str) -> list:
    if trainer == "rlstore":
        return [
            *(sys.executable, "-m", "rlstore", "train", algo, "--env", "CartPole-v1"),
            *("--total-timesteps", str(steps), "--seed", str(seed), "--logdir", logdir),
            "--no-progress",
        ]
    script = cleanrl / f"{algo}.py"
    return [sys.executable, str(script), "--total-timesteps", str(steps), "--seed", str(seed)]


def at_once(trainer: str, algo: str, steps: int, seeds: list[int], cleanrl: Path) -> float:
    """The aggregate env steps/s of one run per seed, all launched at once."""
    with tempfile.TemporaryDirectory() as scratch:  # CleanRL writes runs/ where it starts
        env = dict(os.environ)
        env["PYTHONPATH"] = os.pathsep.join(
            p for p in (str(cleanrl), str(cleanrl.parent), env.get("PYTHONPATH")) if p
        )
        cwd = ROOT if trainer == "rlstore" else scratch
        start = time.perf_counter()
        procs = [
            subprocess.Popen(
                command(trainer, algo, steps, seed, cleanrl, scratch),
                cwd=cwd,
                env=env,
                stdout=subprocess.DEVNULL,
                stderr=subprocess.PIPE,
                text=True,
            )
            for seed in seeds
        ]
        total = 0.0
        for proc in procs:
            _, err = proc.communicate()
            if proc.returncode:
                raise SystemExit(f"{trainer} {algo} failed:\n{err[-2000:]}")
            total += steps / (time.perf_counter() - start)
        return total


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    default_dir = ROOT.parent / "shared" / "anchors" / "cleanrl"
    parser.add_argument(
        "--cleanrl-dir", type=Path, default=default_dir if default_dir.exists() else None
    )
    parser.add_argument("--algos", nargs="+", choices=ALGOS, default=list(ALGOS))
    parser.add_argument("--steps", type=int, default=100_000)
    parser.add_argument("--seeds", nargs="+", type=int, default=[1])
    parser.add_argument("--parallel", nargs="+", type=int, default=[1, 2])
    parser.add_argument("--out", type=Path, default=ROOT / "results" / "benchmark-cleanrl")
    args = parser.parse_args()
    if args.cleanrl_dir is None or not (args.cleanrl_dir / "ppo.py").exists():
        parser.error(
            "--cleanrl-dir must name a folder with CleanRL's ppo.py, dqn.py, c51.py, pqn.py"
        )
    rows = []
    for algo in args.algos:
        for k in args.parallel:
            speeds: dict[str, list[float]] = {"rlstore": [], "cleanrl": []}
            for seed in args.seeds:
                copies = [seed + i * len(args.seeds) for i in range(k)]  # distinct seeds
                order = ("rlstore", "cleanrl") if seed % 2 else ("cleanrl", "rlstore")
                for trainer in order:
                    speed = at_once(trainer, algo, args.steps, copies, args.cleanrl_dir)
                    speeds[trainer].append(speed)
            ours, theirs = (statistics.median(speeds[t]) for t in ("rlstore", "cleanrl"))
            rows.append(
                {
                    "algo": algo,
                    "runs_at_once": k,
                    "rlstore": round(ours),
                    "cleanrl": round(theirs),
                    "ratio": round(ours / theirs, 2),
                    "each": speeds,
                }
            )
            print(
                f"{algo} x{k}: rlstore {ours:,.0f} steps/s, CleanRL {theirs:,.0f}: "
                f"x{ours / theirs:.2f}",
                flush=True,
            )
    shown = " ".join(sys.argv[1:])
    lines = [
        "# rlstore against CleanRL's scripts on CartPole-v1, at CleanRL's defaults",
        "",
        f"`python scripts/benchmark_cleanrl.py {shown}`: {args.steps:,} steps, seeds "
        f"{', '.join(map(str, args.seeds))} (medians), each run launch to end, default threads.",
        "",
        "| algorithm | runs at once | rlstore (steps/s) | CleanRL (steps/s) | rlstore / CleanRL |",
        "|---|---|---|---|---|",
    ]
    lines += [
        f"| {r['algo']} | {r['runs_at_once']} | {r['rlstore']:,} | {r['cleanrl']:,} | "
        f"x{r['ratio']:.2f} |"
        for r in rows
    ]
    args.out.with_suffix(".md").write_text("\n".join(lines) + "\n")
    args.out.with_suffix(".json").write_text(
        json.dumps({"steps": args.steps, "rows": rows}, indent=1)
    )


if __name__ == "__main__":
    main()
