"""The ReplayBuffer's pieces on their own (rlstore/storage/): n-step windows as a pure
function, the ring's streams and transition ids, the observation store, the samplers, and
the migrations of older files."""

import numpy as np
import pytest
import torch

from rlstore import ReplayBuffer
from rlstore.files import safe_load
from rlstore.storage.migrations import REPLAY_FORMAT, rollout_state
from rlstore.storage.observations import FlatObservations
from rlstore.storage.returns import n_step_windows
from rlstore.storage.ring import Ring
from rlstore.storage.samplers import PrioritizedSampler, UniformSampler
from tests.replay_fixtures import CASES, FOLDER, batches, build
from tests.test_replay_formats import same


def flags(size, **set_true):
    out = {name: np.zeros(size, bool) for name in ("terminated", "truncated", "bridge")}
    out["valid"] = np.ones(size, bool)
    for name, slots in set_true.items():
        out[name][slots] = name != "valid"
    return out


def test_n_step_windows_by_hand():
    """One env, six rows, gamma 0.5, n 3: a window stops after a termination (and says so),
    before the cursor row (invalid), and steps over a bridge."""
    rewards = np.array([1.0, 2.0, 3.0, 4.0, 5.0, 0.0])
    f = flags(6, terminated=[2], valid=[5])  # row 5: the cursor row
    args = (rewards, f["valid"], f["terminated"], f["truncated"], None, 1, 3, 0.5)
    returns, discount, terminated, end = n_step_windows(np.array([0, 3, 4]), *args)
    np.testing.assert_allclose(returns, [1 + 0.5 * 2 + 0.25 * 3, 4 + 0.5 * 5, 5])
    np.testing.assert_allclose(discount, [0.125, 0.25, 0.5])
    assert terminated.tolist() == [True, False, False]
    assert end.tolist() == [3, 5, 5]
    # a break row at 1 that the stream goes on over: the window skips it
    f = flags(6, valid=[1, 5], bridge=[1])
    returns, discount, terminated, end = n_step_windows(
        np.array([0]), rewards, f["valid"], f["terminated"], f["truncated"], f["bridge"], 1, 2, 0.5
    )
    assert (returns[0], discount[0], terminated[0], end[0]) == (1 + 0.5 * 3, 0.25, False, 3)
    # without the bridge flag the same break row ends the window
    returns, discount, _, end = n_step_windows(
        np.array([0]), rewards, f["valid"], f["terminated"], f["truncated"], None, 1, 2, 0.5
    )
    assert (returns[0], discount[0], end[0]) == (1.0, 0.5, 1)


def test_a_ring_follows_each_envs_stream():
    ring = Ring(rows=4, num_envs=2, action_shape=(), action_dtype=torch.int64, pseudo_steps=True)
    obs = np.array([[0.0], [1.0]], np.float32)
    assert ring.continues(obs, None).tolist() == [False, False]  # nothing written yet
    ring.write(np.zeros(2), np.ones(2), np.zeros(2, bool), np.zeros(2, bool), np.ones(2, bool))
    ring.streamed(obs, np.zeros(2, bool))
    assert ring.continues(obs.copy(), None) is None  # every env goes on
    other = np.array([[0.0], [7.0]], np.float32)
    assert ring.continues(other, None).tolist() == [True, False]
    ring.ended[:] = [True, False]  # (ReplayBuffer.end_episodes)
    assert ring.continues(obs.copy(), None).tolist() == [False, True]
    assert not ring.ended.any()  # told once
    ring.last_next_obs = None  # just loaded: compared with what the store holds
    assert ring.continues(obs, lambda: [obs.copy()]) is None
    assert (ring.cursor, ring.added, ring.count) == (1, 1, 2)


def test_transition_ids_tell_a_stored_transition_from_its_successor():
    ring = Ring(rows=3, num_envs=2, action_shape=(), action_dtype=torch.int64, pseudo_steps=True)
    yes, no = np.ones(2, bool), np.zeros(2, bool)
    ring.write(np.zeros(2), np.zeros(2), no, no, yes)
    ids = ring.transition_ids(np.array([0, 1]))  # row 0, the first write
    assert ids.tolist() == [0, 1] and ring.slots_of(ids)[1].all()
    for _ in range(3):  # row 0 is written again
        ring.write(np.zeros(2), np.zeros(2), no, no, yes)
    flat, stored = ring.slots_of(ids)
    assert flat.tolist() == [0, 1] and not stored.any()
    assert ring.slots_of(ring.transition_ids(np.array([0, 1])))[1].all()


def test_the_observation_store_keeps_parts_and_picks_one():
    shapes = {"image": (2, 2), "position": ()}
    dtypes = {"image": torch.uint8, "position": torch.int64}
    store = FlatObservations(3, 2, shapes, dtypes, torch.device("cpu"))
    row = {"image": np.full((2, 2, 2), 7, np.uint8), "position": np.array([4, 5])}
    store.put(1, store.checked(row, "obs"))
    got = store.get(np.array([2, 3]))  # row 1, both envs
    assert got["image"].dtype == torch.uint8 and (got["image"] == 7).all()
    assert got["position"].tolist() == [4, 5]
    assert store.get_host(np.array([3]), lambda tree: tree["position"]).tolist() == [5]
    with pytest.raises(ValueError, match="position"):
        store.checked({"image": row["image"], "position": np.zeros((2, 1), np.int64)}, "obs")
    assert FlatObservations.memory_bytes(6, shapes, dtypes) == 6 * (4 + 8)


def test_samplers_draw_only_what_can_be_sampled():
    ring = Ring(rows=5, num_envs=2, action_shape=(), action_dtype=torch.int64, pseudo_steps=True)
    for valid in ([True, False], [True, True], [False, True], [True, True]):
        no = np.zeros(2, bool)
        ring.write(np.zeros(2), np.zeros(2), no, no, np.array(valid))
    blocked = np.zeros(10, bool)
    blocked[2] = True  # (a frame stack that can no longer be rebuilt)
    generator = np.random.default_rng(0)
    flat, weights = UniformSampler().draw(4000, 0.4, ring, blocked, 5, generator)
    assert set(flat.tolist()) == {0, 3, 5, 6, 7} and (weights == 1).all()
    prioritized = PrioritizedSampler(5, 2, alpha=1.0, eps=0.0)
    for row in range(3):
        prioritized.written(row, 4, ring.host["valid"][row])
    prioritized.update(np.array([0]), np.array([3.0]))  # slot 0 three times as likely as 1...
    flat, _ = prioritized.draw(8000, 0.4, ring, None, 5, generator)
    counts = np.bincount(flat, minlength=10)
    assert set(np.flatnonzero(counts).tolist()) == {0, 2, 3, 5}
    assert counts[0] / counts[3] == pytest.approx(3.0, rel=0.1)


def test_a_version_1_file_without_the_keys_added_since_loads_the_same():
    """A file saved before autoreset modes, bridges, life losses and end_episodes were kept
    (no `format_version`, none of those keys): the migration fills them as the code of that
    time behaved, so the buffer samples what it sampled when saved."""
    state = safe_load(FOLDER / "plain-n-step.pt")  # (a stream of dones only)
    newest = (int(state["cursor"]) - 1) % state["valid"].shape[0]
    assert state["autoreset_mode"] == "next_step" and not state["bridge"].any()
    assert torch.equal(state["last_done"], state["terminated"][newest] | state["truncated"][newest])
    assert not state["ended"].any()
    for key in ("format_version", "autoreset_mode", "bridge", "last_done", "ended"):
        state.pop(key, None)
    buffer = build("plain-n-step")
    buffer.load_state_dict(state)
    same(batches(buffer, CASES["plain-n-step"]), safe_load(FOLDER / "plain-n-step.expected.pt"))


def test_files_of_a_newer_format_are_refused():
    buffer = ReplayBuffer(8, 1, (1,))
    state = buffer.state_dict() | {"format_version": REPLAY_FORMAT + 1}
    with pytest.raises(ValueError, match="newer rlstore"):
        buffer.load_state_dict(state)
    with pytest.raises(ValueError, match="newer rlstore"):
        rollout_state({"format_version": 99})


def test_a_version_1_rollout_without_lives_or_episode_starts_loads():
    """Rollouts saved before lives and episode starts were kept: no life was lost, and every
    step counted as a start (what recurrent policies assumed then)."""
    from rlstore import RolloutStorage

    storage = RolloutStorage(4, 2, obs_shape=(3,))
    storage.reset(np.zeros((2, 3), np.float32))
    for t in range(3):
        done = np.array([t == 1, False])
        step = (np.full((2, 3), t, np.float32), np.zeros(2, np.int64), np.zeros(2), np.zeros(2))
        storage.insert(*step, np.ones(2), done, np.zeros(2, bool))
    state = storage.state_dict()
    for key in ("format_version", "life_lost", "episode_starts"):
        del state[key]
    loaded = RolloutStorage(4, 2, obs_shape=(3,))
    loaded.load_state_dict(state)
    assert loaded.step == 3 and torch.equal(loaded.obs, storage.obs)
    assert torch.equal(loaded.valid, storage.valid)
    assert loaded.episode_starts.all() and not loaded.life_lost.any()
