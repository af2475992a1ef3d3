"""`rlstore plot RUN_DIR_OR_GLOB...`: learning curves, mean and std across seeds.

Reads a scalar tag (charts/episodic_return by default) from the runs' TensorBoard event
files (the training episodes' tags, where those are missing, from summary.json) and groups
the runs that are seeds of one experiment: the same algorithm, env, run name and resolved
config apart from the seed (runs of other budgets or settings are other groups, labelled by
what differs). It smooths each run with a trailing moving average of `smooth` points, puts
every run of a group on one grid of env steps (`points` steps, evenly spaced over the range
all of the group's runs cover, by linear interpolation; a group whose runs end at different
steps is cut where the shortest ends, and says so), and draws the mean with a band of +- one
population std over seeds. Headless: matplotlib's Agg backend, no display needed.
"""

from __future__ import annotations

import csv
import glob
import json
import warnings
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from rlstore.config import check_writable_dir
from rlstore.errors import UsageError
from rlstore.text import plural

Curve = tuple[np.ndarray, np.ndarray]  # steps, values

# config.json entries that do not make runs different experiments: the seed, bookkeeping,
# and where or how fast a run ran.
NOT_COMPARED = (
    "seed",
    "preset",
    "resolved",
    "logdir",
    "progress",
    "config",
    "device",
    "torch_threads",
    "track_tensorboard",
    "checkpoint_every",
    "keep_checkpoints",
    "capture_video",
    "video_every",
    "track",
    "wandb_project",
    "wandb_entity",
)
DEFAULT_SMOOTH = 10  # points of training returns; evaluation curves (eval/...) are not smoothed


def default_smooth(tag: str) -> int:
    """The smoothing window for `tag`: none for evaluations (each point is already a mean
    over episodes, and there are few), DEFAULT_SMOOTH for the rest."""
    return 1 if tag.startswith("eval/") else DEFAULT_SMOOTH


@dataclass
class Group:
    """The runs of one experiment (seeds of the same config) and their curves."""

    env: str
    name: str
    settings: dict[str, Any]  # the resolved config, less NOT_COMPARED
    runs: list[Path] = field(default_factory=list)
    seeds: list[Any] = field(default_factory=list)
    curves: list[Curve] = field(default_factory=list)
    label: str = ""  # the name, plus what tells it from other groups of its env and name


@dataclass
class Reference:
    """A suite row's reference band and threshold, drawn behind its curve."""

    band: tuple[float, float] | None = None
    threshold: float | None = None


def find_runs(patterns: list[str]) -> list[Path]:
    """Run directories (those with config.json) named by, or inside, the given paths/globs."""
    if not patterns:
        raise UsageError(
            "give run directories, folders holding runs, or globs: rlstore plot runs/ "
            "(or rlstore plot 'runs/CartPole-v1__ppo__*')"
        )
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


# tags whose points a finished run's summary.json also holds: its key under "episodes"
SUMMARY_TAGS = {"charts/episodic_return": "returns", "charts/episodic_length": "lengths"}


def read_scalars(run_dir: Path, tag: str) -> Curve | None:
    """(steps, values) of `tag` in the run's event files, or None when it has none. The
    training episodes' tags fall back on summary.json, which holds every episode at the step
    it was logged at: a run kept without its event files (as results/finished-runs
    keeps them) or trained with --no-track-tensorboard still draws."""
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    accumulator = EventAccumulator(str(run_dir), size_guidance={"scalars": 0})
    accumulator.Reload()
    if tag in accumulator.Tags().get("scalars", []):
        events = accumulator.Scalars(tag)
        return np.array([e.step for e in events], float), np.array([e.value for e in events], float)
    summary = run_dir / "summary.json"
    if tag in SUMMARY_TAGS and summary.is_file():
        episodes = json.loads(summary.read_text())["episodes"]
        return np.array(episodes["steps"], float), np.array(episodes[SUMMARY_TAGS[tag]], float)
    return None


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


def _defaults(algo: str) -> dict[str, Any]:
    """The config fields of `algo` at their defaults ({} for an algorithm not registered
    here)."""
    import dataclasses

    from rlstore import algos

    try:
        return json.loads(json.dumps(dataclasses.asdict(algos.get(algo).config())))
    except UsageError:
        return {}


def group_runs(runs: list[Path], tag: str, window: int) -> list[Group]:
    """The runs' smoothed curves, grouped by experiment, in a stable order."""
    groups: dict[str, Group] = {}
    missing = []
    for run in runs:
        curve = read_scalars(run, tag)
        if curve is None or len(curve[0]) == 0:
            missing.append(run.name)
            continue
        record = json.loads((run / "config.json").read_text())
        name = record.get("exp_name") or record["algo"]
        # a field newer than the run had its default's behaviour: runs made before and
        # after it was added are the same experiment
        settings = {
            k: v
            for k, v in {**_defaults(record["algo"]), **record}.items()
            if k not in NOT_COMPARED
        }
        key = json.dumps([record["env_id"], name, settings], sort_keys=True, default=str)
        group = groups.setdefault(key, Group(record["env_id"], name, settings))
        order = np.argsort(curve[0], kind="stable")
        group.runs.append(run)
        group.seeds.append(record.get("seed"))
        group.curves.append((curve[0][order], smooth(curve[1][order], window)))
    if not groups:
        raise UsageError(f"none of the {len(runs)} runs has the scalar tag '{tag}'; give --tag")
    if missing:
        names = ", ".join(missing[:3])
        warnings.warn(f"{plural(len(missing), 'run')} have no '{tag}': {names}", stacklevel=2)
    ordered = [groups[key] for key in sorted(groups)]
    _label(ordered)
    return ordered


def _label(groups: list[Group]) -> None:
    """Each group's label: its name, plus the settings that tell it from the other groups
    of the same env and name (at most three shown)."""
    for group in groups:
        others = [g for g in groups if (g.env, g.name) == (group.env, group.name)]
        keys = sorted({k for g in others for k in {*g.settings, *group.settings}})
        differ = [k for k in keys if len({json.dumps(g.settings.get(k)) for g in others}) > 1]
        shown = ", ".join(f"{k}={group.settings.get(k)}" for k in differ[:3])
        more = ", ..." if len(differ) > 3 else ""
        group.label = f"{group.name} ({shown}{more})" if differ else group.name


def describe(group: Group) -> str:
    """One line: what was grouped, and where the curve was cut if its runs differ in length."""
    seeds = ", ".join(str(s) for s in sorted(group.seeds, key=str))
    line = f"{group.env} {group.label}: {plural(len(group.runs), 'run')} (seeds {seeds})"
    ends = [steps[-1] for steps, _ in group.curves]
    if min(ends) < max(ends):
        line += (
            f"; cut at step {min(ends):,.0f}, where its shortest run ends (the longest "
            f"reaches {max(ends):,.0f})"
        )
    return line


def check_output_file(path: Path, flag: str) -> None:
    """A UsageError, before anything is read or drawn, unless `path` names a file that can
    be written (its directory is made when it is written)."""
    if path.is_dir():
        raise UsageError(f"{flag} {path} is a directory; give a file name in it")
    check_writable_dir(path.parent, flag)


def plot(
    paths: list[str],
    png: str | None = "curves.png",
    csv_path: str | None = None,
    tag: str = "charts/episodic_return",
    smooth_window: int | None = None,
    points: int = 200,
    references: dict[tuple[str, str], Reference] | None = None,
) -> list[Group]:
    """Draw the curves of the runs in `paths` to `png` and/or write them to `csv_path`;
    `references` maps (env, run name) to the band and threshold drawn behind its curve.
    Returns the groups (print `describe(group)` to say what was grouped). `smooth_window`
    defaults to default_smooth(tag)."""
    smooth_window = default_smooth(tag) if smooth_window is None else smooth_window
    if smooth_window < 1 or points < 2:
        raise UsageError("--smooth must be at least 1 and --points at least 2")
    for path, flag in [(png, "--out"), (csv_path, "--csv")]:
        if path:
            check_output_file(Path(path), flag)
    runs = find_runs(paths)
    plt = _pyplot() if png else None  # before anything is written
    groups = group_runs(runs, tag, smooth_window)
    table = [aggregate(group.curves, points) for group in groups]
    if csv_path:
        Path(csv_path).parent.mkdir(parents=True, exist_ok=True)
        with open(csv_path, "w", newline="") as f:
            writer = csv.writer(f)
            writer.writerow(["env", "name", "group", "runs", "step", "mean", "std"])
            for group, (grid, mean, std) in zip(groups, table, strict=True):
                for row in zip(grid, mean, std, strict=True):
                    writer.writerow(
                        [group.env, group.name, group.label, len(group.runs), *map(float, row)]
                    )
    if png:
        _draw(plt, groups, table, tag, smooth_window, png, references or {})
    return groups


def _pyplot() -> Any:
    try:
        import matplotlib
    except ImportError:
        raise UsageError(
            'plots need matplotlib, which is not installed: pip install "rlstore[plot]" '
            '(in a clone: pip install -e ".[plot]")'
        ) from None
    matplotlib.use("Agg")  # no display
    import matplotlib.pyplot as plt

    return plt


def steps_label(step: float, _: Any = None) -> str:
    """Axis ticks in env steps: 0, 500, 20k, 1.5M."""
    for unit, scale in (("M", 1e6), ("k", 1e3)):
        if abs(step) >= scale:
            return f"{step / scale:.4g}{unit}"
    return f"{step:.0f}"


def y_label(tag: str, smooth_window: int) -> str:
    what = {
        "charts/episodic_return": "episodic return",
        "charts/episodic_length": "episode length",
        "eval/mean_return": "evaluation return (mean over its episodes)",
        "eval/mean_length": "evaluation episode length (mean)",
        "charts/success_rate": "success rate of the training episodes",
        "eval/success_rate": "evaluation success rate",
    }.get(tag, tag)
    smoothed = f", smoothed over {smooth_window} points" if smooth_window > 1 else ""
    return f"{what}, mean over seeds{smoothed}"


def _draw(
    plt: Any,
    groups: list[Group],
    table: list,
    tag: str,
    smooth_window: int,
    png: str,
    references: dict[tuple[str, str], Reference],
) -> None:
    from matplotlib.ticker import FuncFormatter

    envs = sorted({group.env for group in groups})
    cols = min(3, len(envs))
    rows = -(-len(envs) // cols)
    fig, axes = plt.subplots(rows, cols, figsize=(5 * cols, 3.8 * rows), squeeze=False)
    for ax, env in zip(axes.flat, envs, strict=False):
        for group, (grid, mean, std) in zip(groups, table, strict=True):
            if group.env != env:
                continue
            label = f"{group.label}: {plural(len(group.runs), 'seed')}, band +- std"
            (line,) = ax.plot(grid, mean, label=label)
            color = line.get_color()
            ax.fill_between(grid, mean - std, mean + std, color=color, alpha=0.2)
            reference = references.get((env, group.name))
            if reference and reference.band:
                ax.axhspan(
                    *reference.band,
                    color=color,
                    alpha=0.08,
                    hatch="//",
                    lw=0,
                    label=f"{group.name}: reference band",
                )
            if reference and reference.threshold is not None:
                ax.axhline(
                    reference.threshold,
                    color=color,
                    ls="--",
                    lw=1,
                    label=f"{group.name}: threshold {reference.threshold:g}",
                )
        ax.set_title(env)
        ax.set_xlabel("env steps")
        ax.set_ylabel(y_label(tag, smooth_window), fontsize=8)
        ax.xaxis.set_major_formatter(FuncFormatter(steps_label))
        ax.grid(alpha=0.3)
        ax.legend(fontsize=7)
    for ax in list(axes.flat)[len(envs) :]:
        ax.axis("off")
    fig.tight_layout()
    Path(png).parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(png, dpi=100)
    plt.close(fig)
