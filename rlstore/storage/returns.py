"""Returns as pure functions of the storages' arrays: generalized advantage estimates over a
rollout's (T, N) arrays (PPO, A2C, recurrent PPO; RolloutStorage.compute_returns), and n-step
windows over a replay ring's flat fields (the DQN family; ReplayBuffer.sample).

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


def n_step_windows(
    index: np.ndarray,
    rewards: np.ndarray,
    valid: np.ndarray,
    terminated: np.ndarray,
    truncated: np.ndarray,
    bridge: np.ndarray | None,
    num_envs: int,
    n: int,
    gamma: float,
) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """Discounted reward sums over windows of up to `n` steps of a replay ring, from its
    flat slots `index` (row * num_envs + env; one row ahead is + num_envs, around the ring).

    The arrays are the ring's flat (rows * num_envs) fields. A window stops after its first
    done (terminated or truncated) and at an invalid slot (the cursor row, a pseudo-step, a
    break: it never reads across the write cursor); it goes on over a `bridge` slot (a break
    row its env's stream continues through; None: there is none). Returns the sums, gamma^k
    with the window's real length k, whether it ended by termination, and the flat slot of
    the observation it bootstraps from.
    """
    size, N = len(valid), num_envs
    returns = rewards[index].astype(np.float64)
    discount = np.full(len(index), gamma)
    ended_terminated = terminated[index]
    open_ = ~(ended_terminated | truncated[index])
    end = (index + N) % size
    for _ in range(1, n):
        slot = end
        while bridge is not None and bridge[slot].any():  # the stream goes on after it
            slot = np.where(bridge[slot], (slot + N) % size, slot)
        open_ &= valid[slot]
        returns += open_ * discount * rewards[slot]
        discount = np.where(open_, discount * gamma, discount)
        end = np.where(open_, (slot + N) % size, end)
        term = terminated[slot]
        ended_terminated = ended_terminated | (open_ & term)
        open_ &= ~(term | truncated[slot])
    return returns, discount, ended_terminated, end
