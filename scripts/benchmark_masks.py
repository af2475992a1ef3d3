"""What action masks cost: the same rlstore run on Taxi-v4 under its masks and with
`--action-masks off`, side by side in one command, as users run them (each run its own
process, default options and threads):

    python scripts/benchmark_masks.py                        # PPO, DQN and C51, 30k steps
    python scripts/benchmark_masks.py --algos dqn --steps 50000 --repeats 5

Each repeat runs the masked and the unmasked run one after the other (alternating which
goes first) and times each from its launch to its end, imports and start-up included; the
table gives each side's median env steps/s and the ratio masked / unmasked. Writes
results/benchmark-masks.md and .json.
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

ROOT = Path(__file__).resolve().parent.parent


def timed_run(algo: str, steps: int, seed: int, masked: bool, logdir: str) -> float:
    """Env steps per second of one `rlstore train` process, launch to end."""
    command = [sys.executable, "-m", "rlstore", "train", algo, "--env", "Taxi-v4"]
    command += ["--total-timesteps", str(steps), "--seed", str(seed), "--logdir", logdir]
    command += ["--no-progress", "--no-track-tensorboard"]
    if not masked:
        command += ["--action-masks", "off"]
    start = time.perf_counter()
    subprocess.run(command, check=True, cwd=ROOT, stdout=subprocess.DEVNULL)
    return steps / (time.perf_counter() - start)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--algos", nargs="+", default=["ppo", "dqn", "c51"])
    parser.add_argument("--steps", type=int, default=30_000)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--seed", type=int, default=1)
    parser.add_argument("--out", type=Path, default=ROOT / "results" / "benchmark-masks")
    args = parser.parse_args()
    rows = []
    with tempfile.TemporaryDirectory() as logdir:
        for algo in args.algos:
            speeds: dict[bool, list[float]] = {True: [], False: []}
            for repeat in range(args.repeats):
                for masked in (True, False) if repeat % 2 == 0 else (False, True):
                    speeds[masked].append(timed_run(algo, args.steps, args.seed, masked, logdir))
            masked, unmasked = (statistics.median(speeds[m]) for m in (True, False))
            rows.append(
                {
                    "algo": algo,
                    "masked": round(masked),
                    "unmasked": round(unmasked),
                    "ratio": round(masked / unmasked, 2),
                    "runs": {"masked": speeds[True], "unmasked": speeds[False]},
                }
            )
            print(
                f"{algo}: masked {masked:,.0f} steps/s, unmasked {unmasked:,.0f}: "
                f"x{masked / unmasked:.2f}",
                flush=True,
            )
    command = "python scripts/benchmark_masks.py " + " ".join(sys.argv[1:])
    lines = [
        "# Action masks' cost: Taxi-v4 under its masks against `--action-masks off`",
        "",
        f"`{command.strip()}`: {args.steps:,} steps, seed {args.seed}, medians of "
        f"{args.repeats} runs each (launch to end), one run at a time.",
        "",
        "| algorithm | masked (steps/s) | unmasked (steps/s) | masked / unmasked |",
        "|---|---|---|---|",
    ]
    lines += [
        f"| {r['algo']} | {r['masked']:,} | {r['unmasked']:,} | x{r['ratio']:.2f} |" for r in rows
    ]
    args.out.with_suffix(".md").write_text("\n".join(lines) + "\n")
    args.out.with_suffix(".json").write_text(
        json.dumps({"steps": args.steps, "rows": rows}, indent=1)
    )


if __name__ == "__main__":
    main()
