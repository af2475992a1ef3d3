"""ReplayBuffer(frame_stack=k): each frame stored once, stacks rebuilt byte for byte.

The oracle is the plain ReplayBuffer (which stores whole observations and is tested
against a naive n-step reference in test_replay_buffer.py) fed the same stream: every
transition the frame buffer can sample must have the same observation, n-step target and
bootstrap observation there.
"""

import numpy as np
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from rlstore import ReplayBuffer

K = 4


class StackedStream:
    """NEXT_STEP vector stream of frame stacks: each frame a unique 2-byte id, a FIFO stack
    of K per env, padded at reset with zeros or with the reset frame (env conventions
    differ), random episode ends (terminations, truncations), life losses and manual resets.
    """

    def __init__(self, num_envs, rng, padding="zeros", done_prob=0.1, life_prob=0.05):
        self.N, self.rng, self.padding = num_envs, rng, padding
        self.done_prob, self.life_prob = done_prob, life_prob
        self.next_id = 1
        self.stacks = np.stack([self._reset_stack() for _ in range(num_envs)])
        self.prev_done = np.zeros(num_envs, dtype=bool)

    def _frame(self):
        frame_id, self.next_id = self.next_id, self.next_id + 1
        return np.array([[frame_id % 256, frame_id // 256]], dtype=np.uint8)

    def _reset_stack(self):
        first = self._frame()
        pad = np.zeros_like(first) if self.padding == "zeros" else first
        return np.stack([pad] * (K - 1) + [first])

    def step(self):
        """(obs, reward, next_obs, terminated, truncated, life_lost) of one vector step."""
        obs = self.stacks.copy()
        nxt = np.empty_like(obs)
        kind = self.rng.random(self.N)
        term = (kind < self.done_prob / 2) & ~self.prev_done
        trunc = (kind >= self.done_prob / 2) & (kind < self.done_prob) & ~self.prev_done
        life = (self.rng.random(self.N) < self.life_prob) & ~(term | trunc) & ~self.prev_done
        for e in range(self.N):
            if self.prev_done[e]:  # pseudo-step: the reset observation
                nxt[e] = self._reset_stack()
            else:
                nxt[e] = np.concatenate([obs[e, 1:], self._frame()[None]])
        reward = np.where(self.prev_done, 0.0, self.rng.integers(-2, 3, self.N)).astype(np.float32)
        self.stacks, self.prev_done = nxt, term | trunc
        return obs, reward, nxt, term, trunc, life

    def manual_reset(self, mask):
        for e in np.flatnonzero(mask):
            self.stacks[e] = self._reset_stack()
        self.prev_done &= ~mask


def feed(buffers, stream, steps, rng, reset_prob=0.0):
    for _ in range(steps):
        if reset_prob:
            stream.manual_reset(rng.random(stream.N) < reset_prob)
        obs, reward, nxt, term, trunc, life = stream.step()
        action = rng.integers(0, 3, stream.N)
        for buffer in buffers:
            buffer.add(obs, action, reward, nxt, term, trunc, life)


def assert_same_as_plain(frames: ReplayBuffer, plain: ReplayBuffer) -> int:
    """Every sampleable slot of `frames` is sampleable in `plain` with the same observation,
    n-step target and bootstrap observation; returns how many there are."""
    valid = np.flatnonzero(frames.ring.flat("valid") & ~frames.stacks.blocked())
    assert plain.ring.flat("valid")[valid].all()
    if len(valid) == 0:
        return 0
    assert torch.equal(frames.stored_obs(valid), plain.stored_obs(valid))
    got = frames.ring.windows(valid, frames.n_step, frames.gamma)
    want = plain.ring.windows(valid, plain.n_step, plain.gamma)
    for a, b in zip(got, want, strict=True):
        np.testing.assert_array_equal(a, b)
    assert torch.equal(frames.stored_obs(got[3]), plain.stored_obs(want[3]))
    return len(valid)


def pair(capacity, num_envs, n_step=3, prioritized=False, start_capacity=None, seed=0):
    kwargs = dict(
        capacity=capacity,
        num_envs=num_envs,
        obs_shape=(K, 1, 2),
        obs_dtype=np.uint8,
        n_step=n_step,
        prioritized=prioritized,
        seed=seed,
    )
    frames = ReplayBuffer(**kwargs, frame_stack=K, start_capacity=start_capacity)
    return frames, ReplayBuffer(**kwargs)


@settings(max_examples=40, deadline=None)
@given(
    num_envs=st.integers(1, 3),
    per_env=st.integers(K, 25),
    steps=st.integers(1, 150),
    n_step=st.integers(1, 4),
    padding=st.sampled_from(["zeros", "repeat"]),
    done_prob=st.sampled_from([0.0, 0.05, 0.3]),
    reset_prob=st.sampled_from([0.0, 0.05]),
    small_start_ring=st.booleans(),
    seed=st.integers(0, 10_000),
)
def test_frame_stacks_equal_whole_observations(
    num_envs, per_env, steps, n_step, padding, done_prob, reset_prob, small_start_ring, seed
):
    rng = np.random.default_rng(seed)
    start_capacity = 4 * num_envs if small_start_ring else None
    frames, plain = pair(per_env * num_envs, num_envs, n_step, start_capacity=start_capacity)
    feed([frames, plain], StackedStream(num_envs, rng, padding, done_prob), steps, rng, reset_prob)
    assert assert_same_as_plain(frames, plain) == len(frames)
    # Only the oldest k - 1 rows (their older frames are gone) and slots whose start stack
    # was overwritten are lost; with a roomy start ring that is all.
    if start_capacity is None:
        assert len(frames) >= len(plain) - (K - 1) * num_envs


def test_a_small_start_ring_drops_rows_it_can_no_longer_rebuild():
    rng = np.random.default_rng(1)
    frames, plain = pair(capacity=200, num_envs=2, start_capacity=8)
    feed([frames, plain], StackedStream(2, rng, done_prob=0.4), 300, rng)
    kept = assert_same_as_plain(frames, plain)
    assert 0 < kept < len(plain) - (K - 1) * 2  # some dropped, the rest exact


def test_each_frame_is_stored_once_and_a_million_transitions_fit_in_8_gb():
    buffer = ReplayBuffer(10_000, 1, (4, 84, 84), obs_dtype=np.uint8, frame_stack=4)
    frame_bytes = 84 * 84
    state = buffer.state_dict()  # the live tensors (and a flag per env)
    stored = sum(value.nbytes for value in state.values() if isinstance(value, torch.Tensor))
    per_transition = stored / buffer.capacity
    # one frame per row, plus a 3-frame start stack per 32 slots, plus the small fields
    assert per_transition == pytest.approx(frame_bytes * (1 + 3 / 32) + 33, rel=0.01)
    assert per_transition * 1_000_000 < 8e9
    assert buffer.stacks.frames.dtype == torch.uint8


def test_sampled_frame_stacks_are_uint8_and_equal_the_stream():
    rng = np.random.default_rng(2)
    frames, plain = pair(capacity=50, num_envs=2, prioritized=True, seed=3)
    feed([frames, plain], StackedStream(2, rng, done_prob=0.1), 80, rng)
    batch = frames.sample(64)
    assert batch.obs.dtype == torch.uint8 and batch.obs.shape == (64, K, 1, 2)
    write, env = np.divmod(batch.indices.numpy(), 2)
    flat = (write % frames.rows) * 2 + env
    assert torch.equal(batch.obs, plain.stored_obs(flat))


def test_save_load_of_a_frame_buffer_is_exact(tmp_path):
    rng = np.random.default_rng(3)
    frames, _ = pair(capacity=40, num_envs=2, prioritized=True, start_capacity=8)
    stream = StackedStream(2, rng, done_prob=0.2)
    feed([frames], stream, 70, rng)
    frames.save(tmp_path / "replay.pt")
    restored, _ = pair(capacity=40, num_envs=2, prioritized=True, start_capacity=8)
    restored.load(tmp_path / "replay.pt")
    saved, loaded = frames.state_dict(), restored.state_dict()
    for name, tensor in saved.items():
        if isinstance(tensor, torch.Tensor):
            assert torch.equal(loaded[name], tensor), name
    assert restored.stacks.starts_written == frames.stacks.starts_written
    feed([frames, restored], stream, 30, np.random.default_rng(4))  # both go on alike
    a, b = frames.sample(16), restored.sample(16)
    assert torch.equal(a.obs, b.obs) and torch.equal(a.next_obs, b.next_obs)
    _, plain = pair(capacity=40, num_envs=2, prioritized=True)
    with pytest.raises(ValueError, match="frame-stack and plain"):
        plain.load(tmp_path / "replay.pt")


def test_frame_stack_needs_stacked_observations():
    with pytest.raises(ValueError, match="frame_stack=4 needs observations of shape"):
        ReplayBuffer(10, 1, (84, 84), obs_dtype=np.uint8, frame_stack=4)
    with pytest.raises(ValueError, match="holds at least 4 transitions per env"):
        ReplayBuffer(6, 2, (4, 84, 84), obs_dtype=np.uint8, frame_stack=4)
    with pytest.raises(ValueError, match="start_capacity must be at least 4"):
        ReplayBuffer(10, 2, (4, 84, 84), obs_dtype=np.uint8, frame_stack=4, start_capacity=7)
