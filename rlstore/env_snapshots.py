"""Environment state in checkpoints: a vector env's full state, captured and restored, so
that an interrupted run resumes with its envs where they were. Classic control, toy text,
LunarLander (by replaying its episodes), Gymnasium's MuJoCo envs (their MjData, whole) and
rlstore's own envs resume exactly, in sync or async vector envs; others (BipedalWalker,
Atari) resume freshly reset, and the run says so. rlstore/checkpoint.py keeps the result in
the checkpoint file."""

from __future__ import annotations

import pickle
import sys
from collections.abc import Callable, Sequence
from typing import Any

import gymnasium as gym
import numpy as np
import torch

from rlstore.env_checks import CheckedEnv
from rlstore.files import array_to_saved, saved_to_array
from rlstore.lean_envs import LeanSyncVectorEnv
from rlstore.storage.migrations import lean_env_state

# Envs whose whole state is plain attributes (numbers, arrays, generators), Gymnasium's
# MuJoCo envs (plain attributes and their MjData) and the envs whose episodes replay
# (REPLAYED_ENVS: LunarLander): these resume exactly, in sync or async vector envs
# (the latter through WorkerAccess). Others (BipedalWalker, Atari) resume with freshly
# reset envs.
SAVEABLE_ENVS = (
    "CartPoleEnv",
    "CartPoleVectorEnv",
    "AcrobotEnv",
    "MountainCarEnv",
    "Continuous_MountainCarEnv",
    "PendulumEnv",
    "CartPoleNoVelEnv",
    "PendulumNoVelEnv",
    "FrozenLakeEnv",
    "TaxiEnv",
    "CliffWalkingEnv",
    "BlackjackEnv",
    "BitFlippingEnv",
)
_SKIP = {"metadata", "spec", "render_mode", "screen", "clock", "surf", "screens", "env_fns"}
# The base layer's MjData, whole: after a step its derived quantities (body positions,
# contact forces) are those of the step's last substep, and Ant's and Humanoid's rewards
# read them before the next, so qpos and qvel alone do not continue the episode exactly.
_MJDATA, _MUJOCO_VERSION = "__mjdata__", "__mujoco_version__"
_REPLAY = "__replay__"  # an EpisodeRecorder's episode (rlstore/envs.py)
_SPACES = ("action_space", "single_action_space", "observation_space", "single_observation_space")


def _is_mujoco(env: gym.Env) -> bool:
    return type(env).__module__.startswith("gymnasium.envs.mujoco.") and hasattr(env, "data")


def env_state(envs: gym.vector.VectorEnv) -> dict[str, Any] | None:
    """The vector env's full state, or None when it cannot be captured exactly."""
    if isinstance(envs, gym.vector.VectorWrapper):  # (TruncationAsTermination, LifeLoss)
        inner = env_state(envs.env)
        if inner is None:
            return None
        return inner | {"wrappers": [_attributes(envs), *inner.get("wrappers", [])]}
    if isinstance(envs, gym.vector.AsyncVectorEnv):
        if not envs.metadata.get(WORKER_ACCESS):
            return None  # (Atari's, or envs built elsewhere)
        subs = [pickle.loads(sub) for sub in envs.call("apply", _worker_env_chain)]
        if any(s is None for s in subs):
            return None
        # of the parent's own attributes, the spaces' generators, and its observations for
        # the replays' check (a view of the workers' shared memory: never restored)
        vector = {name: _plain(getattr(envs, name)) for name in _SPACES}
        vector["observations"] = _plain(np.asarray(envs.observations))
        return {"vector": vector, "envs": subs}
    if isinstance(envs, gym.vector.SyncVectorEnv) or getattr(envs, "in_process_envs", False):
        subs = [_env_chain(env) for env in envs.envs]
        if any(s is None for s in subs):
            return None
        return {"vector": _attributes(envs), "envs": subs}
    if type(envs).__name__ not in SAVEABLE_ENVS:
        return None
    return {"vector": _attributes(envs), "envs": []}


def env_state_loads(state: dict[str, Any]) -> bool:
    """Whether `state` can be restored here: a MuJoCo env's data loads only under the MuJoCo
    version that saved it."""
    versions = {
        layer[_MUJOCO_VERSION]
        for chain in state["envs"]
        for layer in chain
        if _MUJOCO_VERSION in layer
    }
    if not versions:
        return True
    import mujoco

    return versions == {mujoco.__version__}


def load_env_state(envs: gym.vector.VectorEnv, state: dict[str, Any]) -> None:
    """Restore what env_state saved (see env_state_loads first)."""
    for attributes in state.get("wrappers", []):
        _restore(envs, attributes)
        envs = envs.env
    vector = state["vector"]
    if isinstance(envs, gym.vector.AsyncVectorEnv):
        _restore(envs, {name: vector[name] for name in _SPACES})
        envs.set_attr("restoring", [pickle.dumps(chain) for chain in state["envs"]])
        _check_replays(envs.call("apply", _worker_load_chain), vector["observations"])
        return
    if isinstance(envs, LeanSyncVectorEnv):  # (its format-1 names)
        vector = lean_env_state(vector)
    _restore(envs, vector)
    if state["envs"]:
        ends = [
            _load_chain(env, chain) for env, chain in zip(envs.envs, state["envs"], strict=True)
        ]
        _check_replays(ends, vector.get("observations", vector.get("_observations")))


def _check_replays(ends: Sequence[Any], saved_obs: torch.Tensor | None) -> None:
    """Warn about each replayed episode (its end in `ends`; None where not replayed) that
    ended elsewhere than the observation saved."""
    for i, obs in enumerate(ends):
        if obs is not None and saved_obs is not None and not np.array_equal(obs, saved_obs[i]):
            print(
                f"rlstore: warning: env {i}'s replayed episode ended elsewhere than it "
                "was saved; the run goes on from the replay, not bitwise as it would have",
                file=sys.stderr,
            )


def _load_chain(env: gym.Env, chain: list[dict[str, Any]]) -> Any:
    """Restore one env from what _env_chain saved; the last observation of a replayed
    episode (None when it was not replayed)."""
    if _REPLAY in chain[0]:
        replay = chain[0][_REPLAY]
        return env.replay(replay["seed"], replay["generator"], replay["actions"].numpy())
    layer = env
    for attributes in chain:
        while isinstance(layer, CheckedEnv):  # (saved without it: _env_chain)
            layer = layer.env
        if _MJDATA in attributes:
            _restore_mjdata(layer, attributes[_MJDATA])
        _restore(
            layer, {k: v for k, v in attributes.items() if k not in (_MJDATA, _MUJOCO_VERSION)}
        )
        layer = getattr(layer, "env", None)
    return None


# Run inside an async vector env's workers, on each env's WorkerAccess (rlstore/envs.py):
# the access layer's own flag first, then the chain of the env beneath it. The chains cross
# the pipes pickled: the pipes' own pickler would pass tensors as shared memory, through a
# file-descriptor server that hangs between forked workers and their parent.


def _worker_env_chain(access: WorkerAccess) -> bytes:
    chain = _env_chain(access.env)
    return pickle.dumps(None if chain is None else [{"reset_due": access.reset_due}, *chain])


def _worker_load_chain(access: WorkerAccess) -> Any:
    chain, access.restoring = pickle.loads(access.restoring), None
    _restore(access, chain[0])
    return _load_chain(access.env, chain[1:])


def _env_chain(env: gym.Env) -> list[dict[str, Any]] | None:
    """Attributes of each wrapper layer down to the base env, or what replays its episode
    (an EpisodeRecorder's), or None if not saveable."""
    base = env.unwrapped
    if isinstance(env, EpisodeRecorder):
        if env.actions is None:  # (begun with reset options)
            return None
        actions = torch.from_numpy(np.array(env.actions))
        return [{_REPLAY: {"seed": env.reset_seed, "generator": env.generator, "actions": actions}}]
    if type(base).__name__ not in SAVEABLE_ENVS and not _is_mujoco(base):
        return None
    chain, layer = [], env
    while layer is not None:
        if not isinstance(layer, CheckedEnv):  # (no state of the env's)
            chain.append(_attributes(layer))
        layer = getattr(layer, "env", None) if isinstance(layer, gym.Wrapper) else None
    if _is_mujoco(base):
        import mujoco

        blob = bytearray(base.data.__getstate__())  # MjData's own pickled form
        chain[-1] |= {
            _MJDATA: torch.frombuffer(blob, dtype=torch.uint8),
            _MUJOCO_VERSION: mujoco.__version__,
        }
    return chain


def _restore_mjdata(env: gym.Env, blob: torch.Tensor) -> None:
    """Copy the saved MjData into the env's own (which its model and renderer hold)."""
    import mujoco

    saved = mujoco.MjData.__new__(mujoco.MjData)
    saved.__setstate__(blob.numpy().tobytes())
    if hasattr(mujoco, "mj_copyData"):
        mujoco.mj_copyData(env.data, env.model, saved)
    else:
        _copy_mjdata_fields(env.data, saved)


def _copy_mjdata_fields(data: Any, saved: Any) -> None:
    """mj_copyData for MuJoCo < 3.5, whose bindings lack it: the time and every array of the
    same shape (the integration state is among them, and the body positions the last step
    computed, which Ant's and Humanoid's rewards read). Arrays sized by the last step's
    constraints are skipped: the next step computes them anew."""
    data.time = saved.time
    for name in dir(saved):
        if name.startswith("_"):
            continue
        value = getattr(saved, name)
        if isinstance(value, np.ndarray):
            target = getattr(data, name)
            if target.shape == value.shape and target.flags.writeable:
                target[...] = value


def _attributes(obj: Any) -> dict[str, Any]:
    out = {}
    for name, value in vars(obj).items():
        if name in _SKIP or name == "env" or name == "envs":
            continue
        converted = _plain(value)
        if converted is not _UNSAVED:
            out[name] = converted
    return out


_UNSAVED = object()


def _plain(value: Any) -> Any:
    if value is None or isinstance(value, (bool, int, float, str)):
        return value
    if isinstance(value, np.generic):
        return value.item()
    if isinstance(value, np.ndarray):
        # numbers and flags; the rest (objects, FrozenLake's map of byte strings) is built
        # by the env's constructor
        return array_to_saved(value) if value.dtype.kind in "biufc" else _UNSAVED
    if isinstance(value, np.random.Generator):
        return {"__generator__": value.bit_generator.state}
    if isinstance(value, gym.Space):  # (np_random makes the generator of an unseeded space)
        return {"__space__": value.np_random.bit_generator.state}
    if isinstance(value, (list, tuple)):
        items = [_plain(v) for v in value]
        return _UNSAVED if any(v is _UNSAVED for v in items) else type(value)(items)
    return _UNSAVED


def _restore(obj: Any, attributes: dict[str, Any]) -> None:
    for name, value in attributes.items():
        current = getattr(obj, name, None)
        setattr(obj, name, _unplain(value, current))


def _unplain(value: Any, current: Any) -> Any:
    if isinstance(value, torch.Tensor) or (isinstance(value, dict) and "__unsigned__" in value):
        return saved_to_array(value)
    if isinstance(value, dict) and "__generator__" in value:
        generator = current if isinstance(current, np.random.Generator) else np.random.default_rng()
        generator.bit_generator.state = value["__generator__"]
        return generator
    if isinstance(value, dict) and "__space__" in value:
        if value["__space__"] is not None:
            current.np_random.bit_generator.state = value["__space__"]
        return current
    if isinstance(value, (list, tuple)):
        items = current if isinstance(current, (list, tuple)) else [None] * len(value)
        return type(value)(_unplain(v, c) for v, c in zip(value, items, strict=False))
    return value


# Envs whose state cannot be copied (a Box2D world) but whose episode replays exactly: the
# random generator as it began (or its reset seed) and its actions rebuild it in a fresh
# env. LunarLander's do (175 resume points checked, each continued to its episode's end or
# 300 steps); BipedalWalker's do not (its world carries state from episode to episode).
REPLAYED_ENVS = ("LunarLander",)


class EpisodeRecorder(gym.Wrapper):
    """Keeps how the current episode began and its actions, for a checkpoint to rebuild
    the env by `replay` (rlstore/env_snapshots.py). It cannot replay an episode begun with
    reset options (`actions` is then None until the next reset)."""

    def __init__(self, env: gym.Env) -> None:
        super().__init__(env)
        self.reset_seed, self.generator = None, None
        self.actions: list[np.ndarray] | None = None  # (no episode yet)

    def reset(
        self, *, seed: int | None = None, options: dict[str, Any] | None = None
    ) -> tuple[Any, dict[str, Any]]:
        self.reset_seed = seed
        self.generator = (
            None if seed is not None else self.env.unwrapped.np_random.bit_generator.state
        )
        self.actions = [] if not options else None
        return self.env.reset(seed=seed, options=options)

    def step(self, action: Any) -> tuple[Any, ...]:
        if self.actions is not None:
            self.actions.append(np.array(action))
        return self.env.step(action)

    def replay(self, seed: int | None, generator: dict | None, actions: np.ndarray) -> Any:
        """Rebuild the episode that began as `seed` or `generator` say and took `actions`;
        its last observation."""
        if seed is None:
            self.env.unwrapped.np_random.bit_generator.state = generator
        obs, _ = self.reset(seed=seed)
        for action in actions:
            obs = self.step(action)[0]
        return obs


# The metadata key that says an async vector env's envs are wrapped in WorkerAccess: asking
# a worker for an attribute its env lacks would end the worker.
WORKER_ACCESS = "rlstore_worker_access"


class WorkerAccess(gym.Wrapper):
    """The outermost wrapper of each env of an async vector env, in its worker process, where
    a checkpoint cannot reach the env itself: `apply` runs a function on the env there (so
    rlstore/checkpoint.py saves and restores it through `AsyncVectorEnv.call`). The worker
    keeps its NEXT_STEP autoreset flag to itself; `reset_due` mirrors it, so that an env
    restored at the end of an episode takes its reset at the next step, as the worker would
    have, instead of stepping on (a fresh worker's flag is down)."""

    def __init__(self, env: gym.Env) -> None:
        super().__init__(env)
        self.reset_due = False
        self.restoring: Any = None  # what the next `apply` restores (set through set_attr)

    def reset(
        self, *, seed: int | None = None, options: dict[str, Any] | None = None
    ) -> tuple[Any, dict[str, Any]]:
        self.reset_due = False
        return self.env.reset(seed=seed, options=options)

    def step(self, action: Any) -> tuple[Any, ...]:
        if self.reset_due:  # only after a restore: otherwise the worker resets first
            obs, info = self.reset()
            return obs, 0.0, False, False, info
        result = self.env.step(action)
        self.reset_due = bool(result[2] or result[3])
        return result

    def apply(self, function: Callable[[WorkerAccess], Any]) -> Any:
        return function(self)


def saves_state(env: gym.Env, spec: gym.envs.registration.EnvSpec) -> bool:
    """Whether checkpoints hold the state of `env` (one env of `spec`), so that a resumed
    run continues it bit for bit (elsewhere: with freshly reset envs)."""
    base = env.unwrapped
    return type(base).__name__ in SAVEABLE_ENVS or _is_mujoco(base) or replayed(spec)


def replayed(spec: gym.envs.registration.EnvSpec) -> bool:
    """Whether the env's episodes replay exactly (REPLAYED_ENVS)."""
    return str(spec.entry_point).rpartition(":")[2] in REPLAYED_ENVS
