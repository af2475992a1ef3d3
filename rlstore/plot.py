"""`rlstore plot RUN_DIR_OR_GLOB...`: learning curves, mean and std across seeds.

Reads a scalar tag (charts/episodic_return by default) from the runs' TensorBoard event
files, groups the runs by env and run name (the algorithm unless --exp-name gave another),
smooths each run with a trailing moving average of `smooth` points, puts every run of a
group on one grid of env steps (`points` steps, evenly spaced over the range all of the
group's runs cover, by linear interpolation), and draws the mean with a band of +- one
population std. Headless: matplotlib's Agg backend, no display needed.
"""

from __future__ import annotations

import csv
import glob
import json
import warnings
from pathlib import Path
from typing import Any

import numpy as np

from rlstore.errors import UsageError

Curve = tuple[np.ndarray, np.ndarray]  # steps, values


def find_runs(patterns: list[str]) -> list[Path]:
    """Run directories (those with config.json) named by, or inside, the given paths/globs."""
    runs: set[Path] = set()
    for pattern in patterns:
        matches = glob.glob(pattern) or []
        if not matches:
            raise UsageError(f"'{pattern}' matches no file or directory")
        for match in map(Path, matches):
            if (match / "config.json").is_file():
                runs.add(match)
            elif match.is_dir():
                runs.update(p.parent for p in match.rglob("config.json"))
    if not runs:
        raise UsageError(f"no run directories (with config.json) in {' '.join(patterns)}")
    return sorted(runs)


def read_scalars(run_dir: Path, tag: str) -> Curve | None:
    """(steps, values) of `tag` in the run's event files, or None when it has none."""
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    accumulator = EventAccumulator(str(run_dir), size_guidance={"scalars": 0})
    accumulator.Reload()
    if tag not in accumulator.Tags().get("scalars", []):
        return None
    events = accumulator.Scalars(tag)
    return np.array([e.step for e in events], float), np.array([e.value for e in events], float)


def smooth(values: np.ndarray, window: int) -> np.ndarray:
    """Trailing moving average; the first points average what there is so far."""
    if window <= 1:
        return values
    sums = np.cumsum(np.insert(values, 0, 0.0))
    counts = np.minimum(np.arange(1, len(values) + 1), window)
    return (sums[1:] - sums[np.arange(1, len(values) + 1) - counts]) / counts


def aggregate(curves: list[Curve], points: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Grid steps, mean and population std of the curves over the steps they all cover."""
    low = max(steps[0] for steps, _ in curves)
    high = min(steps[-1] for steps, _ in curves)
    grid = np.linspace(low, high, points) if high > low else np.array([low])
    stacked = np.stack([np.interp(grid, steps, values) for steps, values in curves])
    return grid, stacked.mean(axis=0), stacked.std(axis=0)


def group_curves(runs: list[Path], tag: str, window: int) -> dict[tuple[str, str], list[Curve]]:
    """{(env id, run name): [smoothed curve of each run]}, in a stable order."""
    groups: dict[tuple[str, str], list[Curve]] = {}
    missing = []
    for run in runs:
        curve = read_scalars(run, tag)
        if curve is None or len(curve[0]) == 0:
            missing.append(run.name)
            continue
        record = json.loads((run / "config.json").read_text())
        key = (record["env_id"], record.get("exp_name") or record["algo"])
        order = np.argsort(curve[0], kind="stable")
        groups.setdefault(key, []).append((curve[0][order], smooth(curve[1][order], window)))
    if not groups:
        raise UsageError(f"none of the {len(runs)} runs has the scalar tag '{tag}'; give --tag")
    if missing:
        names = ", ".join(missing[:3])
        warnings.warn(f"{len(missing)} runs have no '{tag}': {names}", stacklevel=2)
    return dict(sorted(groups.items()))


def plot(
    paths: list[str],
    png: str | None = "curves.png",
    csv_path: str | None = None,
    tag: str = "charts/episodic_return",
    smooth_window: int = 1,
    points: int = 200,
) -> dict[tuple[str, str], tuple[np.ndarray, np.ndarray, np.ndarray]]:
    """Draw the curves of the runs in `paths` to `png` and/or write them to `csv_path`."""
    if smooth_window < 1 or points < 2:
        raise UsageError("--smooth must be at least 1 and --points at least 2")
    plt = _pyplot() if png else None  # before anything is written
    groups = group_curves(find_runs(paths), tag, smooth_window)
    table = {key: aggregate(curves, points) for key, curves in groups.items()}
    if csv_path:
        with open(csv_path, "w", newline="") as f:
            writer = csv.writer(f)
            writer.writerow(["env", "name", "runs", "step", "mean", "std"])
            for (env, name), (grid, mean, std) in table.items():
                for row in zip(grid, mean, std, strict=True):
                    writer.writerow([env, name, len(groups[env, name]), *map(float, row)])
    if png:
        _draw(plt, table, {key: len(c) for key, c in groups.items()}, tag, png)
    return table


def _pyplot() -> Any:
    try:
        import matplotlib
    except ImportError:
        raise UsageError(
            'plots need matplotlib, which is not installed: pip install "rlstore[plot]"'
        ) from None
    matplotlib.use("Agg")  # no display
    import matplotlib.pyplot as plt

    return plt


def _draw(plt: Any, table: dict, counts: dict, tag: str, png: str) -> None:
    envs = sorted({env for env, _ in table})
    cols = min(3, len(envs))
    rows = -(-len(envs) // cols)
    fig, axes = plt.subplots(rows, cols, figsize=(5 * cols, 3.6 * rows), squeeze=False)
    for ax, env in zip(axes.flat, envs, strict=False):
        for (group_env, name), (grid, mean, std) in table.items():
            if group_env != env:
                continue
            (line,) = ax.plot(grid, mean, label=f"{name} ({counts[group_env, name]} runs)")
            ax.fill_between(grid, mean - std, mean + std, color=line.get_color(), alpha=0.2)
        ax.set_title(env)
        ax.set_xlabel("env steps")
        ax.set_ylabel(tag.rsplit("/", 1)[-1])
        ax.grid(alpha=0.3)
        ax.legend(fontsize=8)
    for ax in list(axes.flat)[len(envs) :]:
        ax.axis("off")
    fig.tight_layout()
    fig.savefig(png, dpi=100)
    plt.close(fig)
