"""The two file formats of a run, and what they are made of: atomic writes, the newest
valid checkpoint, RNG state (the envs' state: rlstore/env_snapshots.py).

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
import random
import re
import sys
from pathlib import Path
from typing import Any

import numpy as np
import torch

from rlstore.files import array_to_saved, atomic_save, safe_load, saved_to_array
from rlstore.storage.migrations import checkpoint_state

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


def remove_stale_temporaries(directory: Path) -> list[Path]:
    """Remove the temporary files (atomic_save's `.NAME.XXXXXXXX.tmp`) that a process
    killed while writing a checkpoint or model file into `directory` left there; the
    files removed. Only for the process that holds the run's lock: no other is writing."""
    stale = sorted(directory.glob(".*.pt.*.tmp")) if directory.is_dir() else []
    for path in stale:
        path.unlink(missing_ok=True)
    return stale


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
            return path, checkpoint_state(state)
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
                "key": array_to_saved(np_state["state"]["key"]),
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
            "state": {**np_state["state"], "key": saved_to_array(np_state["state"]["key"])},
        }
    )
    torch.set_rng_state(state["torch"])
    if "cuda" in state and torch.cuda.is_available():
        torch.cuda.set_rng_state_all(state["cuda"])


def _tuples(x: Any) -> Any:
    return tuple(_tuples(v) for v in x) if isinstance(x, (list, tuple)) else x
