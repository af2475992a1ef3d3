"""Storage for on-policy (RolloutStorage) and off-policy (ReplayBuffer) algorithms."""

from rlstore.storage.priorities import SumTree
from rlstore.storage.replay import ReplayBatch, ReplayBuffer
from rlstore.storage.rollout import RolloutBatch, RolloutStorage, compute_gae

__all__ = [
    "ReplayBatch",
    "ReplayBuffer",
    "RolloutBatch",
    "RolloutStorage",
    "SumTree",
    "compute_gae",
]
