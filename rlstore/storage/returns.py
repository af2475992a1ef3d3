"""Returns of a rollout, as pure functions of its (T, N) arrays: generalized advantage
estimates (PPO, A2C, recurrent PPO; RolloutStorage.compute_returns).

Terminated and truncated are kept apart (docs/reference/episode-boundaries.md): a
termination bootstraps with 0, a truncation from the value of the final observation.
"""

from __future__ import annotations

import numpy as np
import torch

from rlstore.storage.arrays import Array


def compute_gae(
    rewards: Array,
    values: Array,
    next_values: Array,
    terminated: Array,
    truncated: Array,
    gamma: float,
    gae_lambda: float,
) -> Array:
    """Generalized advantage estimates over a (T, N) rollout, terminated/truncated kept apart.

        delta_t = r_t + gamma * (1 - terminated_t) * V'_t - V_t
        A_t     = delta_t + gamma * lambda * (1 - done_t) * A_{t+1},   A_T = 0

    `next_values[t]` is V'_t: V of the next observation, which is the final observation
    when the episode was truncated at t. Returns A; the returns are A + V. Takes torch
    tensors or numpy arrays (the same arithmetic).
    """
    xp = np if isinstance(values, np.ndarray) else torch  # host arrays: numpy's cheaper calls
    if xp is np:
        not_terminated = 1.0 - terminated.astype(values.dtype)
        not_done = 1.0 - (terminated | truncated).astype(values.dtype)
    else:
        not_terminated = 1.0 - terminated.to(values.dtype)
        not_done = 1.0 - (terminated | truncated).to(values.dtype)
    deltas = rewards + gamma * not_terminated * next_values - values
    carry = gamma * gae_lambda * not_done
    advantages = xp.empty_like(values)
    last = xp.zeros_like(values[0])
    for t in range(values.shape[0] - 1, -1, -1):
        last = deltas[t] + carry[t] * last
        advantages[t] = last
    return advantages
