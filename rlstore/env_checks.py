"""The env boundary's checks: what a user's env returns against what its spaces declare.

`CheckedEnv` wraps each env rlstore makes (rlstore/custom_envs.py) and checks every
observation and reward it returns, so that a mistake in the user's env is one line that
names the env, the part and what was expected (an EnvContractError: exit 2), not a
traceback from the vector env or a run whose weights all turned NaN:

- an observation of the wrong shape, of another dtype kind (floats for an integer Box),
  or outside a Discrete, MultiDiscrete or MultiBinary space, a Dict without its keys;
- NaN or inf in an observation or a reward (`--check-finite off` lets them through);
- an observation in a wider dtype of the same kind (float64 for float32), integers for a
  float Box, or a Python list: cast to the space's dtype, with one warning;
- values outside a Box's bounds: one warning (many envs' bounds are loose), read at the
  first reset and wherever the full check runs.
"""

from __future__ import annotations

import math
import warnings
from typing import Any

import gymnasium as gym
import numpy as np
from gymnasium import spaces

from rlstore.errors import UsageError

CHECK_ENV_HINT = "rlstore check-env checks an env before training"
_SAID: set[str] = set()  # the warnings given (casts, bounds)
INTEGERS = (int, np.int64, np.int32)  # what Discrete observations come as


class EnvContractError(UsageError):
    """An env returned what its spaces do not allow: the run stops (exit 2)."""


def env_name(env: gym.Env) -> str:
    spec = env.spec
    return spec.id if spec is not None else type(env.unwrapped).__name__


class SpaceMismatch(ValueError):
    """What an env returned (`got`) breaks what its space says (`expected`)."""

    def __init__(self, got: str, expected: str) -> None:
        super().__init__(f"{got}, where it should give {expected}")
        self.got, self.expected = got, expected


def check_observation(
    space: gym.Space, obs: Any, check_finite: bool, part: str = ""
) -> tuple[Any, list[str]]:
    """`obs` as `space` holds it (cast where that loses nothing: float64 to float32, a list
    to an array), and what was cast or is out of bounds (one note each, for a warning); a
    SpaceMismatch where it breaks the space."""
    where = f"observation{part}"
    if isinstance(space, spaces.Dict):
        if not isinstance(obs, dict) or set(obs) != set(space.spaces):
            keys = sorted(obs) if isinstance(obs, dict) else type(obs).__name__
            raise SpaceMismatch(f"an {where} with keys {keys}", f"the keys {sorted(space.spaces)}")
        notes: list[str] = []
        checked = {}
        for key, sub in space.spaces.items():
            checked[key], more = check_observation(sub, obs[key], check_finite, f"{part}[{key!r}]")
            notes += more
        return checked, notes
    if isinstance(space, spaces.Tuple):
        if not isinstance(obs, (tuple, list)) or len(obs) != len(space.spaces):
            raise SpaceMismatch(
                f"an {where} of {_describe(obs)}", f"a tuple of {len(space.spaces)}"
            )
        notes, checked = [], []
        for i, sub in enumerate(space.spaces):
            value, more = check_observation(sub, obs[i], check_finite, f"{part}[{i}]")
            checked.append(value)
            notes += more
        return tuple(checked), notes
    if isinstance(space, spaces.Discrete):
        value = np.asarray(obs)
        start, n = int(space.start), int(space.n)
        if value.shape != () or value.dtype.kind not in "iub" or not start <= value < start + n:
            raise SpaceMismatch(
                f"an {where} of {_describe(obs)}", f"an integer in [{start}, {start + n})"
            )
        return obs, []
    if isinstance(space, (spaces.MultiDiscrete, spaces.MultiBinary)):
        return _check_integers(space, obs, where)
    if isinstance(space, spaces.Box):
        return _check_box(space, obs, check_finite, where)
    return obs, []  # (spaces rlstore refuses before training: check_spaces)


def _check_integers(space: gym.Space, obs: Any, where: str) -> tuple[Any, list[str]]:
    value, notes = np.asarray(obs), []
    if value.shape != space.shape or value.dtype.kind not in "iub":
        raise SpaceMismatch(f"an {where} of {_describe(obs)}", _declared(space))
    if isinstance(space, spaces.MultiBinary):
        low, high = 0, 1
    else:
        low = np.broadcast_to(space.start, space.shape)
        high = low + space.nvec - 1
    if np.any(value < low) or np.any(value > high):
        raise SpaceMismatch(f"an {where} with values {value.tolist()}", f"values in {space}")
    if not isinstance(obs, np.ndarray) or value.dtype != space.dtype:
        notes.append(f"its {where} came as {_describe(obs)}; cast to {space.dtype}")
        value = value.astype(space.dtype)
    return value, notes


def _check_box(
    space: spaces.Box, obs: Any, check_finite: bool, where: str
) -> tuple[Any, list[str]]:
    value, notes = np.asarray(obs), []
    if value.shape != space.shape:
        raise SpaceMismatch(f"an {where} of {_describe(obs)}", _declared(space))
    kind, declared = value.dtype.kind, space.dtype.kind
    if kind not in "biuf" or (declared in "iub" and kind == "f"):
        raise SpaceMismatch(f"an {where} of {_describe(obs)}", _declared(space))
    if check_finite and kind == "f" and not np.isfinite(value).all():
        raise SpaceMismatch(f"an {where} with NaN or inf ({_first_bad(value)})", "finite values")
    if not isinstance(obs, np.ndarray) or value.dtype != space.dtype:
        notes.append(f"its {where} came as {_describe(obs)}; cast to {space.dtype}")
        value = value.astype(space.dtype)
    if not space.contains(value) and np.isfinite(value).all():
        notes.append(f"its {where} has values outside {space}'s bounds")
    return value, notes


def check_reward(reward: Any, check_finite: bool = True) -> None:
    """A SpaceMismatch for a reward that is no number, or (`check_finite`) NaN or inf."""
    try:
        finite = math.isfinite(reward)
    except (TypeError, ValueError):
        raise SpaceMismatch(f"a reward of {_describe(reward)}", "a float") from None
    if check_finite and not finite:
        raise SpaceMismatch(f"a reward of {reward}", "a finite reward")


class CheckedEnv(gym.Wrapper):
    """An env whose observations and rewards are checked as the module docstring says. It
    holds no state of the env's: env snapshots skip it (rlstore/env_snapshots.py).

    The common cases take a fast test, a few attribute comparisons: an array of exactly
    the declared shape and dtype (a float one summed, to see NaN and inf), an integer in a
    Discrete space's range, or a Dict of those; anything else, and the first reset, the
    full check."""

    def __init__(self, env: gym.Env, check_finite: bool = True) -> None:
        super().__init__(env)
        self.check_finite = check_finite
        space = env.observation_space
        box = isinstance(space, spaces.Box)
        self._shape = space.shape if box else None
        self._dtype = space.dtype if box else None
        self._float = box and space.dtype.kind == "f" and check_finite
        # a short vector sums fastest as a Python list (numpy's call costs more)
        self._as_list = box and len(space.shape) == 1 and space.shape[0] <= 32
        discrete = isinstance(space, spaces.Discrete)
        self._low = int(space.start) if discrete else None
        self._end = int(space.start + space.n) if discrete else None
        # a Dict of Box and Discrete parts (MiniGrid's): each part's fast test
        parts = space.spaces if isinstance(space, spaces.Dict) else {}
        simple = all(isinstance(part, (spaces.Box, spaces.Discrete)) for part in parts.values())
        self._parts = (
            {key: CheckedEnv._PartTest(part, check_finite) for key, part in parts.items()}
            if parts and simple
            else None
        )
        self._reset_once = False

    class _PartTest:
        """The fast test of one Box or Discrete part of a Dict observation."""

        def __init__(self, space: gym.Space, check_finite: bool) -> None:
            box = isinstance(space, spaces.Box)
            self.shape, self.dtype = (space.shape, space.dtype) if box else (None, None)
            self.float = box and space.dtype.kind == "f" and check_finite
            self.low = None if box else int(space.start)
            self.end = None if box else int(space.start + space.n)

        def fits(self, part: Any) -> bool:
            if part.__class__ in INTEGERS:
                return self.low is not None and self.low <= part < self.end
            if part.__class__ is not np.ndarray or part.dtype is not self.dtype:
                return False
            if part.shape != self.shape:
                return False
            return not self.float or math.isfinite(np.add.reduce(part, axis=None))

    def _fits(self, obs: Any) -> bool:
        """The fast test (a False sends the observation to the full check)."""
        if obs.__class__ in INTEGERS:
            return self._low is not None and self._low <= obs < self._end
        if self._parts is not None:
            return (
                isinstance(obs, dict)
                and obs.keys() == self._parts.keys()
                and all(test.fits(obs[key]) for key, test in self._parts.items())
            )
        if obs.__class__ is not np.ndarray or obs.dtype is not self._dtype:
            return False
        if obs.shape != self._shape:
            return False
        if not self._float:
            return True
        total = sum(obs.tolist()) if self._as_list else np.add.reduce(obs, axis=None)
        return math.isfinite(total)  # (finite values may sum to inf: the full check says)

    def reset(self, **kwargs: Any) -> tuple[Any, dict[str, Any]]:
        obs, info = self.env.reset(**kwargs)
        if not (self._reset_once and self._fits(obs)):
            obs = self._checked(obs, "reset()", bounds=not self._reset_once)
            self._reset_once = True
        return obs, info

    def step(self, action: Any) -> tuple[Any, ...]:
        obs, reward, terminated, truncated, info = self.env.step(action)
        if not self._fits(obs):
            obs = self._checked(obs, "step()", bounds=False)
        try:
            finite = math.isfinite(reward)
        except (TypeError, ValueError):
            finite = None
        if not finite and (self.check_finite or finite is None):
            try:
                check_reward(reward, self.check_finite)
            except SpaceMismatch as e:
                self._fail(e, "step()")
        return obs, reward, terminated, truncated, info

    def _checked(self, obs: Any, method: str, bounds: bool) -> Any:
        try:
            obs, notes = check_observation(self.observation_space, obs, self.check_finite)
        except SpaceMismatch as e:
            self._fail(e, method)
        for note in notes:
            message = f"{env_name(self.env)}: {note}"
            if message not in _SAID and (bounds or "outside" not in note):
                _SAID.add(message)  # once per process, not per copy of the env
                # (no source line: the line that stepped the env says nothing to the user)
                warnings.warn_explicit(message, UserWarning, "rlstore", 0)
        return obs

    def _fail(self, mismatch: SpaceMismatch, method: str) -> None:
        finite = "finite" in mismatch.expected
        fix = "fix the env, or train with --check-finite off" if finite else "fix the env"
        raise EnvContractError(
            f"{env_name(self.env)} returned {mismatch.got} from {method}, where it should give "
            f"{mismatch.expected}; {fix} ({CHECK_ENV_HINT})"
        ) from None


def _describe(obs: Any) -> str:
    if isinstance(obs, np.ndarray):
        return f"{obs.dtype} shape {obs.shape}"
    if isinstance(obs, (list, tuple)):
        return f"a {type(obs).__name__} of {len(obs)}"
    return f"{type(obs).__name__} {obs!r}"[:80]


def _declared(space: gym.Space) -> str:
    return f"{space.dtype} shape {space.shape} ({space})"


def _first_bad(value: np.ndarray) -> str:
    index = tuple(int(i) for i in np.argwhere(~np.isfinite(value))[0])
    return f"{value[index]} at index {index[0] if len(index) == 1 else index}"
