"""The user's own environments: `--env-kwargs`, `--wrapper`, and envs given as a function.

An env is made as `gym.make(env_id, **env_kwargs)`, then wrapped by each `--wrapper` in
order, before rlstore's own wrappers (docs/guides/custom-envs.md). All three are recorded in
the run's config.json, so `rlstore eval`, resume, suites and sweeps rebuild the same env.

A function that returns an env (what `rlstore.train("ppo", env=make_env)` takes) is
registered with Gymnasium as "module.name" and recorded by the run as "module:name": any
later process imports the module and finds the function again.
"""

from __future__ import annotations

import ast
import dataclasses
import importlib
import os
import re
import subprocess
import sys
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import gymnasium as gym
import numpy as np

from rlstore.env_checks import CheckedEnv
from rlstore.errors import UsageError
from rlstore.files import atomic_write_bytes


def parse_env_kwargs(items: Sequence[str]) -> dict[str, Any]:
    """--env-kwargs KEY=VALUE ...: each value read as a Python literal (False, 3, 0.5,
    "8x8", [1, 2]); a value that is not a literal is taken as the string it is."""
    kwargs: dict[str, Any] = {}
    for item in items:
        key, sep, value = item.partition("=")
        if not sep or not key.isidentifier():
            raise UsageError(
                f"--env-kwargs takes KEY=VALUE items, got '{item}'; e.g. "
                "--env-kwargs is_slippery=False map_name=8x8"
            )
        try:
            kwargs[key] = ast.literal_eval(value)
        except (ValueError, SyntaxError):
            kwargs[key] = value
    return kwargs


def split_callable_path(path: str, flag: str) -> tuple[str, str]:
    """ "module:name" -> (module, name), or a UsageError naming the flag."""
    module, sep, name = path.partition(":")
    if not (sep and module and name):
        raise UsageError(f"{flag} takes module:Callable, got '{path}'")
    return module, name


def import_user_module(name: str) -> Any:
    """A module of the user's (an env, a wrapper), found as `python` finds it: on the path,
    or in the working directory, which the `rlstore` console command's path lacks."""
    try:
        return importlib.import_module(name)
    except ModuleNotFoundError as e:
        if e.name != name.partition(".")[0] or os.getcwd() in sys.path:
            raise
    sys.path.append(os.getcwd())  # after the installed packages: it shadows none of them
    return importlib.import_module(name)


def load_callable(path: str, flag: str) -> Callable[..., Any]:
    """The callable that "module:name" names (name may be dotted: Class.method)."""
    module_name, name = split_callable_path(path, flag)
    try:
        obj: Any = import_user_module(module_name)
    except ImportError as e:
        raise UsageError(f"{flag} {path}: cannot import module '{module_name}' ({e})") from None
    obj = _attribute(obj, name)
    if obj is None:
        raise UsageError(f"{flag} {path}: module '{module_name}' has no '{name}'")
    if not callable(obj):
        raise UsageError(f"{flag} {path}: '{name}' is a {type(obj).__name__}, not a callable")
    return obj


def _attribute(obj: Any, dotted: str) -> Any:
    """obj.a.b for "a.b" (None where a part is missing)."""
    for part in dotted.split("."):
        obj = getattr(obj, part, None)
    return obj


def wrap(
    env: gym.Env, wrappers: Sequence[str], drop_keys: Sequence[str] = (), check_finite: bool = True
) -> gym.Env:
    """`env` wrapped by each "module:Callable" in order (each must return a gymnasium
    Env), then without the Dict observation keys `drop_keys` (--drop-obs-keys), with Box
    actions of more than one dimension flattened (FlatBoxActions), and what it returns
    checked against its spaces (CheckedEnv; `check_finite`: NaN and inf too)."""
    for path in wrappers:
        wrapped = load_callable(path, "--wrapper")(env)
        if not isinstance(wrapped, gym.Env):
            raise UsageError(
                f"--wrapper {path} returned {type(wrapped).__name__}, not a gymnasium Env: "
                "give a callable that takes the env and returns the wrapped env"
            )
        env = wrapped
    env = without_keys(env, drop_keys) if drop_keys else env
    space = env.action_space
    if isinstance(space, gym.spaces.Box) and len(space.shape) > 1:
        env = FlatBoxActions(env)
    return CheckedEnv(env, check_finite)


class FlatBox(gym.spaces.Box):
    """The flat Box FlatBoxActions gives the algorithms, which keeps the env's own shape
    (`env_shape`): saved policies give their actions in it (rlstore/policy.py)."""

    def __init__(self, space: gym.spaces.Box) -> None:
        super().__init__(space.low.reshape(-1), space.high.reshape(-1), dtype=space.dtype)
        self.env_shape = tuple(space.shape)


class FlatBoxActions(gym.ActionWrapper):
    """A Box action space of any shape as a flat one: the algorithms act in a vector of
    prod(shape) entries, which this reshapes for the env (an action in the env's own shape
    passes too). Bounds are the env's, flattened."""

    def __init__(self, env: gym.Env) -> None:
        super().__init__(env)
        self.env_shape = env.action_space.shape
        self.action_space = FlatBox(env.action_space)

    def action(self, action: Any) -> np.ndarray:
        return np.asarray(action).reshape(self.env_shape)


def without_keys(env: gym.Env, drop_keys: Sequence[str]) -> gym.Env:
    """`env` whose Dict observations leave out the keys `drop_keys`."""
    space = env.observation_space
    if not isinstance(space, gym.spaces.Dict):
        name = env.spec.id if env.spec else "this env"
        raise UsageError(
            f"--drop-obs-keys leaves keys out of Dict observations; {name}'s are {space}: "
            "drop the option"
        )
    unknown = [key for key in drop_keys if key not in space.spaces]
    if unknown or len(drop_keys) == len(space.spaces):
        why = f"has no key {unknown[0]!r}" if unknown else "would have no key left"
        raise UsageError(
            f"--drop-obs-keys {' '.join(drop_keys)}: the observation {why} (its keys: "
            f"{', '.join(space.spaces)})"
        )
    return gym.wrappers.FilterObservation(env, [k for k in space.spaces if k not in drop_keys])


class EnvMaker:
    """Makes one env: gym.make(env_id, **make_kwargs, **env_kwargs), then the wrappers.
    A plain object of plain values, so that async vector envs can send it to their
    workers."""

    def __init__(
        self,
        env_id: str,
        env_kwargs: dict[str, Any],
        wrappers: Sequence[str] = (),
        drop_keys: Sequence[str] = (),
        check_finite: bool = True,
        **make_kwargs: Any,
    ) -> None:
        self.env_id, self.env_kwargs, self.wrappers = env_id, dict(env_kwargs), tuple(wrappers)
        self.drop_keys, self.make_kwargs = tuple(drop_keys), make_kwargs
        self.check_finite = check_finite

    @property
    def wrapped(self) -> bool:
        """Whether each env is wrapped (--wrapper, --drop-obs-keys)."""
        return bool(self.wrappers or self.drop_keys)

    def __call__(self, **more: Any) -> gym.Env:
        return wrap(
            gym.make(self.env_id, **self.make_kwargs, **self.env_kwargs, **more),
            self.wrappers,
            self.drop_keys,
            self.check_finite,
        )

    def check(self) -> None:
        """Make one env and close it: a kwarg the env does not take, or a wrapper that
        fails, is one UsageError here, before the vector env's copies are made."""
        try:
            env = self()
        except TypeError as e:
            if "keyword argument" not in str(e):
                raise
            given = " ".join(f"{k}={v!r}" for k, v in self.env_kwargs.items())
            raise UsageError(
                f"{self.env_id} does not take --env-kwargs {given} ({e}); check the names "
                "against the env's constructor"
            ) from None
        env.close()


# Envs that no later process can import (defined in the script that trains, a lambda, a
# closure, a partial) are saved with the run as code when the user opts in: env ids
# "pickled/NAME", their registration in the run's env.pkl (cloudpickle). Loading that file
# runs code, so eval and resume load it only when told to (--trust-env-code).
PICKLED = "pickled/"
ENV_FILE = "env.pkl"
# modules whose envs any process finds by their id
STANDARD_MODULES = ("gymnasium", "rlstore", "ale_py", "shimmy")


def env_id_of(env: Any, pickle_env: bool = False) -> str:
    """The env id that `rlstore.train(algo, env=...)` trains on: an id as it is (or as
    "module:id", where a module of the user's registers it), or a function (or class) that
    returns an env, registered here as "module:name", which other processes (rlstore eval,
    resume) find by importing the module. An env no later process can import is refused,
    or with `pickle_env` registered as "pickled/NAME", for the run to save (save_pickled_env)."""
    if isinstance(env, str):
        return with_its_module(env, pickle_env)
    if isinstance(env, gym.Env):
        raise UsageError(
            "env= takes an env id or a function that returns a new env (rlstore makes one "
            "per parallel env), not an env object: pass e.g. env=make_env, not make_env()"
        )
    if not callable(env):
        raise UsageError(f"env= takes an env id or a function, not a {type(env).__name__}")
    module, name = getattr(env, "__module__", None), getattr(env, "__qualname__", "")
    if module and module != "__main__" and name and "<" not in name:
        register_callable(module, name, env)
        return f"{module}:{name}"
    label = name or getattr(getattr(env, "func", None), "__name__", "") or type(env).__name__
    if not pickle_env:
        where = (
            "is defined in the script you run (__main__)"
            if module == "__main__" and "<" not in label
            else "is a lambda, a closure or a partial"
        )
        raise UsageError(
            f"env={label} {where}, which rlstore eval and resume cannot import: define it at "
            "the top of a module you import (my_envs.py, env=my_envs.make_env), or pass "
            "pickle_env=True to save it with the run (loading it runs its code: eval and "
            "resume then need --trust-env-code)"
        )
    return register_pickled(label, entry_point=env)


def with_its_module(env_id: str, pickle_env: bool = False) -> str:
    """An id registered by a module outside Gymnasium (the user's own, imported before
    the run) as "module:id", so that a later process (rlstore eval, resume) imports the
    module that registers it; other ids as they are. An id that no importable module
    registers (gym.register in the training script) is refused, or with `pickle_env`
    registered again as "pickled/ID" (env_id_of)."""
    if ":" in env_id or env_id not in gym.registry:
        return env_id
    spec = gym.spec(env_id)
    entry = spec.entry_point
    module = entry.partition(":")[0] if isinstance(entry, str) else entry.__module__
    if module.split(".")[0] in STANDARD_MODULES or env_id.startswith(PICKLED):
        return env_id
    if module != "__main__" and registers_on_import(module, env_id):
        return f"{module}:{env_id}"
    if not pickle_env:
        raise UsageError(
            f"{env_id} is registered by the script you run, not by a module rlstore eval and "
            f"resume can import: move gym.register(...) to a module (my_envs.py) and train "
            f"with env='my_envs:{env_id}', or pass pickle_env=True to save the env with the "
            "run (loading it runs its code: eval and resume then need --trust-env-code)"
        )
    fields = {
        f.name: getattr(spec, f.name) for f in dataclasses.fields(spec) if f.init and f.name != "id"
    }
    return register_pickled(env_id, **fields)


def registers_on_import(module: str, env_id: str) -> bool:
    """Whether importing `module` in a new process (with this one's import path) registers
    `env_id` (a module of the user's may define the env while their script registers it)."""
    code = (
        "import importlib, os, sys, gymnasium\n"
        f"sys.path[:0] = {[p for p in sys.path if p]!r}\n"
        "sys.path.append(os.getcwd())\n"
        f"importlib.import_module({module!r})\n"
        f"sys.exit(0 if {env_id!r} in gymnasium.registry else 3)"
    )
    try:
        done = subprocess.run([sys.executable, "-c", code], capture_output=True, timeout=120)
    except subprocess.TimeoutExpired:
        return False
    return done.returncode == 0


def register_pickled(name: str, **spec: Any) -> str:
    """Register an env under "pickled/NAME" (its registration replaced, if any): the id
    of an env the run saves as code."""
    env_id = PICKLED + (re.sub(r"[^A-Za-z0-9_.-]+", "_", name).strip("_.") or "env")
    gym.registry.pop(env_id, None)
    gym.register(env_id, **spec)
    return env_id


def save_pickled_env(env_id: str, run_dir: Path) -> None:
    """Write the registration of a "pickled/NAME" env into the run directory (env.pkl),
    as code (cloudpickle): later processes load it with load_pickled_env."""
    import cloudpickle

    atomic_write_bytes(run_dir / ENV_FILE, cloudpickle.dumps(gym.spec(env_id)))


def load_pickled_env(env_id: str, run_dir: Path, trust: bool) -> None:
    """Register a "pickled/NAME" env from the run directory's env.pkl, which runs the code
    it holds: only with `trust` (--trust-env-code); other ids need nothing."""
    if not env_id.startswith(PICKLED) or env_id in gym.registry:
        return
    path = Path(run_dir) / ENV_FILE
    if not path.is_file():
        raise UsageError(
            f"{run_dir} was trained on {env_id}, an env saved with the run, but its {ENV_FILE} "
            "is missing; evaluate it with --env ID_OR_MODULE:FUNCTION"
        )
    if not trust:
        raise UsageError(
            f"{run_dir} was trained on an env saved with the run as code ({ENV_FILE}, by "
            "cloudpickle); loading it runs that code: if you trust the run, add "
            "--trust-env-code, or give the env with --env (rlstore eval)"
        )
    import pickle

    try:
        spec = pickle.loads(path.read_bytes())  # (cloudpickle's files load with pickle)
    except Exception as e:
        raise UsageError(f"{path} cannot be loaded here ({type(e).__name__}: {e})") from None
    gym.registry[env_id] = spec


def registered_id(module: str, name: str) -> str:
    """The id under which the function "module:name" is registered: Gymnasium reads an
    id with a colon as module:EnvId itself."""
    return f"{module}.{name}"


def register_callable(module: str, name: str, function: Callable[..., gym.Env]) -> str:
    """Register `function` with Gymnasium (once); its registered id."""
    env_id = registered_id(module, name)
    if env_id not in gym.registry:
        gym.register(env_id, entry_point=function)
    return env_id


def callable_env(module_name: str, name: str) -> str | None:
    """For "module:name" naming a function (or class) that returns an env in a module
    already imported: register it, and return its registered id (None: no such callable)."""
    obj = _attribute(importlib.import_module(module_name), name)
    if obj is None or not callable(obj) or isinstance(obj, gym.Env):
        return None
    return register_callable(module_name, name, obj)
