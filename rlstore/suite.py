"""`rlstore benchmark SUITE`: every run of a suite, its results table and its curves.

A suite is a TOML file (configs/suites/ has the shipped ones; docs/guides/many-runs.md the
format): rows of algorithm x env x seeds x budget, optional config overrides, and per row
an optional reference band of the score with its source (and the package versions it was
scored under). The runs go to OUT/runs as ordinary run directories, at most `workers` at a
time; a second start skips the finished runs and resumes the interrupted ones. The score of
a run is the mean of its last `window` (100) training episode returns, as CleanRL's tables
score, or with `score = "evaluation"` the mean return of its final evaluation (the final
policy, deterministic, over `eval_episodes` episodes), as RL Zoo's tables score; a row's is
the mean +- std over its seeds. The exit status is 1 when a row falls below its band. With
rliable installed (rlstore[rliable]), the rows' scores are also aggregated across envs
(rlstore/aggregate.py: a section of results.md, aggregate.json, aggregate.png).
"""

from __future__ import annotations

import contextlib
import difflib
import json
import operator
import platform
import re
import subprocess
import time
import warnings
from collections.abc import Sequence
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

import numpy as np

from rlstore import algos
from rlstore.config import validate
from rlstore.errors import UsageError
from rlstore.executor import (
    LocalExecutor,
    RayExecutor,
    RunSpec,
    available_cores,
    check_workers,
    read_summary,
)
from rlstore.locks import DirectoryLock, holder
from rlstore.presets import PRESET_DIR, tomllib
from rlstore.text import plural

SUITE_KEYS = ("name", "description", "seeds", "window", "score", "row")
ROW_KEYS = (
    "name",
    "algo",
    "env",
    "steps",
    "seeds",
    "overrides",
    "threshold",
    "need",
    "band",
    "source",
    "score",
    "normalize",
    "reach_window",
    "requires",
)
SCORES = ("training", "evaluation", "success")
REACH_WINDOW = 20  # "steps to threshold": where the mean of the last 20 returns first met it
# (a row's reach_window sets another count, e.g. 100 for "the mean of the last 100 reaches")


@dataclass
class Row:
    name: str
    algo: str
    env: str
    steps: int
    seeds: list[int]
    overrides: dict[str, Any] = field(default_factory=dict)
    threshold: float | None = None
    need: int | None = None  # seeds that must reach the threshold
    band: tuple[float, float] | None = None
    source: str | None = None
    # or "evaluation": the final evaluation's mean return; "success": its success rate
    score: str = "training"
    normalize: tuple[float, float] | None = None  # scores mapped to [0, 1] for aggregates
    reach_window: int = REACH_WINDOW  # returns averaged for "steps to threshold"
    # package -> the versions its band was scored under ({"mujoco": "<3.5"}): runs on other
    # versions are scored all the same, and their verdict says so
    requires: dict[str, str] = field(default_factory=dict)

    def specs(self, out: Path) -> list[RunSpec]:
        overrides = {**self.overrides, "total_timesteps": self.steps}
        if self.score != "training":  # at least the final evaluation
            overrides.setdefault("eval_every", self.steps)
        return [
            RunSpec(
                self.algo,
                self.env,
                seed,
                self.name,
                str(out / "runs"),
                overrides,
                str(out / "logs" / f"{self.name}__{self.env.replace('/', '_')}__{seed}.log"),
            )
            for seed in self.seeds
        ]


@dataclass
class Suite:
    name: str
    rows: list[Row]
    window: int = 100
    description: str = ""


def find_suite(value: str) -> Path:
    """A suite file, or the name of a shipped one (`classic` is configs/suites/classic.toml)."""
    path = Path(value)
    if path.is_file() or "/" in value or path.suffix == ".toml":
        if not path.is_file():
            raise UsageError(f"suite file '{value}' does not exist")
        return path
    shipped = PRESET_DIR / "suites" / f"{value}.toml"
    if not shipped.is_file():
        names = ", ".join(sorted(p.stem for p in shipped.parent.glob("*.toml")))
        raise UsageError(f"'{value}' is neither a suite file nor a shipped suite ({names})")
    return shipped


def load_suite(path: Path) -> Suite:
    """Read and check a suite file: unknown keys and wrong types are UsageErrors."""
    where = str(path)
    try:
        data = tomllib.loads(path.read_text())
    except (tomllib.TOMLDecodeError, UnicodeDecodeError) as e:
        raise UsageError(f"suite '{where}' is not valid TOML: {e}") from None
    _known(data, SUITE_KEYS, where)
    seeds = _seeds(data.get("seeds", [1, 2, 3]), where)
    window = data.get("window", 100)
    if not isinstance(window, int) or window < 1:
        raise UsageError(f"{where}: window must be a whole number >= 1 (got {window!r})")
    suite_score = _score(data.get("score", "training"), where)
    rows = []
    for i, raw in enumerate(data.get("row", [])):
        at = f"{where}, row {i + 1}"
        if not isinstance(raw, dict):
            raise UsageError(f"{at}: write rows as [[row]] tables")
        _known(raw, ROW_KEYS, at)
        for key in ("algo", "env", "steps"):
            if key not in raw:
                raise UsageError(f"{at}: '{key}' is missing")
        if not isinstance(raw["steps"], int) or raw["steps"] < 1:
            raise UsageError(f"{at}: steps must be a whole number >= 1 (got {raw['steps']!r})")
        band = raw.get("band")
        if band is not None and not (
            isinstance(band, list) and len(band) == 2 and all(_number(b) for b in band)
        ):
            raise UsageError(f"{at}: band must be [low, high] (got {band!r})")
        if not _number(raw.get("threshold", 0)):
            raise UsageError(f"{at}: threshold must be a number")
        need = raw.get("need")
        if need is not None and not (
            "threshold" in raw and type(need) is int and 1 <= need <= len(raw.get("seeds", seeds))
        ):
            raise UsageError(f"{at}: need is a number of seeds, with a threshold to reach")
        if not isinstance(raw.get("overrides", {}), dict):
            raise UsageError(f"{at}: overrides must be a table of config fields")
        normalize = raw.get("normalize")
        if normalize is not None and not (
            isinstance(normalize, list)
            and len(normalize) == 2
            and all(_number(b) for b in normalize)
            and normalize[0] < normalize[1]
        ):
            raise UsageError(f"{at}: normalize must be [min, max] scores, min < max")
        reach_window = raw.get("reach_window", REACH_WINDOW)
        if not (type(reach_window) is int and reach_window >= 1) or (
            "reach_window" in raw and "threshold" not in raw
        ):
            raise UsageError(f"{at}: reach_window is a number of returns >= 1, with a threshold")
        requires = raw.get("requires", {})
        if not (
            isinstance(requires, dict)
            and all(isinstance(spec, str) and _version_clauses(spec) for spec in requires.values())
        ):
            raise UsageError(
                f'{at}: requires maps packages to versions, e.g. {{ mujoco = "<3.5" }} '
                f"(got {requires!r})"
            )
        rows.append(
            Row(
                name=str(raw.get("name", raw["algo"])),
                algo=raw["algo"],
                env=raw["env"],
                steps=raw["steps"],
                seeds=_seeds(raw.get("seeds", seeds), at),
                overrides=raw.get("overrides", {}),
                threshold=raw.get("threshold"),
                need=need,
                band=tuple(band) if band else None,
                source=raw.get("source"),
                score=_score(raw.get("score", suite_score), at),
                normalize=tuple(normalize) if normalize else None,
                reach_window=reach_window,
                requires=requires,
            )
        )
    if not rows:
        raise UsageError(f"{where} has no [[row]]; see docs/guides/many-runs.md for the format")
    seen = set()
    for row in rows:
        if (row.name, row.env) in seen:
            raise UsageError(f"{where}: two rows are {row.name} on {row.env}; give each a name")
        seen.add((row.name, row.env))
    return Suite(str(data.get("name", path.stem)), rows, window, str(data.get("description", "")))


def _known(table: dict, keys: tuple[str, ...], where: str) -> None:
    for key in table:
        if key not in keys:
            close = difflib.get_close_matches(key, keys, n=1)
            hint = f" (did you mean '{close[0]}'?)" if close else f"; known: {', '.join(keys)}"
            raise UsageError(f"{where}: unknown key '{key}'{hint}")


def _score(value: Any, where: str) -> str:
    if value not in SCORES:
        raise UsageError(f"{where}: score must be one of {', '.join(SCORES)} (got {value!r})")
    return value


def _number(value: Any) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool)


def _seeds(value: Any, where: str) -> list[int]:
    if not (isinstance(value, list) and value and all(isinstance(s, int) for s in value)):
        raise UsageError(f"{where}: seeds must be a non-empty list of whole numbers")
    return value


VERSION_CLAUSE = re.compile(r"\s*(<=|>=|==|!=|<|>)\s*(\d+(?:\.\d+)*)\s*")
COMPARISONS = {
    "<": operator.lt,
    "<=": operator.le,
    ">": operator.gt,
    ">=": operator.ge,
    "==": operator.eq,
    "!=": operator.ne,
}


def _release(version: str) -> tuple[int, ...]:
    """The numeric release of a version string ("2.4.0+cu121" -> (2, 4, 0))."""
    found = re.match(r"\d+(?:\.\d+)*", version)
    return tuple(int(part) for part in found.group().split(".")) if found else ()


def _version_clauses(spec: str) -> list[tuple[str, tuple[int, ...]]] | None:
    """`"<3.5"`, `">=2.3, <3.5"`: [(operator, release), ...], or None if not of that form."""
    clauses = []
    for clause in spec.split(","):
        found = VERSION_CLAUSE.fullmatch(clause)
        if found is None:
            return None
        clauses.append((found.group(1), _release(found.group(2))))
    return clauses


def version_satisfies(version: str, spec: str) -> bool:
    """Whether `version` meets every clause of `spec`, comparing numeric releases padded
    with zeros (3.4.0 < 3.5 == 3.5.0)."""
    have = _release(version)
    for sign, wanted in _version_clauses(spec) or []:
        width = max(len(have), len(wanted))
        padded = have + (0,) * (width - len(have)), wanted + (0,) * (width - len(wanted))
        if not COMPARISONS[sign](*padded):
            return False
    return True


def preflight(rows: list[Row]) -> None:
    """Everything that can fail before a run starts: configs, env ids and extras, whether
    the algorithm fits the env's spaces."""
    from rlstore.custom_envs import parse_env_kwargs
    from rlstore.envs import check_atari_options, make_vec_env

    for row in rows:
        cfg, _ = row.specs(Path("."))[0].config()
        validate(cfg)
        check_atari_options(cfg)
        with warnings.catch_warnings():  # (an env's deprecation notes go to its runs' logs)
            warnings.simplefilter("ignore")
            make_vec_env(
                row.env,
                1,
                0,
                "sync",
                algorithm=algos.get(row.algo),
                env_kwargs=parse_env_kwargs(cfg.env_kwargs),
                wrappers=cfg.wrapper,
                drop_obs_keys=cfg.drop_obs_keys,
            ).close()


# -- results ----------------------------------------------------------------------------------


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


def row_result(row: Row, runs: list[dict]) -> dict:
    scores = [r["score"] for r in runs]
    mean, std = float(np.mean(scores)), float(np.std(scores))
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
        "band": list(row.band) if row.band else None,
        "source": row.source,
        "score": row.score,
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
    """A row's score as the results table gives it: success rates with two decimals."""
    if row["score"] == "success":
        return f"{row['score_mean']:.2f} +- {row['score_std']:.2f} (success)"
    mark = " (eval)" if row["score"] == "evaluation" else ""
    return f"{row['score_mean']:.1f} +- {row['score_std']:.1f}{mark}"


def results_markdown(suite: Suite, rows: list[dict], made: str = "") -> str:
    lines = [
        f"# Benchmark: {suite.name}",
        "",
        *([f"Made by `rlstore benchmark {suite.name}` with {made}.", ""] if made else []),
        f"Score: per seed, the mean of the last {suite.window} training episode returns"
        + (
            " (rows marked (eval): the mean return of the final evaluation, the final policy "
            "played deterministically as `rlstore eval` plays it, as RL Zoo's tables score)"
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
        "| row | env | steps | seeds | score | reference band | steps to threshold "
        "| wall s/run | steps/s | verdict |",
        "|---|---|---|---|---|---|---|---|---|---|",
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
        lines.append(
            f"| {r['name']} | {r['env']} | {r['steps']:,} | {len(r['seeds'])} | "
            f"{score_text(r)} | {band} | {to} | "
            f"{r['wall_seconds']:.1f} | {r['steps_per_second']:,.0f} | {verdict} |"
        )
    sources = [f"- {r['name']} on {r['env']}: {r['source']}" for r in rows if r["source"]]
    if sources:
        lines += ["", "Reference bands:", "", *sources]
    return "\n".join(lines) + "\n"


# -- the command ------------------------------------------------------------------------------


def run_order(rows: Sequence[Row], out_dir: Path) -> list[RunSpec]:
    """Every run of the rows, in the order they start: every row's first seed, then every
    row's second, and so on. A suite stopped partway (hours-long rows on a small machine)
    has then seen every row, not some rows' every seed."""
    per_row = [row.specs(out_dir) for row in rows]
    return [
        specs[i]
        for i in range(max(map(len, per_row), default=0))
        for specs in per_row
        if i < len(specs)
    ]


def still_to_run(specs: Sequence[RunSpec], states: Sequence[str]) -> list[RunSpec]:
    """The runs not done, those begun first (interrupted, or finished short of the steps
    asked now), then the new, each in `specs`' order: a suite resumed finishes the hours
    its runs have already spent before it starts others."""
    begun = [
        spec
        for spec, state in zip(specs, states, strict=True)
        if state in ("interrupted", "extend")
    ]
    new = [spec for spec, state in zip(specs, states, strict=True) if state == "new"]
    return begun + new


@dataclass
class RunProgress:
    """One run of a suite as --status found it."""

    row: str
    env: str
    algo: str
    steps: int  # asked
    done: int
    steps_per_second: float | None  # its own, so far (None: not begun)


def core_hours_left(runs: Sequence[RunProgress]) -> tuple[float, list[str]]:
    """Hours of one core the runs still need, each at its row's mean steps/s so far (or, in
    a row with none begun, its algorithm's in other rows), and the rows ("row on env") that
    no begun run can time."""
    timed: dict[tuple, list[float]] = {}
    for run in runs:
        if run.steps_per_second:
            timed.setdefault((run.row, run.env), []).append(run.steps_per_second)
            timed.setdefault((run.algo,), []).append(run.steps_per_second)
    seconds, unknown = 0.0, []
    for run in runs:
        if run.done >= run.steps:
            continue
        speeds = timed.get((run.row, run.env)) or timed.get((run.algo,))
        if speeds:
            seconds += (run.steps - run.done) / float(np.mean(speeds))
        elif f"{run.row} on {run.env}" not in unknown:
            unknown.append(f"{run.row} on {run.env}")
    return seconds / 3600, unknown


def last_written(run_dir: Path) -> float:
    """When a file of the run directory was last written (a running run may be renaming
    its newest checkpoint into place meanwhile)."""
    times = [run_dir.stat().st_mtime]
    for path in run_dir.rglob("*"):
        with contextlib.suppress(OSError):
            times.append(path.stat().st_mtime)
    return max(times)


def ago(seconds: float) -> str:
    """A duration as people say it: '40 s', '12 min', '5 h', '3 days'."""
    for limit, unit, size in [(120, "s", 1), (7200, "min", 60), (172800, "h", 3600)]:
        if seconds < limit:
            return f"{max(seconds, 0) / size:.0f} {unit}"
    return f"{seconds / 86400:.0f} days"


def status(
    suite_arg: str,
    out: str | None = None,
    envs: Sequence[str] = (),
    algos: Sequence[str] = (),
    seeds: Sequence[int] = (),
) -> int:
    """`rlstore benchmark SUITE --status`: where each run stands (steps, score and steps to
    threshold so far, from a finished run's summary or a begun run's newest checkpoint) and
    the results of the rows whose every seed finished. Runs, writes and removes nothing."""
    suite, out_dir = _suite_and_out(suite_arg, out, envs, algos, seeds)
    lines = [
        "| row | env | seed | state | steps | score so far | reference band | steps to threshold |",
        "|---|---|---|---|---|---|---|---|",
    ]
    counts = dict.fromkeys(["done", "begun", "started", "new"], 0)
    finished_rows, progress = [], []
    for row in suite.rows:
        runs = []
        band = f"[{row.band[0]:g}, {row.band[1]:g}]" if row.band else "-"
        for spec in row.specs(out_dir):
            state, summary, run_dir = spec.progress()
            counts[state] += 1
            word = {
                "done": "finished",
                "begun": "begun",
                "started": "no checkpoint yet",
                "new": "not started",
            }[state]
            if state in ("begun", "started"):  # is it going on?
                written = f"written {ago(time.time() - last_written(run_dir))} ago"
                word += f", running ({written})" if holder(run_dir) else f", stopped ({written})"
            steps, score, reached, speed = 0, "-", "-", None
            if summary is not None:
                result = run_result(
                    summary, suite.window, row.threshold, row.score, row.reach_window
                )
                runs.append((state, result))
                steps = result["steps"]
                score = f"{result['score']:,.1f}" if result["episodes"] else "-"
                if result["reached_at"] is not None:
                    reached = f"{result['reached_at']:,}"
                if steps and summary["wall_seconds"] > 0:  # (format 1 checkpoints: no time)
                    speed = result["steps_per_second"]
            lines.append(
                f"| {row.name} | {row.env} | {spec.seed} | {word} | {steps:,} of "
                f"{row.steps:,} | {score} | {band} | {reached} |"
            )
            progress.append(RunProgress(row.name, row.env, row.algo, row.steps, steps, speed))
        if len(runs) == len(row.seeds) and all(state == "done" for state, _ in runs):
            finished_rows.append(row_result(row, [result for _, result in runs]))
    suite_pid = holder(out_dir)
    print(
        f"rlstore benchmark {suite.name} --status: {plural(sum(counts.values()), 'run')} in "
        f"{out_dir}: {counts['done']} finished, {counts['begun']} begun, "
        f"{counts['started']} without a checkpoint yet, {counts['new']} not started "
        "(nothing was run or changed); "
        + (f"the suite is running (pid {suite_pid})" if suite_pid else "no suite runs it now")
    )
    print(
        f"Score so far: the mean of the last {suite.window} training returns (rows scored "
        "on evaluation: the newest evaluation); steps: the newest checkpoint's.\n"
    )
    print("\n".join(lines))
    hours, unknown = core_hours_left(progress)
    if hours or unknown:
        cores = available_cores()
        left = (
            f"\nLeft: about {hours:,.1f} core-hours of runs (each at its row's steps/s so "
            f"far, or its algorithm's), {hours / cores:,.1f} hours on this machine's "
            f"{plural(cores, 'core')}"
        )
        if unknown:
            left += "; not counted, with no run begun to time: " + ", ".join(unknown)
        print(left)
    if finished_rows:
        table = results_markdown(suite, finished_rows).split("\n", 2)[2]  # (no title)
        print("\nRows with every seed finished:\n\n" + table, end="")
    else:
        print("\nNo row has every seed finished yet.")
    return 0


def _suite_and_out(
    suite_arg: str,
    out: str | None,
    envs: Sequence[str] = (),
    algos: Sequence[str] = (),
    seeds: Sequence[int] = (),
) -> tuple[Suite, Path]:
    """The suite, or the part of it that `envs`, `algos` and `seeds` name, and its output
    directory."""
    suite = suite_part(load_suite(find_suite(suite_arg)), envs, algos, seeds)
    return suite, Path(out or Path("benchmarks") / suite.name).resolve()


def suite_part(
    suite: Suite, envs: Sequence[str] = (), algos: Sequence[str] = (), seeds: Sequence[int] = ()
) -> Suite:
    """The part of `suite` that --env, --algo and --seed name (each, when given: only the
    rows on these envs, of these algorithms, and of each row these seeds). A part's runs are
    the whole suite's, which reads them back."""
    flags = [
        ("--env", envs, lambda row: [row.env]),
        ("--algo", algos, lambda row: [row.algo]),
        ("--seed", seeds, lambda row: row.seeds),
    ]
    for flag, given, of_row in flags:
        known = list(dict.fromkeys(value for row in suite.rows for value in of_row(row)))
        for value in given:
            if value not in known:
                raise UsageError(
                    f"suite {suite.name} has no row with {flag} {value}; its "
                    f"{flag[2:]}s: " + ", ".join(map(str, known))
                )
    rows = [
        row
        for row in suite.rows
        if (not envs or row.env in envs) and (not algos or row.algo in algos)
    ]
    if seeds:  # each row's seeds among them; a row's `need` is at most the seeds it keeps
        kept = [(row, [seed for seed in row.seeds if seed in seeds]) for row in rows]
        rows = [
            replace(row, seeds=ours, need=row.need and min(row.need, len(ours)))
            for row, ours in kept
            if ours
        ]
    if not rows:
        named = [f"{flag} {' '.join(map(str, given))}" for flag, given, _ in flags if given]
        raise UsageError(f"suite {suite.name} has no row with all of {' '.join(named)}")
    return replace(suite, rows=rows)


def benchmark(
    suite_arg: str,
    out: str | None = None,
    workers: int | None = None,
    address: str | None = None,
    gpus_per_run: float = 0.0,
    plot: bool = True,
    envs: Sequence[str] = (),
    algos: Sequence[str] = (),
    seeds: Sequence[int] = (),
) -> int:
    check_workers(workers)
    if gpus_per_run and address is None:
        raise UsageError(
            "--gpus-per-run needs --address: on this machine every run sees its GPUs already"
        )
    suite, out_dir = _suite_and_out(suite_arg, out, envs, algos, seeds)
    preflight(suite.rows)
    if address is None:
        executor = LocalExecutor(workers)
    else:
        executor = RayExecutor(address, workers, gpus_per_run)
    (out_dir / "logs").mkdir(parents=True, exist_ok=True)
    lock = DirectoryLock(out_dir)  # (before any run's state is read: reading may remove)
    pid = lock.acquire()
    if pid is not None:
        raise UsageError(
            f"another rlstore benchmark runs in {out_dir} now (pid {pid}); wait for it or "
            "stop it first (`--status` shows where it stands)"
        )
    try:
        return _run_suite(suite, out_dir, executor, address, plot)
    finally:
        lock.release()


def _run_suite(suite: Suite, out_dir: Path, executor: Any, address: str | None, plot: bool) -> int:
    """benchmark() once it holds the suite's lock."""
    specs = run_order(suite.rows, out_dir)
    states = [spec.state()[0] for spec in specs]
    todo = still_to_run(specs, states)
    where = f"Ray at {address}" if address else plural(executor.workers, "worker")
    print(
        f"rlstore benchmark {suite.name}: {plural(len(specs), 'run')} in {out_dir}: "
        f"{states.count('done')} finished, {states.count('interrupted')} to resume, "
        + (f"{states.count('extend')} to extend, " if "extend" in states else "")
        + f"{states.count('new')} to start; {where}",
        flush=True,
    )
    failed: list[RunSpec] = []
    start = time.perf_counter()

    ended: list[RunSpec] = []

    def on_done(spec: RunSpec, status: int) -> None:
        ended.append(spec)
        word = {0: "finished", 130: "interrupted", 143: "interrupted"}.get(status, "FAILED")
        print(
            f"  [{len(ended)}/{len(todo)}] {spec.label}: {word} "
            f"({time.perf_counter() - start:.0f} s)",
            flush=True,
        )
        if word == "FAILED":
            failed.append(spec)

    stopped = executor.run(todo, on_done)
    if stopped is not None:
        print("rlstore benchmark: interrupted; run the same command again to continue")
        return 128 + stopped
    if failed:
        for spec in failed:
            print(f"rlstore benchmark: {spec.label} failed; its output: {spec.log_file}")
        return 1
    rows = []
    for row in suite.rows:
        runs = []
        for spec in row.specs(out_dir):
            status, run_dir = spec.state()
            if status != "done":  # it finished somewhere this machine does not see
                raise UsageError(
                    f"{spec.label} finished, but not in {out_dir}: with --address, --out "
                    "must be on storage that every node of the cluster mounts"
                )
            summary = read_summary(run_dir)
            runs.append(
                run_result(summary, suite.window, row.threshold, row.score, row.reach_window)
            )
        rows.append(row_result(row, runs))
    text = results_markdown(suite, rows, made_where())
    aggregated = _aggregate(out_dir, suite.name, rows, plot)
    if aggregated:
        text += "\n" + aggregated.replace(
            f"# Aggregate metrics: {suite.name}", "## Aggregate metrics"
        )
    (out_dir / "results.md").write_text(text)
    (out_dir / "results.json").write_text(json.dumps({"suite": suite.name, "rows": rows}, indent=1))
    print(text, end="")
    if plot:
        _plot_suite(out_dir, suite.rows)
    print(f"rlstore benchmark: results in {out_dir}/results.md and results.json")
    return 1 if any(r["below_band"] or r["too_few_reached"] for r in rows) else 0


def _aggregate(out_dir: Path, name: str, rows: list[dict], draw: bool) -> str:
    """rliable's aggregates of the rows (rlstore.aggregate), to aggregate.json and, with
    `draw`, aggregate.png; their markdown, or "" (said why) without rliable or ranges."""
    import importlib.util

    from rlstore import aggregate

    if importlib.util.find_spec("rliable") is None:
        print("rlstore benchmark: no aggregate metrics: they need rlstore[rliable]")
        return ""
    usable = [r for r in rows if r.get("normalize") or r.get("band")]
    if not usable:
        return ""
    if not aggregate.normalized_scores(usable)[0]:  # (the spaces suite: each row its own env)
        print("rlstore benchmark: no aggregate metrics: no algorithm has a score on every env")
        return ""
    result = aggregate.aggregate(rows)
    (out_dir / "aggregate.json").write_text(json.dumps(result, indent=1))
    if draw:
        try:
            aggregate.draw(result, out_dir / "aggregate.png")
        except UsageError as e:
            print(f"rlstore benchmark: no aggregate plot: {e}")
    return aggregate.aggregate_markdown(result, name)


def _plot_suite(out_dir: Path, rows: list[Row]) -> None:
    """curves.png: each row's mean +- std over seeds, with its reference band and threshold."""
    from rlstore.plot import Reference, plot

    references = {(row.env, row.name): Reference(row.band, row.threshold) for row in rows}
    try:
        plot([str(out_dir / "runs")], png=str(out_dir / "curves.png"), references=references)
    except UsageError as e:  # matplotlib missing, or runs without event files
        print(f"rlstore benchmark: no curves: {e}")
