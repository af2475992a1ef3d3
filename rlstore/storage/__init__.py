"""Storage for on-policy (RolloutStorage) and off-policy (ReplayBuffer) algorithms."""

from rlstore.storage.hindsight import Hindsight
from rlstore.storage.priorities import SumTree
from rlstore.storage.recurrent import RecurrentBatch, RecurrentRolloutStorage
from rlstore.storage.replay import ReplayBatch, ReplayBuffer
from rlstore.storage.returns import compute_gae
from rlstore.storage.rollout import RolloutBatch, RolloutStorage

__all__ = [
    "Hindsight",
    "RecurrentBatch",
    "RecurrentRolloutStorage",
    "ReplayBatch",
    "ReplayBuffer",
    "RolloutBatch",
    "RolloutStorage",
    "SumTree",
    "compute_gae",
]
