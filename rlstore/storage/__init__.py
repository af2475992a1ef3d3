"""Storage for on-policy (RolloutStorage) and, later, off-policy (ReplayBuffer) algorithms."""

from rlstore.storage.rollout import RolloutBatch, RolloutStorage, compute_gae

__all__ = ["RolloutBatch", "RolloutStorage", "compute_gae"]
