"""A suite's results: each run's score, each row's (mean +- std over seeds, steps to its
threshold, its verdict against the reference band), and results.md."""

from __future__ import annotations

import contextlib
import json
import platform
import subprocess
import time
from collections.abc import Sequence
from pathlib import Path

import numpy as np

from rlstore.machine import available_cores
from rlstore.suite_file import REACH_WINDOW, Row, Suite, version_satisfies
from rlstore.text import plural


def first_reach(
    returns: Sequence[float], steps: Sequence[int], threshold: float, window: int = REACH_WINDOW
) -> int | None:
    """The env step of the first episode where the mean of the last `window` returns met
    `threshold` (steps[i]: where episode i ended), or None."""
    if len(returns) < window:
        return None
    means = np.convolve(returns, np.ones(window) / window, mode="valid")
    hits = np.flatnonzero(means >= threshold)
    return int(steps[hits[0] + window - 1]) if len(hits) else None


def run_result(
    summary: dict,
    window: int,
    threshold: float | None,
    score: str = "training",
    reach_window: int = REACH_WINDOW,
) -> dict:
    """One run's numbers from its summary.json; its score by the row's `score`, and the
    first env step where the mean of `reach_window` consecutive returns met `threshold`."""
    returns = summary["episodes"]["returns"]
    steps = summary["episodes"]["steps"]
    reached = None
    if threshold is not None:
        reached = first_reach(returns, steps, threshold, reach_window)
    if score != "training":  # the final evaluation's mean return or success rate
        key = "mean_return" if score == "evaluation" else "success_rate"
        evaluations = summary.get("evaluations") or [{}]
        value = evaluations[-1].get(key, float("nan"))
    else:
        value = float(np.mean(returns[-window:])) if returns else float("nan")
    record = Path(summary["run_dir"]) / "config.json"  # (what the run ran on)
    versions = {}
    with contextlib.suppress(OSError, ValueError, AttributeError):
        versions = json.loads(record.read_text()).get("resolved", {}).get("versions", {})
    return {
        "seed": summary["seed"],
        "run_dir": summary["run_dir"],
        "score": value,
        "episodes": len(returns),
        "steps": summary["global_step"],
        "reached_at": reached,
        "wall_seconds": summary["wall_seconds"],
        "steps_per_second": summary["global_step"] / max(summary["wall_seconds"], 1e-9),
        "versions": versions,
    }


def iqm(scores: Sequence[float]) -> float:
    """The interquartile mean: the mean of the middle half of the scores, int(n / 4) cut at
    each end (scipy's trim_mean(scores, 0.25), as rliable computes it)."""
    ordered = np.sort(np.asarray(scores, dtype=np.float64))
    cut = int(0.25 * len(ordered))
    return float(np.mean(ordered[cut : len(ordered) - cut]))


BOOTSTRAP_SAMPLES = 5000


def iqm_interval(scores: Sequence[float], seed: int = 0) -> tuple[float, float]:
    """The 95% percentile bootstrap interval of the IQM over the seeds (the runs resampled
    with replacement: rliable's stratified bootstrap, for one task)."""
    scores = np.asarray(scores, dtype=np.float64)
    rng = np.random.default_rng(seed)
    draws = rng.integers(0, len(scores), size=(BOOTSTRAP_SAMPLES, len(scores)))
    ordered = np.sort(scores[draws], axis=1)
    cut = int(0.25 * len(scores))
    means = ordered[:, cut : len(scores) - cut].mean(axis=1)
    low, high = np.percentile(means, [2.5, 97.5])
    return float(low), float(high)


def row_result(row: Row, runs: list[dict]) -> dict:
    scores = [r["score"] for r in runs]
    mean, std = float(np.mean(scores)), float(np.std(scores))
    # a seed is in the band at or above its low end (above it: better than the reference)
    in_band = sum(score >= row.band[0] for score in scores) if row.band else None
    reached = [r["reached_at"] for r in runs if r["reached_at"] is not None]
    # the versions some seed ran on that the band was not scored under
    other_versions = sorted(
        {
            f"{package} {version}"
            for r in runs
            for package, spec in row.requires.items()
            if (version := r.get("versions", {}).get(package))
            and not version_satisfies(version, spec)
        }
    )
    return {
        "name": row.name,
        "algo": row.algo,
        "env": row.env,
        "steps": row.steps,
        "seeds": row.seeds,
        "score_mean": mean,
        "score_std": std,
        "in_band": in_band,
        "iqm": iqm(scores),
        "iqm_interval": list(iqm_interval(scores)),
        "band": list(row.band) if row.band else None,
        "source": row.source,
        "score": row.score,
        "sampled": bool(row.overrides.get("eval_stochastic", False)),  # eval: not the mode
        "normalize": list(row.normalize) if row.normalize else None,
        "below_band": bool(row.band is not None and mean < row.band[0]),
        "above_band": bool(row.band is not None and mean > row.band[1]),
        "threshold": row.threshold,
        "need": row.need,
        "reached": len(reached),
        "too_few_reached": bool(row.need is not None and len(reached) < row.need),
        "steps_to_threshold": float(np.median(reached)) if reached else None,
        "reach_window": row.reach_window,
        "requires": dict(row.requires),
        "other_versions": other_versions,
        "wall_seconds": float(np.mean([r["wall_seconds"] for r in runs])),
        "steps_per_second": float(np.mean([r["steps_per_second"] for r in runs])),
        "runs": runs,
    }


def made_where() -> str:
    """'rlstore 0.1.0 at commit abc1234 on x86_64 (Intel(R) Xeon(R) Processor), 2 cores,
    2026-12-01 (python 3.11.7, torch 2.13.0, ..., mujoco 4.0.0)': what a results page was
    made with (the commit when rlstore runs from a git checkout; the CPU and the versions a
    run's config.json records)."""
    from rlstore import __version__
    from rlstore.machine import cpu_model, package_versions

    try:
        commit = subprocess.run(
            ["git", "rev-parse", "--short", "HEAD"],
            cwd=Path(__file__).parent,
            capture_output=True,
            text=True,
            timeout=5,
        ).stdout.strip()
    except (OSError, subprocess.SubprocessError):
        commit = ""
    at = f" at commit {commit}" if commit else ""
    cores = plural(available_cores(), "core")
    versions = ", ".join(f"{k} {v}" for k, v in package_versions().items() if k != "rlstore")
    return (
        f"rlstore {__version__}{at} on {platform.machine()} ({cpu_model()}), {cores}, "
        f"{time.strftime('%Y-%m-%d')} ({versions})"
    )


def score_text(row: dict) -> str:
    """A row's score as the results table gives it: success rates with two decimals,
    scores under 10 (MiniGrid's, FrozenLake's) with three, others with one."""
    if row["score"] == "success":
        return f"{row['score_mean']:.2f} +- {row['score_std']:.2f} (success)"
    mark = ""
    if row["score"] == "evaluation":
        mark = " (eval, sampled)" if row.get("sampled") else " (eval)"
    digits = 3 if abs(row["score_mean"]) < 10 else 1
    return f"{row['score_mean']:.{digits}f} +- {row['score_std']:.{digits}f}{mark}"


def iqm_text(row: dict) -> str:
    """A row's IQM and interval, with score_text's digits ('-' from results before it)."""
    if "iqm" not in row:
        return "-"
    digits = 2 if row["score"] == "success" else 3 if abs(row["score_mean"]) < 10 else 1
    low, high = row["iqm_interval"]
    return f"{row['iqm']:.{digits}f} [{low:.{digits}f}, {high:.{digits}f}]"


def results_markdown(suite: Suite, rows: list[dict], made: str = "") -> str:
    command = f"rlstore benchmark {suite.name}"
    title = f"# Benchmark: {suite.name}"
    if suite.seeds_label:
        command += f" --seeds {suite.seeds_label}"
        title += f", seeds {suite.seeds_label}"
    lines = [
        title,
        "",
        *([f"Made by `{command}` with {made}.", ""] if made else []),
        f"Score: per seed, the mean of the last {suite.window} training episode returns"
        + (
            " (rows marked (eval): the mean return of the final evaluation, the final policy "
            "played deterministically as `rlstore eval` plays it, as RL Zoo's tables score"
            + (
                "; (eval, sampled): its actions sampled, as `rlstore eval --stochastic` plays it"
                if any(r.get("sampled") for r in rows)
                else ""
            )
            + ")"
            if any(r["score"] == "evaluation" for r in rows)
            else ""
        )
        + (
            " (rows marked (success): the success rate of the final evaluation, from the "
            "env's info['is_success'] at each episode's end)"
            if any(r["score"] == "success" for r in rows)
            else ""
        )
        + "; per row, the mean +- std (population) over seeds. Steps to threshold (on "
        "training returns): the median over "
        f"the seeds that got there of the first env step where the mean of the last "
        f"{REACH_WINDOW} returns (or of the count a row gives) met it. Wall time and "
        "steps/s: per run, mean over seeds.",
        "",
        "Seeds in band: the seeds whose own score is at or above the band's low end; IQM: "
        "the interquartile mean of the seeds' scores with its 95% bootstrap interval "
        f"({BOOTSTRAP_SAMPLES:,} resamples of the seeds, as rliable's).",
        "",
        "| row | env | steps | seeds | score | reference band | seeds in band | IQM [95% CI] "
        "| steps to threshold | wall s/run | steps/s | verdict |",
        "|---|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    for r in rows:
        band = f"[{r['band'][0]:g}, {r['band'][1]:g}]" if r["band"] else "-"
        to = "-"
        if r["threshold"] is not None:
            reached = f"{r['reached']}/{len(r['seeds'])} reached {r['threshold']:g}"
            if r.get("reach_window", REACH_WINDOW) != REACH_WINDOW:
                reached += f" over {r['reach_window']} returns"
            reached += f" (need {r['need']})" if r["need"] else ""
            steps = f"{r['steps_to_threshold']:,.0f}, " if r["reached"] else ""
            to = steps + reached
        judged = r["band"] or r["need"]
        if r["below_band"] or r["too_few_reached"]:
            verdict = "BELOW"
        elif r.get("above_band"):
            verdict = "above"  # better than the reference: not an error, but not alike either
        else:
            verdict = "ok" if judged else "-"
        if judged and r.get("other_versions"):
            scored = ", ".join(f"{package}{spec}" for package, spec in r["requires"].items())
            verdict += f" (band scored under {scored}; ran {', '.join(r['other_versions'])})"
        in_band = "-" if r.get("in_band") is None else f"{r['in_band']}/{len(r['seeds'])}"
        lines.append(
            f"| {r['name']} | {r['env']} | {r['steps']:,} | {len(r['seeds'])} | "
            f"{score_text(r)} | {band} | {in_band} | {iqm_text(r)} | {to} | "
            f"{r['wall_seconds']:.1f} | {r['steps_per_second']:,.0f} | {verdict} |"
        )
    sources = [f"- {r['name']} on {r['env']}: {r['source']}" for r in rows if r["source"]]
    if sources:
        lines += ["", "Reference bands:", "", *sources]
    return "\n".join(lines) + "\n"
