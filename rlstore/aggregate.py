"""Aggregate metrics across a suite's rows, with rliable (Agarwal et al., "Deep RL at the
Edge of the Statistical Precipice", NeurIPS 2021): the interquartile mean (IQM), the
median of the per-task means, the mean and the optimality gap of normalized scores,
with 95% stratified bootstrap confidence intervals, and performance profiles (the
fraction of runs whose normalized score exceeds tau).

Each row's per-seed scores are normalized to (score - low) / (high - low): [low, high] is
the row's `normalize` range when it gives one (a random policy's score and the best
known, say), else its reference band. Rows are grouped into algorithms by their name;
each env is a task. Rows with neither range are left out, and said so.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np

from rlstore.errors import UsageError

METRICS = ("IQM", "Median", "Mean", "Optimality gap")
TAUS = np.linspace(-0.5, 1.5, 41)  # where performance profiles are evaluated
BOOTSTRAP_REPS = 2000
BOOTSTRAP_SEED = 0  # the intervals are the same each time the page is made


def rliable() -> Any:
    """rliable's library and metrics modules, or a UsageError naming the extra."""
    try:
        from rliable import library, metrics
    except ImportError:
        raise UsageError(
            'aggregate metrics need rliable: pip install "rlstore[rliable]" (in a clone: '
            'pip install -e ".[rliable]")'
        ) from None
    return library, metrics


def normalized_scores(rows: list[dict]) -> tuple[dict[str, np.ndarray], list[str], list[str]]:
    """{algorithm (row name): runs x tasks normalized scores}, the tasks (envs) and what
    was left out. An algorithm's tasks must have equal numbers of seeds: the first N of
    each are taken, N the fewest."""
    by_name: dict[str, dict[str, np.ndarray]] = {}
    left_out = []
    for row in rows:
        span = row.get("normalize") or row.get("band")
        if not span:
            left_out.append(f"{row['name']} on {row['env']} (no normalize range or band)")
            continue
        low, high = span
        scores = np.array([run["score"] for run in row["runs"]], float)
        by_name.setdefault(row["name"], {})[row["env"]] = (scores - low) / (high - low)
    tasks = sorted({env for per_env in by_name.values() for env in per_env})
    score_dict = {}
    for name, per_env in by_name.items():
        if sorted(per_env) != tasks:
            missing = ", ".join(t for t in tasks if t not in per_env)
            left_out.append(f"{name} (no score on {missing})")
            continue
        n = min(len(v) for v in per_env.values())
        score_dict[name] = np.stack([per_env[t][:n] for t in tasks], axis=1)
    return score_dict, tasks, left_out


def aggregate(rows: list[dict], reps: int = BOOTSTRAP_REPS) -> dict[str, Any]:
    """Point estimates and 95% intervals of METRICS, and performance profiles at TAUS, per
    algorithm: {"tasks", "left_out", "algorithms": {name: {"runs", metric: [point, low,
    high], "profile": [[tau, fraction, low, high], ...]}}}."""
    library, metrics = rliable()
    score_dict, tasks, left_out = normalized_scores(rows)
    if not score_dict:
        raise UsageError("no row has a normalize range or a band: nothing to aggregate")

    def summary(scores: np.ndarray) -> np.ndarray:
        return np.array(
            [
                metrics.aggregate_iqm(scores),
                metrics.aggregate_median(scores),
                metrics.aggregate_mean(scores),
                metrics.aggregate_optimality_gap(scores),
            ]
        )

    def profile(scores: np.ndarray) -> np.ndarray:
        return np.array([np.mean(scores > tau) for tau in TAUS])

    # rliable resamples with numpy's global RNG: seeded here, and given back after
    saved = np.random.get_state()
    np.random.seed(BOOTSTRAP_SEED)
    try:
        points, intervals = library.get_interval_estimates(score_dict, summary, reps=reps)
        profiles, bands = library.get_interval_estimates(score_dict, profile, reps=reps)
    finally:
        np.random.set_state(saved)
    algorithms = {}
    for name, scores in score_dict.items():
        entry: dict[str, Any] = {"runs": int(scores.shape[0])}
        for k, metric in enumerate(METRICS):
            entry[metric] = [float(points[name][k]), *map(float, intervals[name][:, k])]
        entry["profile"] = [
            [float(tau), float(profiles[name][k]), *map(float, bands[name][:, k])]
            for k, tau in enumerate(TAUS)
        ]
        algorithms[name] = entry
    return {"tasks": tasks, "left_out": left_out, "algorithms": algorithms}


def aggregate_markdown(result: dict[str, Any], suite: str) -> str:
    tasks = ", ".join(result["tasks"])
    lines = [
        f"# Aggregate metrics: {suite}",
        "",
        f"Normalized scores ((score - low) / (high - low), [low, high] the row's normalize "
        f"range, else its reference band) over the tasks {tasks}, each algorithm's runs "
        f"pooled over tasks; 95% stratified bootstrap intervals ({BOOTSTRAP_REPS} "
        "resamples), with rliable. Optimality gap: the mean shortfall below 1 (lower is "
        "better).",
        "",
        "| algorithm | runs x tasks | " + " | ".join(METRICS) + " |",
        "|---|---|" + "---|" * len(METRICS),
    ]
    for name, entry in result["algorithms"].items():
        cells = [f"{p:.3f} [{lo:.3f}, {hi:.3f}]" for p, lo, hi in (entry[m] for m in METRICS)]
        lines.append(f"| {name} | {entry['runs']} x {len(result['tasks'])} | {' | '.join(cells)} |")
    if result["left_out"]:
        lines += ["", "Left out: " + "; ".join(result["left_out"]) + "."]
    return "\n".join(lines) + "\n"


def draw(result: dict[str, Any], png: Path) -> None:
    """The intervals of each metric and the performance profiles, side by side."""
    from rlstore.plot import _pyplot

    plt = _pyplot()
    names = list(result["algorithms"])
    fig, axes = plt.subplots(
        1, len(METRICS) + 1, figsize=(4 * (len(METRICS) + 1), 0.6 * len(names) + 2)
    )
    for ax, metric in zip(axes, METRICS, strict=False):
        for y, name in enumerate(names):
            point, low, high = result["algorithms"][name][metric]
            ax.barh(y, high - low, left=low, height=0.6, alpha=0.5)
            ax.plot([point, point], [y - 0.3, y + 0.3], color="k")
        ax.set_yticks(range(len(names)), names if metric == METRICS[0] else [""] * len(names))
        ax.set_title(metric)
        ax.set_xlabel("normalized score")
        ax.grid(alpha=0.3, axis="x")
    ax = axes[-1]
    for name in names:
        profile = np.array(result["algorithms"][name]["profile"])
        (line,) = ax.plot(profile[:, 0], profile[:, 1], label=name)
        ax.fill_between(
            profile[:, 0], profile[:, 2], profile[:, 3], alpha=0.15, color=line.get_color()
        )
    ax.set_title("performance profile")
    ax.set_xlabel("normalized score tau")
    ax.set_ylabel("fraction of runs with score > tau")
    ax.legend(fontsize=7)
    ax.grid(alpha=0.3)
    fig.tight_layout()
    fig.savefig(png, dpi=100)
    plt.close(fig)
