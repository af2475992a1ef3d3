"""docs/results.md, the short summary of the learning checks, written from their data: one
table per suite (family), each row's score beside its reference and the command that made
it, from results/learning-*.json (what `rlstore benchmark SUITE` wrote there).

    python scripts/results_summary.py            # rewrite docs/results.md
    python scripts/results_summary.py --check    # exit 1 if docs/results.md is not that
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

import numpy as np

from rlstore.suite_results import iqm, iqm_interval, iqm_text, score_text

ROOT = Path(__file__).resolve().parent.parent
RESULTS = ROOT / "results"
PAGE = ROOT / "docs" / "results.md"
# Records whose figures are not in a suite's results table (results/README.md).
OTHER_RECORDS = {
    "learning-atari.md": "PPO on Breakout for 1M steps and a 200k-step DQN run, on a CPU "
    "(its own data format)",
    "classic.md": "the classic suite with one worker against two, and the Atari suite on a cluster",
    "learning-offpolicy.md": "beside the tables above, SAC on LunarLanderContinuous (its "
    "runs predate the archive) and the TD3 rows' extra seeds and physics",
}
# Data whose page is another suite's (one page for both off-policy suites).
PAGE_OF = {"learning-mujoco-offpolicy.json": "learning-offpolicy.md"}


def verdict(row: dict) -> str:
    """A banded row's seeds in band ("9/10 seeds in band"), with "(mean below)" or "(mean
    above)" where the mean over seeds leaves the band; a row checked by a threshold, the
    seeds that reached it."""
    seeds = len(row["seeds"])
    if row.get("band") is None:  # a row checked by reaching a threshold, or by nothing
        if row.get("threshold") is None:
            return "-"
        reached = f"{row['reached']}/{seeds} reached {row['threshold']:g}"
        return reached + (" (too few)" if row.get("too_few_reached") else "")
    low = row["band"][0]
    in_band = sum(run["score"] >= low for run in row["runs"])
    mean = " (mean below)" if row.get("below_band") else ""
    mean += " (mean above)" if row.get("above_band") else ""
    return f"{in_band}/{seeds} seeds in band{mean}"


def iqm_cell(row: dict) -> str:
    """The IQM of the row's seeds' scores and its 95% bootstrap interval (from its runs)."""
    scores = [run["score"] for run in row["runs"]]
    low, high = iqm_interval(scores)
    return iqm_text({"score": "training", **row, "iqm": iqm(scores), "iqm_interval": [low, high]})


def merged(own: dict, check: dict) -> dict:
    """A suite's own data (its seeds, 1-3) with a check of its rows on other seeds
    (`--seeds 4-10`): each row the check ran gets both sets of runs, its mean, std and
    counts taken again over all of them; the rows it did not run stay as they are."""
    checked = {(row["name"], row["env"], row["steps"]): row for row in check["rows"]}
    rows = []
    for row in own["rows"]:
        other = checked.get((row["name"], row["env"], row["steps"]))
        if other is None:
            rows.append(row)
            continue
        seeds = set(row["seeds"])
        runs = row["runs"] + [run for run in other["runs"] if run["seed"] not in seeds]
        scores = np.array([run["score"] for run in runs], dtype=float)
        low, high = row["band"] if row.get("band") is not None else (None, None)
        rows.append(
            {
                **row,
                "seeds": sorted(run["seed"] for run in runs),
                "runs": runs,
                "score_mean": float(scores.mean()),
                "score_std": float(scores.std()),
                "below_band": low is not None and scores.mean() < low,
                "above_band": high is not None and scores.mean() > high,
                "reached": sum(run["reached_at"] is not None for run in runs),
            }
        )
    return {**own, "rows": rows, "checked_on": check["seeds"]}


def table(data: dict, page: str) -> str:
    suite = data["suite"]
    command = f"`rlstore benchmark {suite}" + (
        f" --seeds {data['seeds']}`" if data.get("seeds") else "`"
    )
    where = f"[results/{page}](../results/{page})"
    if data.get("checked_on"):
        check = Path(page).stem + f"-seeds-{data['checked_on']}.md"
        command += f" and, for the rows on more seeds, `... --seeds {data['checked_on']}`"
        where += f" and [results/{check}](../results/{check})"
    lines = [
        f"## {suite}",
        "",
        f"{command}; every run, its machine and commit: {where}.",
        "",
        "| row | env | steps | seeds | ours | IQM [95% CI] | reference band | verdict "
        "| reference |",
        "|---|---|---|---|---|---|---|---|---|",
    ]
    for row in data["rows"]:
        band = "-" if row.get("band") is None else f"[{row['band'][0]:g}, {row['band'][1]:g}]"
        source = (row.get("source") or "-").replace("|", "/").replace("\n", " ")
        source = source.replace("docs/results/", "results/")  # (data written before the move)
        lines.append(
            f"| {row['name']} | {row['env']} | {row['steps']:,} | {len(row['seeds'])} | "
            f"{score_text({'score': 'training', **row})} | {iqm_cell(row)} | {band} | "
            f"{verdict(row)} | {source} |"
        )
    return "\n".join(lines)


def summary() -> str:
    parts = [
        "# Results: the learning checks in short",
        "",
        "Written by `python scripts/results_summary.py` from results/learning-*.json, the",
        "data `rlstore benchmark SUITE` wrote; the pages beside that data, in results/, hold",
        "each suite's runs, curves, machine and commit, and the speed benchmarks against",
        "stable-baselines3 (results/README.md lists them). Score: per seed the mean of the",
        "last 100 training returns, or (eval) the final policy's mean evaluation return",
        "(sampled: its actions sampled, not its mode), or (success) its success rate; per",
        "row the mean +- std over seeds, the interquartile mean (IQM) of the seeds' scores",
        "with its 95% bootstrap interval, and how many seeds scored in the band (at or",
        "above its low end). A suite checked on more seeds (`--seeds 1-10`, or its own",
        "seeds 1-3 and `--seeds 4-10`) is given on all of them; the long ones (MuJoCo,",
        "Atari, LunarLanderContinuous) run three seeds here, hours each on two cores.",
    ]
    order = ["classic", "value-methods", "box2d", "mujoco", "offpolicy", "mujoco-offpolicy"]
    order += ["continuous-methods", "atari"]
    order += ["recurrent", "spaces", "her"]  # (then any other suite, by name)
    paths = sorted(
        RESULTS.glob("learning-*.json"),
        key=lambda p: (order.index(p.stem[9:]) if p.stem[9:] in order else len(order), p.stem),
    )
    chosen: dict[str, tuple[Path, dict]] = {}  # suite -> its data of the most seeds
    checks: dict[str, dict] = {}  # suite -> a check on other seeds that needs its own data
    for path in paths:
        data = json.loads(path.read_text())
        if "suite" in data and "rows" in data:
            if data.get("seeds") and not path.stem.endswith("-seeds-1-10"):
                checks[data["suite"]] = data  # (seeds 4-10: merged with the suite's 1-3)
                continue
            seeds = max(len(row["seeds"]) for row in data["rows"])
            best = chosen.get(data["suite"])
            if best is None or seeds > max(len(row["seeds"]) for row in best[1]["rows"]):
                chosen[data["suite"]] = (path, data)
    for suite, check in checks.items():
        path, own = chosen[suite]
        chosen[suite] = (path, merged(own, check))
    for path, data in chosen.values():
        page = PAGE_OF.get(path.name, path.with_suffix(".md").name)
        parts += ["", table(data, page)]
    parts += ["", "## Other records", ""]
    parts += [
        f"- [results/{page}](../results/{page}): {what}" for page, what in OTHER_RECORDS.items()
    ]
    return "\n".join(parts) + "\n"


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--check", action="store_true", help="compare, do not write")
    args = parser.parse_args()
    text = summary()
    if args.check:
        if not PAGE.is_file() or PAGE.read_text() != text:
            print(f"{PAGE} is not what the data gives: run scripts/results_summary.py")
            return 1
        return 0
    PAGE.write_text(text)
    print(f"wrote {PAGE}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
