"""`rlstore sweep SPEC`: hyperparameter search on Ray Tune, Optuna's TPE proposing trials.

A trial trains every seed of the spec with the trial's settings, one after another, each
an ordinary run directory (OUT/trials/<trial id>/...), and scores the mean over its seeds
of each run's mean return over its last 100 training episodes. For early stopping (ASHA)
the trial reports `reports` intermediate scores during its first seed (the mean of the
last 100 returns at evenly spaced steps), then its final score; bad trials stop after
their first seed's early reports. The spec format is in docs/guides/many-runs.md.

OUT/best.toml holds the best finished trial's settings: `rlstore train ALGO --config
OUT/best.toml --seed N` is that trial's run of seed N, exactly. Stopped and started again,
the sweep continues: Tune restores the search, finished runs are read back and interrupted
ones resume from their checkpoints.
"""

from __future__ import annotations

import difflib
import json
import math
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from rlstore import algos
from rlstore.config import validate
from rlstore.errors import UsageError
from rlstore.executor import RunSpec, check_gpu_share, check_workers, connect_ray
from rlstore.machine import available_cores
from rlstore.presets import tomllib
from rlstore.text import plural

SPEC_KEYS = (
    "algo",
    "env",
    "steps",
    "seeds",
    "trials",
    "reports",
    "early_stop",
    "search_seed",
    "base",
    "space",
)
DISTRIBUTIONS = ("uniform", "log_uniform", "int", "choice")
WINDOW = 100  # episodes in a run's score


@dataclass
class SweepSpec:
    algo: str
    env: str
    steps: int
    seeds: list[int]
    trials: int
    space: dict[str, dict[str, list]]
    base: dict[str, Any] = field(default_factory=dict)
    reports: int = 6
    early_stop: bool = True
    search_seed: int = 0


def load_spec(path: Path) -> SweepSpec:
    """Read and check a spec: unknown keys, a bad or empty space, and an algorithm/env pair
    or base settings that do not fit are UsageErrors."""
    if not path.is_file():
        problem = "is a directory" if path.is_dir() else "does not exist"
        raise UsageError(f"sweep spec '{path}' {problem}; give the path of a TOML file")
    try:
        data = tomllib.loads(path.read_text())
    except (tomllib.TOMLDecodeError, UnicodeDecodeError) as e:
        raise UsageError(f"sweep spec '{path}' is not valid TOML: {e}") from None
    for key in data:
        if key not in SPEC_KEYS:
            close = difflib.get_close_matches(key, SPEC_KEYS, n=1)
            hint = f" (did you mean '{close[0]}'?)" if close else f"; known: {', '.join(SPEC_KEYS)}"
            raise UsageError(f"{path}: unknown key '{key}'{hint}")
    for key in ("algo", "env", "steps", "trials"):
        if key not in data:
            raise UsageError(f"{path}: '{key}' is missing")
    space = data.get("space", {})
    if not isinstance(space, dict) or not space:
        raise UsageError(f"{path}: the search space is empty; add a [space] table of fields")
    for name, dist in space.items():
        _check_distribution(path, name, dist)
    spec = SweepSpec(
        algo=data["algo"],
        env=data["env"],
        steps=data["steps"],
        seeds=data.get("seeds", [1, 2, 3]),
        trials=data["trials"],
        space=space,
        base=data.get("base", {}),
        reports=data.get("reports", 6),
        early_stop=data.get("early_stop", True),
        search_seed=data.get("search_seed", 0),
    )
    for key in ("steps", "trials", "reports"):
        value = getattr(spec, key)
        if not isinstance(value, int) or isinstance(value, bool) or value < 1:
            raise UsageError(f"{path}: {key} must be a whole number >= 1 (got {value!r})")
    if not isinstance(spec.early_stop, bool):
        raise UsageError(f"{path}: early_stop must be true or false")
    if not (
        isinstance(spec.seeds, list) and spec.seeds and all(type(s) is int for s in spec.seeds)
    ):
        raise UsageError(f"{path}: seeds must be a non-empty list of whole numbers")
    if set(spec.base) & set(spec.space):
        raise UsageError(
            f"{path}: {', '.join(set(spec.base) & set(spec.space))} is in both "
            "base and space; keep it in one"
        )
    # Every field must exist and take its values: try the space's ends on top of base.
    for corner in (0, -1):
        params = {name: _values(dist)[corner] for name, dist in space.items()}
        try:
            validate(_run(spec, params, spec.seeds[0], Path(".")).config()[0])
        except UsageError as e:
            raise UsageError(f"{path}: {e}") from None
    from rlstore.envs import make_vec_env

    make_vec_env(
        spec.env, 1, 0, "sync", algorithm=algos.get(spec.algo)
    ).close()  # does the pair fit?
    return spec


def _check_distribution(path: Path, name: str, dist: Any) -> None:
    where = f"{path}: space.{name}"
    if not (isinstance(dist, dict) and len(dist) == 1 and next(iter(dist)) in DISTRIBUTIONS):
        raise UsageError(f"{where} must be one of {{ {' | '.join(DISTRIBUTIONS)} = [...] }}")
    kind, values = next(iter(dist.items()))
    if not isinstance(values, list) or not values:
        raise UsageError(f"{where}: give {kind} a list of values")
    if kind == "choice":
        if not all(isinstance(v, (bool, int, float, str)) for v in values):
            raise UsageError(f"{where}: choices must be numbers, booleans or strings")
        return
    numbers = all(isinstance(v, (int, float)) and not isinstance(v, bool) for v in values)
    if len(values) != 2 or not numbers or values[0] >= values[1]:
        raise UsageError(f"{where}: {kind} takes [low, high] with low < high")
    if kind == "int" and not all(isinstance(v, int) for v in values):
        raise UsageError(f"{where}: int takes whole numbers")
    if kind == "log_uniform" and values[0] <= 0:
        raise UsageError(f"{where}: log_uniform needs low > 0")


def plain(value: Any) -> Any:
    """numpy scalars (from the search) as Python values, which config checks accept."""
    return value.item() if isinstance(value, np.generic) else value


def _values(dist: dict[str, list]) -> list:
    return next(iter(dist.values()))


def _run(spec: SweepSpec, params: dict[str, Any], seed: int, trial_dir: Path) -> RunSpec:
    overrides = {**spec.base, **params, "total_timesteps": spec.steps}
    # named after the trial: `rlstore plot OUT/trials` draws a curve per trial
    return RunSpec(spec.algo, spec.env, seed, trial_dir.name, str(trial_dir), overrides)


def tune_space(space: dict[str, dict[str, list]]) -> dict[str, Any]:
    from ray import tune

    make = {
        "uniform": lambda v: tune.uniform(*v),
        "log_uniform": lambda v: tune.loguniform(*v),
        "int": lambda v: tune.randint(v[0], v[1] + 1),  # both ends included
        "choice": tune.choice,
    }
    return {name: make[kind](values) for name, d in space.items() for kind, values in d.items()}


def score_until(summary_or_run: Any, step: int | None = None) -> float:
    """Mean of the last WINDOW returns of the episodes that ended by `step` (all: None)."""
    if isinstance(summary_or_run, dict):
        returns = summary_or_run["episodes"]["returns"]
        steps = summary_or_run["episodes"]["steps"]
    else:
        returns, steps = summary_or_run.episode_returns, summary_or_run.episode_steps
    if step is not None:
        returns = returns[: int(np.searchsorted(steps, step, side="right"))]
    return float(np.mean(returns[-WINDOW:])) if returns else -math.inf


def trial(params: dict[str, Any], spec: dict[str, Any], out: str) -> None:
    """One trial (runs in a Ray worker): every seed, intermediate reports from the first."""
    from ray import tune

    sweep = SweepSpec(**spec)
    params = {name: plain(value) for name, value in params.items()}
    trial_dir = Path(out) / "trials" / tune.get_context().get_trial_id()
    marks = [sweep.steps * (k + 1) // sweep.reports for k in range(sweep.reports)]
    reported = 0

    def report_marks(source: Any, reached: int) -> None:
        nonlocal reported
        while reported < len(marks) and marks[reported] <= reached:
            score = score_until(source, marks[reported])
            tune.report({"score": score, "seeds_done": 0, "env_steps": marks[reported]})
            reported += 1

    from rlstore.callbacks import Callback

    class ReportMarks(Callback):  # the first seed's scores, as its run reaches each mark
        def on_log(self, run: Any, scalars: dict[str, float]) -> None:
            report_marks(run, run.global_step)

    scores = []
    for i, seed in enumerate(sweep.seeds):
        callbacks = [ReportMarks()] if i == 0 else []
        summary = _run(sweep, params, seed, trial_dir).complete(callbacks)
        if i == 0:
            report_marks(summary, summary["global_step"])
        scores.append(score_until(summary))
    tune.report({"score": float(np.mean(scores)), "seeds_done": len(scores), "seed_scores": scores})


def sweep(
    spec_arg: str,
    out: str | None = None,
    address: str | None = None,
    workers: int | None = None,
    gpus_per_trial: float = 0.0,
) -> int:
    spec_path = Path(spec_arg)
    spec = load_spec(spec_path)
    out_dir = Path(out or Path("sweeps") / spec_path.stem).resolve()
    record = out_dir / "spec.json"
    if record.is_file() and json.loads(record.read_text()) != asdict(spec):
        raise UsageError(f"{out_dir} holds a sweep of another spec; give another --out")
    check_gpu_share(gpus_per_trial)
    check_workers(workers)
    if address is None:
        workers = workers or available_cores()
    connect_ray(address, workers)  # before anything is written
    from ray import tune
    from ray.tune.schedulers import ASHAScheduler
    from ray.tune.search.optuna import OptunaSearch

    out_dir.mkdir(parents=True, exist_ok=True)
    record.write_text(json.dumps(asdict(spec), indent=1) + "\n")

    trainable = tune.with_resources(
        tune.with_parameters(trial, spec=asdict(spec), out=str(out_dir)),
        {"cpu": 1, "gpu": gpus_per_trial},
    )
    experiment = out_dir / "tune"
    if tune.Tuner.can_restore(str(experiment)):
        print(f"rlstore sweep: continuing the sweep in {out_dir}")
        tuner = tune.Tuner.restore(
            str(experiment), trainable, resume_unfinished=True, restart_errored=True
        )
    else:
        tuner = tune.Tuner(
            trainable,
            param_space=tune_space(spec.space),
            tune_config=tune.TuneConfig(
                metric="score",
                mode="max",
                num_samples=spec.trials,
                max_concurrent_trials=workers,  # None: as many as the cluster fits
                search_alg=OptunaSearch(seed=spec.search_seed),
                scheduler=ASHAScheduler(
                    max_t=spec.reports + 1, grace_period=max(1, spec.reports // 3)
                )
                if spec.early_stop
                else None,  # every trial runs to its end
            ),
            run_config=tune.RunConfig(
                name="tune", storage_path=str(out_dir), verbose=0, log_to_file=True
            ),
        )
    print(
        f"rlstore sweep: {plural(spec.trials, 'trial')} of {spec.algo} on {spec.env}, "
        f"{plural(len(spec.seeds), 'seed')} x {spec.steps:,} steps each, into {out_dir}",
        flush=True,
    )
    results = tuner.fit()
    if results.num_terminated + results.num_errors < spec.trials:  # Tune caught a Ctrl-C
        print("rlstore sweep: interrupted; run the same command again to continue")
        return 130
    if results.num_errors:
        first = str(results.errors[0]).strip().splitlines()[-1]
        failed = plural(results.num_errors, "trial")
        print(f"rlstore sweep: {failed} failed, the first with: {first}")
    trials = []
    for result in results:
        metrics = result.metrics or {}
        finished = metrics.get("seeds_done") == len(spec.seeds)
        trials.append(
            {
                "trial": metrics.get("trial_id") or Path(result.path).name,
                "params": {k: plain(result.config[k]) for k in spec.space},
                "score": metrics.get("score"),
                "finished": finished,
                "seed_scores": metrics.get("seed_scores"),
            }
        )
    done = sorted((t for t in trials if t["finished"]), key=lambda t: -t["score"])
    (out_dir / "trials.json").write_text(json.dumps(trials, indent=1) + "\n")
    stopped = f", {len(trials) - len(done)} stopped early" if len(done) < len(trials) else ""
    print(f"rlstore sweep: {len(done)} of {plural(len(trials), 'trial')} finished{stopped}")
    if not done:
        print("rlstore sweep: no trial finished; nothing to export")
        return 1
    best = done[0]
    for t in done[:5]:
        print(f"  {t['score']:9.2f}  {t['trial']}  {t['params']}")
    write_best(out_dir / "best.toml", spec, best)
    print(
        f"rlstore sweep: best trial {best['trial']}, score {best['score']:.2f}; reproduce with "
        f"rlstore train {spec.algo} --config {out_dir / 'best.toml'} --seed {spec.seeds[0]}"
    )
    return 0


def write_best(path: Path, spec: SweepSpec, best: dict[str, Any]) -> None:
    """The best trial's settings as a --config file (every value as the trial had it)."""
    settings = {"env_id": spec.env, "total_timesteps": spec.steps, **spec.base, **best["params"]}
    lines = [
        f"# rlstore sweep: best trial {best['trial']}, score {best['score']:.4f} (mean over "
        f"seeds {spec.seeds} of the last-{WINDOW} mean return)",
        f"# rlstore train {spec.algo} --config {path.name} --seed N",
        *(f"{key} = {toml_value(value)}" for key, value in settings.items()),
    ]
    path.write_text("\n".join(lines) + "\n")
    assert tomllib.loads(path.read_text()) == settings  # what --config reads is what ran


def toml_value(value: Any) -> str:
    """A TOML literal of a plain value (repr keeps every float's bits)."""
    value = plain(value)
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, (int, float)):
        return repr(value) if math.isfinite(value) else ("inf" if value > 0 else "-inf")
    if isinstance(value, str):
        return json.dumps(value)
    if isinstance(value, (list, tuple)):
        return "[" + ", ".join(toml_value(v) for v in value) + "]"
    raise TypeError(f"cannot write {value!r} to TOML")
