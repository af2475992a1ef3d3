"""Prioritized replay's parts: a sum tree over the buffer's slots, and the proportional
priorities kept in it (Schaul et al. 2016): new transitions enter at the largest priority
seen so far, a batch is drawn in proportion to priority^alpha, and its importance weights
are (N * P(i))^-beta divided by the batch's largest."""

from __future__ import annotations

import numpy as np
import torch


class SumTree:
    """A binary sum tree over `size` leaves (float64 numpy), with vectorized update and search."""

    def __init__(self, size: int) -> None:
        self.size = size
        self.capacity = 1 << max(size - 1, 0).bit_length()  # leaves, a power of two
        self.nodes = np.zeros(2 * self.capacity, dtype=np.float64)  # root at 1

    @property
    def total(self) -> float:
        return float(self.nodes[1])

    @property
    def leaves(self) -> np.ndarray:
        return self.nodes[self.capacity : self.capacity + self.size]

    SCALAR_UPDATE_MAX = 16  # below this many leaves a Python walk beats numpy's per-call cost

    def update(self, index: np.ndarray, value: np.ndarray) -> None:
        """Set leaves `index` to `value` (the last write wins for repeated indices).

        Each changed leaf's ancestors are recomputed as the sum of their two children, so
        the tree stays exact (no accumulated deltas).
        """
        nodes = self.nodes
        node = np.asarray(index, dtype=np.int64) + self.capacity
        nodes[node] = value
        if len(node) <= self.SCALAR_UPDATE_MAX:  # one add: a few leaves, walked one by one
            for parent in set((node >> 1).tolist()):
                while parent:
                    nodes[parent] = nodes[2 * parent] + nodes[2 * parent + 1]
                    parent >>= 1
            return
        node = np.unique(node >> 1)
        while node[0] >= 1:  # all leaves sit at one depth, so each level is one step up
            nodes[node] = nodes[2 * node] + nodes[2 * node + 1]
            node = np.unique(node >> 1)

    def find(self, mass: np.ndarray) -> np.ndarray:
        """For each prefix mass in [0, total), the leaf whose cumulative range contains it."""
        node = np.ones(len(mass), dtype=np.int64)
        mass = np.array(mass, dtype=np.float64)
        while node[0] < self.capacity:
            left = self.nodes[2 * node]
            right = mass >= left
            mass -= left * right
            node = 2 * node + right
        # Rounding can land on an empty leaf at the right edge: step back to a non-empty one.
        leaf = np.minimum(node - self.capacity, self.size - 1)
        empty = self.nodes[leaf + self.capacity] <= 0
        if empty.any():
            nonzero = np.flatnonzero(self.leaves > 0)
            pos = np.searchsorted(nonzero, leaf[empty]).clip(0, len(nonzero) - 1)
            leaf[empty] = nonzero[pos]
        return leaf


class Priorities:
    """The priorities of a replay buffer's flat slots (row * num_envs + env): priority^alpha
    in a sum tree, 0 for slots that hold no sampleable transition."""

    def __init__(self, slots: int, alpha: float, eps: float) -> None:
        self.tree, self.alpha, self.eps = SumTree(slots), alpha, eps
        self.max_priority = 1.0

    def add(self, flat: np.ndarray, valid: np.ndarray, cleared: np.ndarray) -> None:
        """New transitions in slots `flat` (the valid ones at the largest priority so far,
        the others at 0), and slots `cleared` emptied, in one tree update."""
        new = np.where(valid, self.max_priority**self.alpha, 0.0)
        self.tree.update(
            np.concatenate([flat, cleared]), np.concatenate([new, np.zeros(len(cleared))])
        )

    def clear(self, flat: np.ndarray) -> None:
        """Slots that can no longer be sampled."""
        self.tree.update(flat, np.zeros(len(flat)))

    def draw(
        self, batch_size: int, count: int, beta: float, generator: np.random.Generator
    ) -> tuple[np.ndarray, np.ndarray]:
        """(flat slots, importance weights) of a batch drawn in proportion to priority^alpha,
        one draw in each of `batch_size` equal parts of the total (stratified); `count` is
        the number of sampleable transitions."""
        total = self.tree.total
        mass = (np.arange(batch_size) + generator.random(batch_size)) * (total / batch_size)
        flat = self.tree.find(np.minimum(mass, np.nextafter(total, 0)))
        probs = self.tree.leaves[flat] / total
        weights = (count * probs) ** -beta
        weights /= weights.max()
        return flat, weights

    def update(self, flat: np.ndarray, td_errors: np.ndarray) -> None:
        """Set the slots' priorities to (|td error| + eps)^alpha."""
        if not len(flat):
            return
        priority = np.abs(td_errors) + self.eps
        self.max_priority = max(self.max_priority, float(priority.max()))
        self.tree.update(flat, priority**self.alpha)

    def leaves(self) -> torch.Tensor:
        """A copy of priority^alpha per slot, for a state dict."""
        return torch.from_numpy(self.tree.leaves.copy())

    def load(self, leaves: torch.Tensor, max_priority: float) -> None:
        self.tree.update(np.arange(self.tree.size), leaves.numpy())
        self.max_priority = max_priority
