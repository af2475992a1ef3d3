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

Here: the command (scheduling the runs, `--status`, writing the results' files); the
suite file is read in rlstore/suite_file.py, scored in rlstore/suite_results.py.
"""

from __future__ import annotations

import contextlib
import json
import time
from collections.abc import Sequence
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

from rlstore.errors import UsageError
from rlstore.executor import LocalExecutor, RayExecutor, RunSpec, check_workers, read_summary
from rlstore.locks import DirectoryLock, holder
from rlstore.machine import available_cores
from rlstore.suite_file import Row, Suite, find_suite, load_suite, preflight
from rlstore.suite_results import made_where, results_markdown, row_result, run_result
from rlstore.text import plural

# (a row's reach_window sets another count, e.g. 100 for "the mean of the last 100 reaches")


# -- results ----------------------------------------------------------------------------------


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
    seconds: float  # the wall seconds its `done` steps took (0: not begun or not timed)


def core_hours_left(runs: Sequence[RunProgress]) -> tuple[float, list[str]]:
    """Hours of one core the runs still need, each at its row's steps/s so far (or, in a
    row with none begun, its algorithm's in other rows), and the rows ("row on env") that no
    begun run can time. The steps/s pools the begun runs' steps over their seconds: an
    off-policy run still in its random-action warm-up (hundreds of steps/s, seconds long)
    then weighs by its seconds, not as one rate beside a learning run's."""
    timed: dict[tuple, list[float]] = {}  # key -> [steps, seconds]
    for run in runs:
        if run.done and run.seconds > 0:
            for key in ((run.row, run.env), (run.algo,)):
                pooled = timed.setdefault(key, [0.0, 0.0])
                pooled[0] += run.done
                pooled[1] += run.seconds
    seconds, unknown = 0.0, []
    for run in runs:
        if run.done >= run.steps:
            continue
        pooled = timed.get((run.row, run.env)) or timed.get((run.algo,))
        if pooled:
            seconds += (run.steps - run.done) * pooled[1] / pooled[0]
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
    other_seeds: str | None = None,
) -> int:
    """`rlstore benchmark SUITE --status`: where each run stands (steps, score and steps to
    threshold so far, from a finished run's summary or a begun run's newest checkpoint) and
    the results of the rows whose every seed finished. Runs, writes and removes nothing."""
    suite, out_dir = _suite_and_out(suite_arg, out, envs, algos, seeds, other_seeds)
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
            steps, score, reached, seconds = 0, "-", "-", 0.0
            if summary is not None:
                result = run_result(
                    summary, suite.window, row.threshold, row.score, row.reach_window
                )
                runs.append((state, result))
                steps = result["steps"]
                digits = 3 if abs(result["score"]) < 10 else 1  # (as the results table)
                score = f"{result['score']:,.{digits}f}" if result["episodes"] else "-"
                if result["reached_at"] is not None:
                    reached = f"{result['reached_at']:,}"
                seconds = summary["wall_seconds"]  # (0 in format 1 checkpoints: no time)
            lines.append(
                f"| {row.name} | {row.env} | {spec.seed} | {word} | {steps:,} of "
                f"{row.steps:,} | {score} | {band} | {reached} |"
            )
            progress.append(RunProgress(row.name, row.env, row.algo, row.steps, steps, seconds))
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
    other_seeds: str | None = None,
) -> tuple[Suite, Path]:
    """The suite, or the part of it that `envs`, `algos` and `seeds` name (with
    `other_seeds`, --seeds: on those seeds instead of its own), and its output directory."""
    suite = suite_part(load_suite(find_suite(suite_arg)), envs, algos, seeds)
    if other_seeds is not None:
        suite = on_seeds(suite, parse_seeds(other_seeds))
    return suite, Path(out or Path("benchmarks") / suite.name).resolve()


def parse_seeds(text: str) -> list[int]:
    """--seeds: "4-10", "4,7,9" or "1-3,8" as the seeds in order, or a UsageError."""
    seeds: list[int] = []
    for part in text.replace(" ", "").split(","):
        first, dash, last = part.partition("-")
        if not (first.isdigit() and (not dash or last.isdigit())):
            raise UsageError(f"--seeds takes seeds as 4-10 or 4,7,9, got '{text}'")
        low, high = int(first), int(last) if dash else int(first)
        if high < low:
            raise UsageError(f"--seeds {text}: {part} counts down; write {high}-{low}")
        seeds += [seed for seed in range(low, high + 1) if seed not in seeds]
    return seeds


def on_seeds(suite: Suite, seeds: list[int]) -> Suite:
    """The suite on `seeds` instead of each row's own (a row's `need` scaled to as large a
    share of them), named for its results files: results-seeds-4-10.md."""
    rows = [
        replace(row, seeds=seeds, need=row.need and -(-row.need * len(seeds) // len(row.seeds)))
        for row in suite.rows
    ]
    return replace(suite, rows=rows, seeds_label=seeds_label(seeds))


def seeds_label(seeds: Sequence[int]) -> str:
    """ "4-10" for 4, 5, ..., 10; "1-3,8" for 1, 2, 3, 8."""
    parts, start = [], 0
    for i in range(1, len(seeds) + 1):
        if i == len(seeds) or seeds[i] != seeds[i - 1] + 1:
            first, last = seeds[start], seeds[i - 1]
            parts.append(str(first) if first == last else f"{first}-{last}")
            start = i
    return ",".join(parts)


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
    other_seeds: str | None = None,
) -> int:
    """Run the suite (or the part --env, --algo and --seed name; with `other_seeds`, its
    rows on those seeds), then write its results (results.md, or results-seeds-4-10.md)."""
    check_workers(workers)
    if gpus_per_run and address is None:
        raise UsageError(
            "--gpus-per-run needs --address: on this machine every run sees its GPUs already"
        )
    suite, out_dir = _suite_and_out(suite_arg, out, envs, algos, seeds, other_seeds)
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
    # the suite's own seeds: results.md, aggregates and curves; other seeds (--seeds 4-10):
    # results-seeds-4-10.md beside it, the rows' own numbers only
    name = "results" + (f"-seeds-{suite.seeds_label}" if suite.seeds_label else "")
    aggregated = "" if suite.seeds_label else _aggregate(out_dir, suite.name, rows, plot)
    if aggregated:
        text += "\n" + aggregated.replace(
            f"# Aggregate metrics: {suite.name}", "## Aggregate metrics"
        )
    (out_dir / f"{name}.md").write_text(text)
    record = {"suite": suite.name, "seeds": suite.seeds_label or None, "rows": rows}
    (out_dir / f"{name}.json").write_text(json.dumps(record, indent=1))
    print(text, end="")
    if plot and not suite.seeds_label:
        _plot_suite(out_dir, suite.rows)
    print(f"rlstore benchmark: results in {out_dir}/{name}.md and {name}.json")
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
