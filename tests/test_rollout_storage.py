"""RolloutStorage: shapes and dtypes, errors, after_update, minibatch coverage, state_dict."""

import numpy as np
import pytest
import torch

from rlstore import RolloutStorage
from rlstore.parts import map_parts
from tests import obs_layouts
from tests.obs_layouts import LAYOUTS, decode, encode, tensors_equal

T, N = 6, 3


def step_args(rng, obs_shape=(4,), obs_dtype=np.float32, term=None, trunc=None, layout="box"):
    obs = rng.integers(0, 255, size=(N, *obs_shape)).astype(obs_dtype)
    return (
        obs if layout == "box" else encode(layout, obs),
        rng.integers(0, 2, size=N),
        rng.normal(size=N).astype(np.float32),
        rng.normal(size=N).astype(np.float32),
        np.ones(N, dtype=np.float64),  # SyncVectorEnv rewards are float64
        np.zeros(N, bool) if term is None else term,
        np.zeros(N, bool) if trunc is None else trunc,
    )


def storage_of(layout, width=4):
    """A storage of `width`-number observations, plain or made of parts
    (tests/obs_layouts.py)."""
    return RolloutStorage(
        T, N, obs_layouts.shape(layout, width), obs_dtype=obs_layouts.dtype(layout)
    )


def filled(rng, dones_every=None, layout="box"):
    storage = storage_of(layout)
    storage.reset(encode(layout, rng.normal(size=(N, 4))))
    for t in range(T):
        term = np.full(N, dones_every is not None and t % dones_every == 0)
        storage.insert(*step_args(rng, term=term, layout=layout))
    return storage


def test_shapes_dtypes_and_preallocation():
    storage = RolloutStorage(T, N, obs_shape=(84, 84, 4), obs_dtype=np.uint8)
    assert storage.obs.shape == (T + 1, N, 84, 84, 4) and storage.obs.dtype == torch.uint8
    assert storage.actions.shape == (T, N) and storage.actions.dtype == torch.int64
    cont = RolloutStorage(T, N, obs_shape=(3,), action_shape=(2,), action_dtype=torch.float32)
    assert cont.actions.shape == (T, N, 2) and cont.actions.dtype == torch.float32
    rng = np.random.default_rng(0)
    obs_ptr = storage.obs.data_ptr()
    storage.reset(np.zeros((N, 84, 84, 4), np.uint8))
    storage.insert(*step_args(rng, obs_shape=(84, 84, 4), obs_dtype=np.uint8))
    assert storage.obs.data_ptr() == obs_ptr  # written in place
    assert storage.obs.dtype == torch.uint8


def test_insert_past_the_end_and_bad_inputs_raise_clear_errors():
    rng = np.random.default_rng(0)
    storage = filled(rng)
    with pytest.raises(IndexError, match="full.*after_update"):
        storage.insert(*step_args(rng))
    storage.after_update()
    before = storage.state_dict()
    args = list(step_args(rng))
    bad_shape = args.copy()
    bad_shape[0] = np.zeros((N, 5), np.float32)
    bad_dtype = args.copy()
    bad_dtype[1] = np.zeros(N, np.float32)  # float actions into integer storage
    bad_flag = args.copy()
    bad_flag[5] = np.zeros(N, np.float32)
    for bad, error, message in [
        (bad_shape, ValueError, r"next_obs has shape \(3, 5\), expected \(3, 4\)"),
        (bad_dtype, TypeError, "action has dtype"),  # checked after next_obs...
        (bad_flag, TypeError, "terminated has dtype"),  # ...and after every tensor field
    ]:
        with pytest.raises(error, match=message):
            storage.insert(*bad)
        after = storage.state_dict()  # nothing was half-written past the failing check
        assert all(torch.equal(before[k], after[k]) for k in RolloutStorage._TENSORS)
        assert storage.step == 0
    images = RolloutStorage(T, N, obs_shape=(2,), obs_dtype=np.uint8)
    with pytest.raises(TypeError, match="next_obs has dtype torch.float32"):
        images.insert(*step_args(rng, obs_shape=(2,)))


@pytest.mark.parametrize("layout", LAYOUTS)
def test_after_update_carries_last_obs_and_episode_state(layout):
    rng = np.random.default_rng(1)
    storage = filled(rng, layout=layout)
    # The last step ends an episode: the next rollout's first step is a pseudo-step.
    storage.terminated[T - 1] = True
    storage.prev_done.fill_(True)
    last_obs = decode(layout, map_parts(lambda x: x[T].clone(), storage.obs))
    storage.after_update()
    assert storage.step == 0
    np.testing.assert_array_equal(decode(layout, storage.current_obs), last_obs)
    storage.insert(*step_args(rng, layout=layout))
    assert not storage.valid[0].any()
    storage.insert(*step_args(rng, layout=layout))
    assert storage.valid[1].all()


@pytest.mark.parametrize("layout", LAYOUTS)
def test_reset_forgets_episode_state(layout):
    rng = np.random.default_rng(2)
    storage = filled(rng, dones_every=1, layout=layout)
    storage.reset(encode(layout, np.ones((N, 4))))
    np.testing.assert_array_equal(decode(layout, storage.current_obs), np.ones((N, 4)))
    storage.insert(*step_args(rng, layout=layout))
    assert storage.valid[0].all()


@pytest.mark.parametrize("num_minibatches", [1, 2, 3, 5])
def test_minibatches_cover_each_valid_index_exactly_once_per_epoch(num_minibatches):
    rng = np.random.default_rng(3)
    storage = filled(rng, dones_every=2)  # dones at t = 0, 2, 4 -> pseudo-steps at 1, 3, 5
    storage.compute_returns(np.zeros(N, np.float32), 0.99, 0.95)
    # Tag each slot by its flat index through `values`, so a batch row says where it came from.
    storage.values.copy_(torch.arange(T * N, dtype=torch.float32).reshape(T, N))
    expected = set(np.flatnonzero(storage.valid.reshape(-1).numpy()).tolist())
    assert len(expected) == 3 * N
    orders = []
    for _ in range(2):
        seen = []
        batches = list(storage.minibatches(num_minibatches))
        assert len(batches) == num_minibatches
        sizes = [len(b.values) for b in batches]
        assert max(sizes) - min(sizes) <= 1
        for batch in batches:
            seen += batch.values.long().tolist()
            assert batch.obs.shape[1:] == (4,) and batch.actions.shape[1:] == ()
        assert sorted(seen) == sorted(expected)  # each valid index once, no pseudo-step
        orders.append(seen)
    assert orders[0] != orders[1]  # a fresh permutation each epoch


@pytest.mark.parametrize("layout", LAYOUTS)
def test_minibatches_rows_stay_aligned(layout):
    rng = np.random.default_rng(4)
    storage = filled(rng, layout=layout)
    storage.compute_returns(np.zeros(N, np.float32), 0.99, 0.95)
    vec = storage.obs if layout == "box" else storage.obs["vec"]
    flat_obs = vec[:T].reshape(-1, 4)
    flat_adv = storage.advantages.reshape(-1)
    for batch in storage.minibatches(4):
        obs_rows = torch.as_tensor(decode(layout, batch.obs))  # every part of the same row
        for obs, adv in zip(obs_rows, batch.advantages, strict=True):
            index = int((flat_obs == obs).all(-1).nonzero()[0])
            assert float(flat_adv[index]) == float(adv)


def test_minibatches_need_returns_and_full_rollout():
    rng = np.random.default_rng(5)
    storage = RolloutStorage(T, N, obs_shape=(4,))
    storage.insert(*step_args(rng))
    with pytest.raises(RuntimeError, match="full rollout"):
        storage.compute_returns(np.zeros(N, np.float32), 0.99, 0.95)
    with pytest.raises(RuntimeError, match="compute_returns"):
        next(storage.minibatches(2))


def test_flatten_hands_valid_transitions_to_user_code():
    rng = np.random.default_rng(6)
    storage = filled(rng, dones_every=3)  # dones at t = 0, 3 -> pseudo at 1, 4
    data = storage.flatten()
    assert "advantages" not in data
    assert data["obs"].shape == (4 * N, 4) and data["actions"].shape == (4 * N,)
    storage.compute_returns(np.zeros(N, np.float32), 0.99, 0.95)
    data = storage.flatten()
    torch.testing.assert_close(data["returns"], data["advantages"] + data["values"])


@pytest.mark.parametrize("layout", LAYOUTS)
def test_state_dict_round_trip_is_exact(layout):
    rng = np.random.default_rng(7)
    storage = filled(rng, dones_every=2, layout=layout)
    storage.compute_returns(np.ones(N, np.float32), 0.99, 0.95)
    state = storage.state_dict()
    other = storage_of(layout)
    other.load_state_dict(state)
    for name in RolloutStorage._TENSORS:
        assert tensors_equal(getattr(other, name), getattr(storage, name)), name
    assert other.step == storage.step
    g1, g2 = torch.Generator().manual_seed(0), torch.Generator().manual_seed(0)
    for a, b in zip(storage.minibatches(2, g1), other.minibatches(2, g2), strict=True):
        assert all(tensors_equal(x, y) for x, y in zip(a, b, strict=True))
    with pytest.raises(ValueError, match="state 'obs'"):
        storage_of(layout, width=5).load_state_dict(state)
    with pytest.raises(ValueError, match="state 'obs'"):
        storage_of("parts" if layout == "box" else "box").load_state_dict(state)


def stacked(fields):
    """k steps' arguments, each field stacked along a new first axis (parts too)."""
    if isinstance(fields[0], dict):
        return {key: stacked([f[key] for f in fields]) for key in fields[0]}
    if isinstance(fields[0], tuple):
        return tuple(stacked(list(part)) for part in zip(*fields))
    return np.stack(fields)


@pytest.mark.parametrize("layout", LAYOUTS)
@pytest.mark.parametrize("split", [[6], [2, 4], [1, 1, 3, 1], [5, 1]])
def test_insert_steps_is_insert_step_by_step(split, layout):
    """k steps in one insert_steps call leave the storage as k inserts do (dones in every
    position, so that each row's validity follows the one before), rejecting a call that
    would overflow the rollout."""
    rng = np.random.default_rng(7)
    first = encode(layout, rng.normal(size=(N, 4)))
    steps = [
        step_args(rng, term=rng.random(N) < 0.3, trunc=rng.random(N) < 0.2, layout=layout)
        for _ in range(T)
    ]
    one, many = storage_of(layout), storage_of(layout)
    one.reset(first)
    many.reset(first)
    for step in steps:
        one.insert(*step)
    done = 0
    for k in split:
        many.insert_steps(*(stacked(field) for field in zip(*steps[done : done + k])))
        done += k
    for name, value in one.state_dict().items():
        other = many.state_dict()[name]
        assert tensors_equal(value, other) if not isinstance(value, int | bool) else value == other
    with pytest.raises(IndexError, match="room for 0 more steps, not 1"):
        many.insert_steps(*(stacked(field) for field in zip(*steps[:1])))


def test_observations_made_of_parts_keep_their_dtypes_and_name_a_bad_part():
    rng = np.random.default_rng(8)
    storage = filled(rng, layout="parts")
    assert storage.obs["vec"].dtype == torch.float32
    assert [x.dtype for x in storage.obs["more"]] == [torch.uint8, torch.int64]
    assert storage.obs["more"][0].shape == (T + 1, N, 2, 3)
    storage.after_update()
    before = storage.state_dict()
    good = step_args(rng, layout="parts")
    missing = {"vec": good[0]["vec"]}
    wrong_dtype = {
        "vec": good[0]["vec"],
        "more": (good[0]["more"][0].astype(np.float32), good[0]["more"][1]),
    }
    for obs, message in [
        (missing, r"next_obs must be a dict with keys \['more', 'vec'\], got \['vec'\]"),
        (wrong_dtype, r"next_obs\['more'\]\[0\] has dtype torch.float32, expected torch.uint8"),
        (good[0]["vec"], "next_obs must be a dict"),
    ]:
        with pytest.raises((ValueError, TypeError), match=message):
            storage.insert(obs, *good[1:])
        assert all(
            tensors_equal(before[k], v)
            for k, v in storage.state_dict().items()
            if k in RolloutStorage._TENSORS
        )
