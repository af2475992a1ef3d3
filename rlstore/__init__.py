"""rlstore: a reference RL trainer built around correct, fast, resumable storage.

    from rlstore import RolloutStorage, ReplayBuffer, train_ppo, PPOConfig
    rlstore.train("ppo", env="CartPole-v1", total_timesteps=50_000)

Heavy modules (torch, gymnasium) load on first use, so `rlstore --help` starts quickly.
"""

from __future__ import annotations

import importlib
import os
import sys
from typing import Any

# Idle OpenMP threads sleep instead of spinning, so that runs sharing the cores do not
# collapse when a CNN run takes several threads (docs/guides/atari.md). OpenMP reads this once, when
# torch loads: set before any torch import, and only if the user has not chosen.
os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")

__version__ = "0.1.0"

if "gymnasium" in sys.modules:  # rlstore's own ids (partially observable, bit flipping)
    from rlstore.bit_flipping import register as _register_bit_flipping
    from rlstore.partially_observable import register as _register

    _register()
    _register_bit_flipping()

_EXPORTS = {
    "RolloutStorage": "rlstore.storage.rollout",
    "RolloutBatch": "rlstore.storage.rollout",
    "RecurrentRolloutStorage": "rlstore.storage.recurrent",
    "Hindsight": "rlstore.storage.hindsight",
    "ReplayBuffer": "rlstore.storage.replay",
    "ReplayBatch": "rlstore.storage.replay",
    "QNetwork": "rlstore.networks",
    "DQNConfig": "rlstore.algos.dqn",
    "resolve": "rlstore.presets",
    "train_dqn": ("rlstore.algos.dqn", "train"),
    "load_policy": "rlstore.policy",
    "Policy": "rlstore.policy",
    "evaluate": "rlstore.evaluate",
    "compute_gae": "rlstore.storage.returns",
    "ActorCritic": "rlstore.networks",
    "make_vec_env": "rlstore.envs",
    "EpisodeStats": "rlstore.episode_stats",
    "PPOConfig": "rlstore.algos.ppo",
    "A2CConfig": "rlstore.algos.a2c",
    "UsageError": "rlstore.errors",
    "train": "rlstore.api",
    "Callback": "rlstore.callbacks",
    "StopAtEvalReturn": "rlstore.callbacks",
    "train_ppo": ("rlstore.algos.ppo", "train"),
    "train_a2c": ("rlstore.algos.a2c", "train"),
    "SACConfig": "rlstore.algos.sac",
    "TD3Config": "rlstore.algos.td3",
    "train_sac": ("rlstore.algos.sac", "train"),
    "train_td3": ("rlstore.algos.td3", "train"),
    "DDPGConfig": "rlstore.algos.ddpg",
    "train_ddpg": ("rlstore.algos.ddpg", "train"),
    "PPOLSTMConfig": "rlstore.algos.ppo_lstm",
    "train_ppo_lstm": ("rlstore.algos.ppo_lstm", "train"),
}

__all__ = sorted(_EXPORTS)


def __getattr__(name: str) -> Any:
    target = _EXPORTS.get(name)
    if target is None:
        raise AttributeError(f"module 'rlstore' has no attribute '{name}'")
    module, attr = target if isinstance(target, tuple) else (target, name)
    return getattr(importlib.import_module(module), attr)
