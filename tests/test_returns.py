"""GAE and returns: the hand-computed oracle of docs/reference/episode-boundaries.md, and a naive
reference on random inputs."""

import numpy as np
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from rlstore.storage import RolloutStorage, compute_gae

GAMMA, LAM = 0.99, 0.95


def oracle_inputs(truncated_at_1: bool):
    r = torch.tensor([[1.0], [1.0], [1.0]])
    v = torch.tensor([[0.5], [0.6], [0.7]])
    v_next = torch.tensor([[0.6], [2.0], [0.8]])
    flag = torch.tensor([[False], [True], [False]])
    none = torch.zeros_like(flag)
    term, trunc = (none, flag) if truncated_at_1 else (flag, none)
    return r, v, v_next, term, trunc


@pytest.mark.parametrize(
    "truncated, expected_adv, expected_ret",
    [
        (True, [3.33239, 2.38, 1.092], [3.83239, 2.98, 1.792]),
        (False, [1.4702, 0.4, 1.092], [1.9702, 1.0, 1.792]),
    ],
)
def test_design_oracle(truncated, expected_adv, expected_ret):
    r, v, v_next, term, trunc = oracle_inputs(truncated)
    adv = compute_gae(r, v, v_next, term, trunc, GAMMA, LAM)
    np.testing.assert_allclose(adv[:, 0].numpy(), expected_adv, atol=1e-5)
    np.testing.assert_allclose((adv + v)[:, 0].numpy(), expected_ret, atol=1e-5)


@pytest.mark.parametrize("truncated", [True, False])
def test_design_oracle_through_storage(truncated):
    """The oracle as a NEXT_STEP stream: the done step's next observation is the final one,
    its value (2.0) is computed at the pseudo-step, and the pseudo-step is left out."""
    storage = RolloutStorage(4, 1, obs_shape=(1,))
    storage.reset(np.zeros((1, 1), np.float32))
    #          t0     t1 (done)   pseudo   t2
    values = [0.5, 0.6, 2.0, 0.7]
    rewards = [1.0, 1.0, 0.0, 1.0]
    done = [False, True, False, False]
    for t in range(4):
        flag = np.array([done[t]])
        storage.insert(
            np.zeros((1, 1), np.float32),
            np.array([0]),
            np.zeros(1, np.float32),
            torch.tensor([values[t]]),
            np.array([rewards[t]]),
            flag & (not truncated),
            flag & truncated,
        )
    storage.compute_returns(torch.tensor([0.8]), GAMMA, LAM)
    assert storage.valid[:, 0].tolist() == [True, True, False, True]
    data = storage.flatten()
    expected_adv = [3.33239, 2.38, 1.092] if truncated else [1.4702, 0.4, 1.092]
    np.testing.assert_allclose(data["advantages"].numpy(), expected_adv, atol=1e-5)
    np.testing.assert_allclose(
        data["returns"].numpy(), np.add(expected_adv, [0.5, 0.6, 0.7]), atol=1e-5
    )


def test_a_lost_life_cuts_like_a_termination_but_the_game_goes_on():
    """A life lost at t = 1: the advantages are the oracle's terminated line, and the next
    step is a real transition (no reset, so no pseudo-step): three valid steps. The value
    after the life loss (2.0, unused by the masked bootstrap) is the next step's own."""
    storage = RolloutStorage(3, 1, obs_shape=(1,))
    storage.reset(np.zeros((1, 1), np.float32))
    no = np.zeros(1, bool)
    for t, (value, lost) in enumerate([(0.5, False), (0.6, True), (0.7, False)]):
        storage.insert(
            np.full((1, 1), t + 1, np.float32),
            np.array([0]),
            np.zeros(1, np.float32),
            torch.tensor([value]),
            np.array([1.0]),
            no,
            no,
            life_lost=np.array([lost]),
        )
    storage.compute_returns(torch.tensor([0.8]), GAMMA, LAM)
    assert storage.valid[:, 0].tolist() == [True, True, True]
    data = storage.flatten()
    np.testing.assert_allclose(data["advantages"].numpy(), [1.4702, 0.4, 1.092], atol=1e-5)
    np.testing.assert_allclose(data["returns"].numpy(), [1.9702, 1.0, 1.792], atol=1e-5)
    assert data["life_lost"].tolist() == [False, True, False]
    assert not data["terminated"].any()  # the env was not reset
    storage.after_update()  # a later rollout without lives does not keep stale flags
    for _ in range(3):
        storage.insert(
            np.zeros((1, 1), np.float32),
            np.array([0]),
            np.zeros(1, np.float32),
            torch.tensor([0.5]),
            np.array([1.0]),
            no,
            no,
        )
    assert not storage.life_lost.any()


def naive_gae(r, v, v_next, term, trunc, gamma, lam):
    """A_t = sum_k (gamma lam)^k delta_{t+k}, summing until the first done at or after t."""
    T, N = r.shape
    adv = np.zeros((T, N))
    for n in range(N):
        for t in range(T):
            total, discount = 0.0, 1.0
            for k in range(t, T):
                delta = r[k, n] + gamma * (0.0 if term[k, n] else v_next[k, n]) - v[k, n]
                total += discount * delta
                if term[k, n] or trunc[k, n]:
                    break
                discount *= gamma * lam
            adv[t, n] = total
    return adv


@settings(max_examples=60, deadline=None)
@given(
    T=st.integers(1, 12),
    N=st.integers(1, 4),
    gamma=st.floats(0.0, 1.0),
    lam=st.floats(0.0, 1.0),
    seed=st.integers(0, 2**31),
)
def test_gae_matches_naive_reference(T, N, gamma, lam, seed):
    rng = np.random.default_rng(seed)
    r, v, v_next = (rng.normal(size=(T, N)).astype(np.float32) for _ in range(3))
    kind = rng.integers(0, 4, size=(T, N))  # 0, 1: continue; 2: terminated; 3: truncated
    term, trunc = kind == 2, kind == 3
    adv = compute_gae(*(torch.from_numpy(x) for x in (r, v, v_next, term, trunc)), gamma, lam)
    np.testing.assert_allclose(
        adv.numpy(), naive_gae(r, v, v_next, term, trunc, gamma, lam), rtol=1e-4, atol=1e-4
    )


def naive_bootstrapped_returns(r, v_next, term, trunc, gamma):
    """R_t = r_t + gamma * (0 if terminated, V' if truncated or last step, else R_{t+1})."""
    T, N = r.shape
    ret = np.zeros((T, N))
    for n in range(N):
        for t in reversed(range(T)):
            if term[t, n]:
                ret[t, n] = r[t, n]
            elif trunc[t, n] or t == T - 1:
                ret[t, n] = r[t, n] + gamma * v_next[t, n]
            else:
                ret[t, n] = r[t, n] + gamma * ret[t + 1, n]
    return ret


def random_stream(storage, rng, T, N):
    """Insert T random steps. Returns the value V' each valid step must bootstrap from."""
    storage.reset(rng.normal(size=(N, 2)).astype(np.float32))
    for _ in range(T):
        kind = rng.integers(0, 5, size=N)
        storage.insert(
            rng.normal(size=(N, 2)).astype(np.float32),
            rng.integers(0, 3, size=N),
            rng.normal(size=N).astype(np.float32),
            rng.normal(size=N).astype(np.float32),
            rng.normal(size=N),
            kind == 3,
            kind == 4,
        )


@settings(max_examples=40, deadline=None)
@given(T=st.integers(1, 10), N=st.integers(1, 3), seed=st.integers(0, 2**31))
def test_storage_returns_without_gae_are_bootstrapped_discounted_sums(T, N, seed):
    rng = np.random.default_rng(seed)
    storage = RolloutStorage(T, N, obs_shape=(2,))
    random_stream(storage, rng, T, N)
    next_value = rng.normal(size=N).astype(np.float32)
    storage.compute_returns(next_value, 0.9, 0.5, use_gae=False)
    v = storage.values.numpy()
    v_next = np.concatenate([v[1:], next_value[None]])
    expected = naive_bootstrapped_returns(
        storage.rewards.numpy(), v_next, storage.terminated.numpy(), storage.truncated.numpy(), 0.9
    )
    valid = storage.valid.numpy()
    np.testing.assert_allclose(
        storage.returns.numpy()[valid], expected[valid], rtol=1e-4, atol=1e-4
    )


@settings(max_examples=40, deadline=None)
@given(T=st.integers(1, 10), N=st.integers(1, 3), seed=st.integers(0, 2**31))
def test_storage_gae_uses_next_slot_value_as_bootstrap(T, N, seed):
    rng = np.random.default_rng(seed)
    storage = RolloutStorage(T, N, obs_shape=(2,))
    random_stream(storage, rng, T, N)
    next_value = rng.normal(size=N).astype(np.float32)
    storage.compute_returns(next_value, GAMMA, LAM)
    v = storage.values.numpy()
    v_next = np.concatenate([v[1:], next_value[None]])
    expected = naive_gae(
        storage.rewards.numpy(),
        v,
        v_next,
        storage.terminated.numpy(),
        storage.truncated.numpy(),
        GAMMA,
        LAM,
    )
    valid = storage.valid.numpy()
    np.testing.assert_allclose(
        storage.advantages.numpy()[valid], expected[valid], rtol=1e-4, atol=1e-4
    )
    np.testing.assert_allclose(storage.returns.numpy(), storage.advantages.numpy() + v, atol=1e-5)


def test_compute_gae_in_numpy_is_the_torch_one_bit_for_bit():
    """RolloutStorage in host memory computes GAE on numpy arrays: the same arithmetic, in
    the same order, as on tensors."""
    rng = np.random.default_rng(0)
    T, N = 64, 5
    arrays = [rng.normal(size=(T, N)).astype(np.float32) for _ in range(3)]
    flags = [rng.random((T, N)) < 0.1 for _ in range(2)]
    on_host = compute_gae(*arrays, *flags, 0.99, 0.95)
    on_torch = compute_gae(
        *map(torch.from_numpy, arrays), *map(torch.from_numpy, flags), 0.99, 0.95
    )
    assert on_host.dtype == np.float32
    np.testing.assert_array_equal(on_host, on_torch.numpy())
