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
import importlib
import os
import sys
from collections.abc import Callable, Sequence
from typing import Any

import gymnasium as gym
import numpy as np

from rlstore.errors import UsageError


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


def wrap(env: gym.Env, wrappers: Sequence[str], drop_keys: Sequence[str] = ()) -> gym.Env:
    """`env` wrapped by each "module:Callable" in order (each must return a gymnasium
    Env), then without the Dict observation keys `drop_keys` (--drop-obs-keys), and with
    Box actions of more than one dimension flattened (FlatBoxActions)."""
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
    return (
        FlatBoxActions(env) if isinstance(space, gym.spaces.Box) and len(space.shape) > 1 else env
    )


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
        **make_kwargs: Any,
    ) -> None:
        self.env_id, self.env_kwargs, self.wrappers = env_id, dict(env_kwargs), tuple(wrappers)
        self.drop_keys, self.make_kwargs = tuple(drop_keys), make_kwargs

    @property
    def wrapped(self) -> bool:
        """Whether each env is wrapped (--wrapper, --drop-obs-keys)."""
        return bool(self.wrappers or self.drop_keys)

    def __call__(self, **more: Any) -> gym.Env:
        return wrap(
            gym.make(self.env_id, **self.make_kwargs, **self.env_kwargs, **more),
            self.wrappers,
            self.drop_keys,
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


def env_id_of(env: Any) -> str:
    """The env id that `rlstore.train(algo, env=...)` trains on: an id as it is, or a
    function (or class) that returns an env, registered here as "module:name", which
    other processes (rlstore eval, resume) find by importing the module."""
    if isinstance(env, str):
        return with_its_module(env)
    if isinstance(env, gym.Env):
        raise UsageError(
            "env= takes an env id or a function that returns a new env (rlstore makes one "
            "per parallel env), not an env object: pass e.g. env=make_env, not make_env()"
        )
    if not callable(env):
        raise UsageError(f"env= takes an env id or a function, not a {type(env).__name__}")
    module, name = getattr(env, "__module__", None), getattr(env, "__qualname__", "")
    if not module or "<" in name:  # a lambda or a function defined inside another
        raise UsageError(
            f"env={name or env!r} cannot be found again by rlstore eval or resume: define the "
            "function at the top level of a module"
        )
    register_callable(module, name, env)
    return f"{module}:{name}"


def with_its_module(env_id: str) -> str:
    """An id registered by a module outside Gymnasium (the user's own, imported before
    the run) as "module:id", so that a later process (rlstore eval, resume) imports the
    module that registers it; other ids as they are."""
    if ":" in env_id or env_id not in gym.registry:
        return env_id
    entry = gym.spec(env_id).entry_point
    module = entry.partition(":")[0] if isinstance(entry, str) else entry.__module__
    if module.split(".")[0] in ("gymnasium", "rlstore", "ale_py", "shimmy"):
        return env_id
    return f"{module}:{env_id}"


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
