"""PQN (rlstore/algos/pqn.py): its Q(lambda) targets, which the RolloutStorage's returns
give with V = max Q, against the backward recursion CleanRL's pqn.py writes, extended to
time limits and pseudo-steps; and its network's policy file."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

import rlstore
from rlstore.storage import RolloutStorage


def naive_q_lambda(rewards, values, next_value, terminated, truncated, valid, gamma, lam):
    """Env by env, backward over the real transitions:
        G_t = r_t                                          at a termination
        G_t = r_t + gamma V'_t                             at a truncation, or the last step
        G_t = r_t + gamma [(1 - lam) V'_t + lam G_{t+1}]   otherwise
    V'_t: max Q of the next observation (the final one at a done step, which the
    pseudo-step after it holds), values[t + 1] or, after the last step, next_value."""
    T, N = rewards.shape
    returns = np.full((T, N), np.nan)
    for n in range(N):
        later = None  # G of the next real transition of this episode, in the rollout
        for t in reversed(range(T)):
            if not valid[t, n]:
                later = None
                continue
            v_next = values[t + 1, n] if t + 1 < T else next_value[n]
            if terminated[t, n]:
                g = rewards[t, n]
            elif truncated[t, n] or later is None:
                g = rewards[t, n] + gamma * v_next
            else:
                g = rewards[t, n] + gamma * ((1 - lam) * v_next + lam * later)
            returns[t, n], later = g, g
    return returns


@settings(max_examples=40, deadline=None)
@given(
    seed=st.integers(0, 2**31),
    steps=st.integers(1, 12),
    envs=st.integers(1, 4),
    lam=st.sampled_from([0.0, 0.65, 1.0, 0.3]),
)
def test_the_storages_returns_with_max_q_values_are_pqns_q_lambda(seed, steps, envs, lam):
    rng = np.random.default_rng(seed)
    gamma = 0.99
    storage = RolloutStorage(steps, envs, (3,))
    storage.reset(rng.normal(size=(envs, 3)).astype(np.float32))
    values = rng.normal(size=(steps + 1, envs)).astype(np.float32)  # max Q at each obs
    flags = {k: np.zeros((steps, envs), bool) for k in ("terminated", "truncated", "valid")}
    rewards = np.zeros((steps, envs), np.float32)
    done = np.zeros(envs, bool)
    for t in range(steps):
        # after a done comes the pseudo-step: reward 0, no flags (Gymnasium's NEXT_STEP)
        terminated = ~done & (rng.random(envs) < 0.2)
        truncated = ~done & ~terminated & (rng.random(envs) < 0.2)
        rewards[t] = np.where(done, 0.0, rng.normal(size=envs))
        flags["terminated"][t], flags["truncated"][t], flags["valid"][t] = (
            terminated,
            truncated,
            ~done,
        )
        storage.insert(
            rng.normal(size=(envs, 3)).astype(np.float32),
            np.zeros(envs, np.int64),
            np.zeros(envs, np.float32),
            values[t],
            rewards[t],
            terminated,
            truncated,
        )
        done = terminated | truncated
    storage.compute_returns(values[steps], gamma, lam)
    want = naive_q_lambda(rewards, values, values[steps], **flags, gamma=gamma, lam=lam)
    valid = flags["valid"]
    np.testing.assert_allclose(storage.returns.numpy()[valid], want[valid], rtol=1e-5, atol=1e-5)


def test_q_lambda_by_hand():
    """One env, three steps, no done, gamma = lam = 0.5: rewards 1, 2, 3; max Q of the
    observations after each step 4, 8 and 16 (the last the bootstrap). G_2 = 3 + 0.5 * 16
    = 11; G_1 = 2 + 0.5 (0.5 * 8 + 0.5 * 11) = 6.75; G_0 = 1 + 0.5 (0.5 * 4 + 0.5 * 6.75)
    = 3.6875. (The value of the first observation is never used.)"""
    storage = RolloutStorage(3, 1, (1,))
    storage.reset(np.zeros((1, 1), np.float32))
    obs, action, no_log_prob, no = (
        np.zeros((1, 1), np.float32),
        np.zeros(1, np.int64),
        [0.0],
        [False],
    )
    for reward, value in [(1.0, 99.0), (2.0, 4.0), (3.0, 8.0)]:
        storage.insert(obs, action, no_log_prob, [value], [reward], no, no)
    storage.compute_returns(np.array([16.0]), 0.5, 0.5)
    torch.testing.assert_close(storage.returns[:, 0], torch.tensor([3.6875, 6.75, 11.0]))


@pytest.mark.parametrize("algo", ["pqn", "c51", "qrdqn", "rainbow"])
def test_a_value_method_policy_gives_greedy_actions_and_q_values(algo, tmp_path):
    """load_policy of a run: Q-values per action, actions their argmax (no noise)."""
    from tiny_runs import SETUPS, replace

    module, cfg = SETUPS[algo]
    result = module.train(replace(cfg, logdir=str(tmp_path), total_timesteps=cfg.steps_run))
    policy = rlstore.load_policy(result.run_dir)
    obs = np.random.default_rng(0).normal(size=(64, 4)).astype(np.float32)
    q = policy.q_values(obs)
    assert q.shape == (64, 2)
    np.testing.assert_array_equal(policy(obs), q.argmax(-1))
    np.testing.assert_array_equal(policy(obs), policy(obs))  # no noise between calls
