"""The two file formats of a run, and what they are made of: atomic writes, the newest
valid checkpoint, RNG and environment state.

A checkpoint (`checkpoints/step_<global step>.pt`) holds everything a resumed run needs:

    format          CHECKPOINT_FORMAT
    algo, env_id    what wrote it
    global_step     env steps done; last_log_step: where the last update scalars went
    episodes        returns, lengths and global steps of every finished episode
    episode_stats   the episodes in progress (EpisodeStats.state_dict)
    wall_seconds    wall time of the run so far, over all its processes (absent before it
                    was added: counted as 0)
    rng             python, numpy and torch RNG states
    policy          the policy spec (rlstore.networks.policy_spec): what rebuilds the network
    algorithm       the algorithm's own state (rlstore.run.TrainingState.state_dict)
    evaluation      with --eval-every, every evaluation's result so far (the best among
                    them), rlstore.evaluate.Evaluator.state_dict; else None (or absent)

The final policy (`model.pt`) holds format POLICY_FORMAT, algo, env_id, global_step, the
config, the policy network's state_dict, its spec and its observation normalizer's
statistics (None without one). `read_policy` reads either file.

A finished run also writes `summary.json` (`write_summary`): algo, env_id, seed,
global_step, wall_seconds, the episodes and, with --eval-every, the evaluations, in JSON,
so that suites and scripts read a run's results without loading tensors.

Both are dicts of tensors and plain values written with torch.save and read with
torch.load(weights_only=True): loading executes no code. numpy arrays are stored as
tensors for that reason.
"""

from __future__ import annotations

import json
import os
import pickle
import random
import re
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import gymnasium as gym
import numpy as np
import torch

from rlstore.envs import WORKER_ACCESS, EpisodeRecorder, WorkerAccess
from rlstore.files import atomic_save, safe_load
from rlstore.lean import LeanSyncVectorEnv

CHECKPOINT_NAME = re.compile(r"^step_(\d+)\.pt$")
CHECKPOINT_FORMAT = "rlstore-checkpoint-2"
# Format 1 kept the episodes in progress inside the algorithm's state, as "stats".
CHECKPOINT_FORMATS = (CHECKPOINT_FORMAT, "rlstore-checkpoint-1")
POLICY_FORMAT = "rlstore-policy-1"
REQUIRED_KEYS = ("format", "algo", "env_id", "global_step", "rng", "policy", "algorithm")


def checkpoint_files(directory: Path) -> list[Path]:
    """step_*.pt files in `directory`, newest (highest step) first."""
    if not directory.is_dir():
        return []
    found = [
        (int(m.group(1)), p) for p in directory.iterdir() if (m := CHECKPOINT_NAME.match(p.name))
    ]
    return [p for _, p in sorted(found, reverse=True)]


def checkpoint_path(directory: Path, global_step: int) -> Path:
    """Where the checkpoint at `global_step` lives: directory/step_<12-digit step>.pt."""
    return Path(directory) / f"step_{global_step:012d}.pt"


def write_checkpoint(
    path: Path,
    *,
    algo: str,
    env_id: str,
    global_step: int,
    last_log_step: int,
    episodes: dict[str, list],
    episode_stats: dict[str, Any],
    wall_seconds: float,
    rng: dict[str, Any],
    policy: dict[str, Any],
    algorithm: dict[str, Any],
    evaluation: dict[str, Any] | None = None,
) -> None:
    """Write a checkpoint, atomically: the fields listed at the top of this module, and no
    others (this signature is their one list)."""
    fields = dict(
        algo=algo,
        env_id=env_id,
        global_step=global_step,
        last_log_step=last_log_step,
        episodes=episodes,
        episode_stats=episode_stats,
        wall_seconds=wall_seconds,
        rng=rng,
        policy=policy,
        algorithm=algorithm,
        evaluation=evaluation,
    )
    atomic_save({"format": CHECKPOINT_FORMAT, **fields}, path)


def read_newest_checkpoint(directory: Path) -> tuple[Path, dict[str, Any]] | None:
    """The newest checkpoint in `directory` that loads and is an rlstore checkpoint, in the
    current format; the ones skipped are reported on stderr."""
    for path in checkpoint_files(directory):
        try:
            state = safe_load(path)
            if not isinstance(state, dict) or not all(k in state for k in REQUIRED_KEYS):
                raise ValueError(f"{path} is not an rlstore checkpoint (keys missing)")
            if state["format"] not in CHECKPOINT_FORMATS:
                raise ValueError(f"{path} has the unknown format {state['format']!r}")
            if "episode_stats" not in state:  # format 1
                state["episode_stats"] = state["algorithm"].pop("stats")
            return path, state
        except ValueError as e:
            print(f"rlstore: warning: skipping {e}", file=sys.stderr)
    return None


def write_summary(
    path: Path,
    *,
    algo: str,
    env_id: str,
    seed: int,
    global_step: int,
    wall_seconds: float,
    episodes: dict[str, list],
    evaluations: list[dict[str, Any]] | None = None,
) -> None:
    """Write summary.json (the fields listed at the top of this module), atomically."""
    fields = dict(
        algo=algo,
        env_id=env_id,
        seed=seed,
        global_step=global_step,
        wall_seconds=wall_seconds,
        episodes=episodes,
    )
    if evaluations is not None:
        fields["evaluations"] = evaluations
    tmp = path.with_name(f".{path.name}.tmp")
    try:
        tmp.write_text(json.dumps(fields) + "\n")
        os.replace(tmp, path)
    except BaseException:
        tmp.unlink(missing_ok=True)  # (a full disk leaves a partial one)
        raise


def write_policy(
    path: Path,
    *,
    algo: str,
    env_id: str,
    global_step: int,
    config: dict[str, Any],
    state_dict: dict[str, Any],
    policy: dict[str, Any],
    obs_normalizer: dict[str, Any] | None,
) -> None:
    """Write model.pt (the fields listed at the top of this module), atomically."""
    fields = dict(
        algo=algo,
        env_id=env_id,
        global_step=global_step,
        config=config,
        state_dict=state_dict,
        policy=policy,
        obs_normalizer=obs_normalizer,
    )
    atomic_save({"format": POLICY_FORMAT, **fields}, path)


def read_policy(path: Path) -> dict[str, Any]:
    """The policy in a model file or a checkpoint, as model.pt's fields (a checkpoint's config
    comes from its run directory's config.json). ValueError when it is neither."""
    record = safe_load(path)
    if not isinstance(record, dict) or "policy" not in record:
        raise ValueError(f"{path} is neither an rlstore model nor a checkpoint")
    if record.get("format") == POLICY_FORMAT:
        return record
    config = Path(path).parent.parent / "config.json"
    return {
        "algo": record["algo"],
        "env_id": record["env_id"],
        "global_step": record["global_step"],
        "config": json.loads(config.read_text()) if config.is_file() else {},
        "state_dict": record["algorithm"]["model"],
        "policy": record["policy"],
        "obs_normalizer": record["algorithm"].get("obs_normalizer"),
    }


# -- numpy arrays ------------------------------------------------------------------------------

# torch.save in torch 2.4 (the oldest rlstore allows) cannot write uint16, uint32 or
# uint64 tensors ("dtype torch.uint32 is not recognized"), and numpy's global generator keeps
# its key as uint32: such arrays are saved as the signed integers of the same bits, with
# their dtype beside.
_SIGNED_OF = {
    np.dtype(np.uint16): np.int16,
    np.dtype(np.uint32): np.int32,
    np.dtype(np.uint64): np.int64,
}


def _array_to_tensor(array: np.ndarray) -> torch.Tensor | dict[str, Any]:
    """A copy of `array` that torch.save writes and torch.load(weights_only=True) reads."""
    signed = _SIGNED_OF.get(array.dtype)
    if signed is None:
        return torch.from_numpy(array.copy())
    return {"__unsigned__": torch.from_numpy(array.view(signed).copy()), "dtype": array.dtype.name}


def _tensor_to_array(saved: torch.Tensor | dict[str, Any]) -> np.ndarray:
    """The array `_array_to_tensor` saved (or a plain tensor's, as older checkpoints hold)."""
    if isinstance(saved, dict):
        return saved["__unsigned__"].numpy().view(np.dtype(saved["dtype"])).copy()
    return saved.numpy().copy()


# -- random number generators ----------------------------------------------------------------


def rng_state() -> dict[str, Any]:
    """Python, numpy and torch global RNG states (CUDA too when present)."""
    np_state = np.random.get_state(legacy=False)
    state = {
        "python": random.getstate(),
        "numpy": {
            **np_state,
            "state": {
                **np_state["state"],
                "key": _array_to_tensor(np_state["state"]["key"]),
            },
        },
        "torch": torch.get_rng_state(),
    }
    if torch.cuda.is_available():
        state["cuda"] = torch.cuda.get_rng_state_all()
    return state


def set_rng_state(state: dict[str, Any]) -> None:
    random.setstate(_tuples(state["python"]))
    np_state = state["numpy"]
    np.random.set_state(
        {
            **np_state,
            "state": {**np_state["state"], "key": _tensor_to_array(np_state["state"]["key"])},
        }
    )
    torch.set_rng_state(state["torch"])
    if "cuda" in state and torch.cuda.is_available():
        torch.cuda.set_rng_state_all(state["cuda"])


def _tuples(x: Any) -> Any:
    return tuple(_tuples(v) for v in x) if isinstance(x, (list, tuple)) else x


# -- environment state -------------------------------------------------------------------------

# Envs whose whole state is plain attributes (numbers, arrays, generators), Gymnasium's
# MuJoCo envs (plain attributes and their MjData) and the envs whose episodes replay
# (envs.REPLAYED_ENVS: LunarLander): these resume exactly, in sync or async vector envs
# (the latter through envs.WorkerAccess). Others (BipedalWalker, Atari) resume with freshly
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
    if isinstance(envs, (gym.vector.SyncVectorEnv, LeanSyncVectorEnv)):
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


# Format 1 checkpoints saved LeanSyncVectorEnv when it was a SyncVectorEnv subclass.
_RENAMED = {
    f"_{name}": name for name in ("observations", "rewards", "terminations", "truncations")
} | {"_autoreset_envs": "autoreset"}


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
    if isinstance(envs, LeanSyncVectorEnv):
        vector = {_RENAMED.get(k, k): v for k, v in vector.items() if k != "_env_obs"}
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
        return _array_to_tensor(value) if value.dtype.kind in "biufc" else _UNSAVED
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
        return _tensor_to_array(value)
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
