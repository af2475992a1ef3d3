"""A suite's file: its rows (algorithm x env x seeds x budget, overrides, reference band and
its source, the versions it was scored under), read and checked, and the preflight that
fails before any run starts. The format: docs/guides/many-runs.md."""

from __future__ import annotations

import difflib
import warnings
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from packaging.specifiers import InvalidSpecifier, SpecifierSet

from rlstore import algos
from rlstore.config import validate
from rlstore.errors import UsageError
from rlstore.executor import RunSpec
from rlstore.presets import PRESET_DIR, tomllib

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
    seeds_label: str = ""  # its rows on other seeds than the file's (--seeds 4-10): "4-10"


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
            and all(version_spec(spec) is not None for spec in requires.values())
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


def version_spec(spec: Any) -> SpecifierSet | None:
    """A row's `requires` value as a version specifier ("<3.5", ">=2.3, <3.5"; PEP 440, by
    `packaging`), or None where it is not one."""
    if not isinstance(spec, str) or not spec.strip():
        return None
    try:
        return SpecifierSet(spec)
    except InvalidSpecifier:
        return None


def version_satisfies(version: str, spec: str) -> bool:
    """Whether `version` meets every clause of `spec` (PEP 440: releases compare as numbers,
    padded with zeros, 3.4.0 < 3.5 == 3.5.0; a local label such as +cu121 is ignored)."""
    return SpecifierSet(spec).contains(version, prereleases=True)


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
