"""Presets and config resolution: the shipped presets (configs/<algo>/<env id>.toml and the
family presets), `--config` files, and `resolve`, which makes an algorithm's config for a run
(dataclass defaults < preset < --config FILE < flags); what `--print-config` and
`rlstore presets` say. The config classes themselves are in rlstore/config.py. This module
imports neither torch nor gymnasium, so `rlstore --help` stays fast.
"""

from __future__ import annotations

import dataclasses
import difflib
import json
import re
import sys
import types
import typing
from dataclasses import dataclass
from pathlib import Path
from typing import Annotated, Any, Literal

from rlstore import algos
from rlstore.config import CommonConfig, env_file_name
from rlstore.errors import UsageError

if sys.version_info >= (3, 11):
    import tomllib
else:  # Python 3.10: tomllib is tomli, which 3.11 took into the standard library
    import tomli as tomllib


PRESET_DIR = Path(__file__).resolve().parent / "configs"  # installed: rlstore/configs


if not PRESET_DIR.is_dir():  # a source checkout: configs/ at the repository top
    PRESET_DIR = Path(__file__).resolve().parent.parent / "configs"


# Env families whose published defaults ship as configs/{algo}/{family}.toml and apply to
# every env of the family that has no preset of its own.
FAMILIES = {
    "atari": re.compile(r"^ALE/.+-v5$|^\w+NoFrameskip-v4$"),
    "mujoco": re.compile(
        r"^(Ant|HalfCheetah|Hopper|Humanoid|HumanoidStandup|InvertedDoublePendulum"
        r"|InvertedPendulum|Pusher|Reacher|Swimmer|Walker2d)-v\d+$"
    ),
}


def preset_path(algo: str, env_id: str) -> Path:
    """configs/{algo}/{env id}.toml (a '/' or ':' in the id becomes '_'), else the preset of
    the env's family (configs/ppo/mujoco.toml for HalfCheetah-v4), when there is one."""
    own = PRESET_DIR / algo / f"{env_file_name(env_id)}.toml"
    family = next((name for name, ids in FAMILIES.items() if ids.match(env_id)), None)
    if own.is_file() or family is None:
        return own
    return PRESET_DIR / algo / f"{family}.toml"


def _strip_annotated(tp: Any) -> Any:
    return typing.get_args(tp)[0] if typing.get_origin(tp) is Annotated else tp


def _type_ok(value: Any, tp: Any) -> bool:
    tp = _strip_annotated(tp)
    origin = typing.get_origin(tp)
    if origin in (typing.Union, types.UnionType):
        return any(_type_ok(value, arg) for arg in typing.get_args(tp))
    if origin is Literal:
        return value in typing.get_args(tp)
    if tp is type(None):
        return value is None
    if tp is float:
        return isinstance(value, (int, float)) and not isinstance(value, bool)
    if tp is int:
        return isinstance(value, int) and not isinstance(value, bool)
    if origin is tuple:  # tuple[int, ...]; TOML and JSON give lists
        item = typing.get_args(tp)[0]
        return isinstance(value, (list, tuple)) and all(_type_ok(v, item) for v in value)
    return isinstance(value, tp)


def apply_overrides(cfg: CommonConfig, overrides: dict[str, Any], source: str) -> CommonConfig:
    """Return a copy of cfg with overrides applied; unknown keys and wrong types are UsageErrors."""
    hints = typing.get_type_hints(type(cfg), include_extras=True)
    names = [f.name for f in dataclasses.fields(cfg)]
    changes = {}
    for key, value in overrides.items():
        name = key.replace("-", "_")
        if name == "env":
            name = "env_id"
        if name not in names or name == "config":
            close = difflib.get_close_matches(name, names, n=1)
            hint = f" (did you mean '{close[0]}'?)" if close else ""
            raise UsageError(f"{source}: unknown key '{key}'{hint}")
        if not _type_ok(value, hints[name]):
            raise UsageError(
                f"{source}: '{key}' = {value!r} has the wrong type; expected {hints[name]}"
            )
        if _strip_annotated(hints[name]) is float and isinstance(value, int):
            value = float(value)
        if isinstance(value, list):
            value = tuple(value)
        changes[name] = value
    return dataclasses.replace(cfg, **changes)


def read_config(path: Path, what: str = "config file") -> dict[str, Any]:
    """A flat table of overrides from a TOML file (or JSON, such as a run's config.json)."""
    if not path.is_file():
        problem = "is a directory" if path.is_dir() else "does not exist"
        raise UsageError(f"{what} '{path}' {problem}; give the path of a TOML file")
    try:
        if path.suffix == ".json":
            data = json.loads(path.read_text())
            for key in ("algo", "preset", "config", "resolved"):  # bookkeeping of config.json
                data.pop(key, None)
            return data
        with open(path, "rb") as f:
            return tomllib.load(f)
    except (tomllib.TOMLDecodeError, json.JSONDecodeError, UnicodeDecodeError) as e:
        reason = str(e).splitlines()[0] if str(e) else type(e).__name__
        raise UsageError(f"{what} '{path}' is not valid: {reason}") from None


def resolve(
    algo: str, env_id: str | None = None, overrides: dict[str, Any] | None = None
) -> tuple[CommonConfig, Path | None]:
    """The config of `algo` on `env_id`: dataclass defaults < the env's preset from configs/ <
    the `config` file named in `overrides` (a path or a packaged preset's name) < the other
    overrides (field = value). Returns the config and the preset file used (or None).

    The CLI resolves its defaults here and applies its flags on top; scripts call it with
    their overrides: `resolve("ppo", "CartPole-v1", {"total_timesteps": 100_000})`.
    """
    cfg = algos.get(algo).config()
    overrides = dict(overrides or {})
    config_arg = overrides.pop("config", None)
    env_id = env_id or overrides.get("env_id", overrides.get("env"))
    config_file = find_config_file(config_arg, algo, env_id or cfg.env_id) if config_arg else None
    file_overrides = read_config(config_file, "--config file") if config_file else {}
    env_id = env_id or file_overrides.get("env_id", file_overrides.get("env", cfg.env_id))
    preset = preset_path(algo, str(env_id))
    if preset.is_file():
        cfg = apply_overrides(cfg, read_config(preset, "preset"), f"preset {preset}")
    else:
        preset = None
    if config_file:
        cfg = apply_overrides(cfg, file_overrides, f"--config file {config_file}")
    cfg = apply_overrides(cfg, {**overrides, "env_id": env_id}, "overrides")
    return dataclasses.replace(cfg, config=str(config_file) if config_file else None), preset


def shipped_budget(algo: str, cfg: CommonConfig) -> int:
    """total_timesteps of the defaults and presets rlstore ships for this run (a packaged
    --config preset included), as opposed to a budget the user asked for."""
    packaged = cfg.config and Path(cfg.config).resolve().parent.parent == PRESET_DIR.resolve()
    overrides = {"config": cfg.config} if packaged else None
    return resolve(algo, cfg.env_id, overrides)[0].total_timesteps


def find_config_file(value: str, algo: str, env_id: str) -> Path:
    """A --config value: a file, or the name of a packaged preset
    (configs/<algo>/<env id>.<name>.toml), so that `--config fast` works from any directory."""
    path = Path(value)
    if path.is_file() or "/" in value or path.suffix in (".toml", ".json"):
        return path  # read_config says so if it does not exist
    stem = env_file_name(env_id)
    named = PRESET_DIR / algo / f"{stem}.{value}.toml"
    if named.is_file():
        return named
    names = sorted(
        p.name[len(stem) + 1 : -len(".toml")] for p in named.parent.glob(f"{stem}.*.toml")
    )
    offer = f"; presets for {algo} on {env_id}: {', '.join(names)}" if names else ""
    raise UsageError(f"--config '{value}' is neither a file nor a packaged preset{offer}")


@dataclass
class PresetInfo:
    """A shipped preset: its algorithm, the envs it applies to, its values and their source."""

    algo: str
    path: Path
    applies_to: str
    keys: list[str]
    source: str  # the first sentence of the file's comment


FAMILY_WORDS = {"atari": "every ALE id without its own preset", "mujoco": "every MuJoCo id"}


def shipped_presets() -> list[PresetInfo]:
    """Every preset in configs/ (suites apart), in a stable order."""
    presets, algo_names = [], algos.names()
    for path in sorted(PRESET_DIR.glob("*/*.toml")):
        algo = path.parent.name
        if algo not in algo_names:
            continue
        env, _, name = path.stem.partition(".")
        if env in FAMILY_WORDS:
            applies = f"{FAMILY_WORDS[env]} (automatic)"
        elif name:
            applies = f"{env}, with --config {name} (not automatic)"
        else:
            applies = f"{env} (automatic)"
        comment = " ".join(
            line.lstrip("# ").strip()
            for line in path.read_text().splitlines()
            if line.startswith("#")
        )
        # its first sentence ("et al." does not end one)
        first = re.split(r"(?<!\bal)\.\s+(?=[A-Z(])", comment, maxsplit=1)[0].rstrip(".")
        source = first + "." if comment else "(no comment)"
        keys = list(read_config(path, "preset"))
        presets.append(PresetInfo(algo, path, applies, keys, source))
    return presets


def presets_of(algo: str) -> list[PresetInfo]:
    """The shipped presets of one algorithm (applied automatically or with --config NAME)."""
    return [p for p in shipped_presets() if p.algo == algo]


def value_sources(
    algo: str, cfg: CommonConfig, preset: Path | None, given: set[str]
) -> dict[str, str]:
    """Where each field's value came from: 'flag', 'file <path>', 'preset <path>' or
    'default'. `given` holds the fields set on the command line."""
    from_preset = set(read_config(preset, "preset")) if preset else set()
    config_file = Path(cfg.config) if cfg.config else None
    from_file = set(read_config(config_file)) if config_file else set()
    sources = {}
    for field in dataclasses.fields(cfg):
        if field.name in given:
            sources[field.name] = "flag"
        elif field.name in from_file or (field.name == "env_id" and "env" in from_file):
            sources[field.name] = f"file {config_file}"
        elif field.name in from_preset:
            sources[field.name] = f"preset {preset}"
        else:
            sources[field.name] = "default"
    return sources


def describe_config(algo: str, cfg: CommonConfig, preset: Path | None, given: set[str]) -> str:
    """The resolved config, one field a line, with where each value came from."""
    sources = value_sources(algo, cfg, preset, given)
    lines = [f"# rlstore train {algo}: the resolved config (value  # where it came from)"]
    width = max(len(f.name) for f in dataclasses.fields(cfg))
    for field in dataclasses.fields(cfg):
        value = getattr(cfg, field.name)
        if value is None:  # (TOML has no null)
            lines.append(f"# {field.name:<{width - 2}} unset{'':<12}  # {sources[field.name]}")
            continue
        text = json.dumps(_plain_value(value))
        lines.append(f"{field.name:<{width}} = {text:<14}  # {sources[field.name]}")
    derived = [
        f"# steps run: {cfg.steps_run:,} ({cfg.steps_run // cfg.iteration_steps:,} iterations "
        f"of {cfg.iteration_steps:,} env steps)"
    ]
    return "\n".join(lines + derived)


def _plain_value(value: Any) -> Any:
    return list(value) if isinstance(value, tuple) else value
