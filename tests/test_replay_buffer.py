"""ReplayBuffer: ring, episode boundaries, n-step against a naive reference, prioritized
replay and its sum tree, persistence."""

import gymnasium as gym
import numpy as np
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from rlstore import ReplayBuffer
from rlstore.envs import make_vec_env
from rlstore.storage import Hindsight, SumTree
from rlstore.storage.hindsight import GOAL_KEYS
from tests import obs_layouts
from tests.obs_layouts import LAYOUTS, decode, tensors_equal


def buffer_of(layout, **kwargs):
    """A buffer of one-number observations, plain or made of parts (tests/obs_layouts.py)."""
    shapes = dict(obs_shape=obs_layouts.shape(layout, 1), obs_dtype=obs_layouts.dtype(layout))
    return ReplayBuffer(**shapes, **kwargs)


def scalar_stream(buffer, steps, rng, done_prob=0.0, counter=None, reset_prob=0.0, layout="box"):
    """Add `steps` NEXT_STEP vector steps whose observations are unique ids (encoded as
    `layout` says: tests/obs_layouts.py).

    With `reset_prob`, each env is also reset by hand before a step with that probability
    (a partial reset, as `envs.reset(options={"reset_mask": m})` does): its stream is cut
    and its next step is a real one, even after a done.
    Returns the real transitions per env in order: [obs id, reward, next obs id, term,
    trunc, cut], where cut says that the env's stream was reset right after it.
    """
    N = buffer.num_envs
    counter = counter if counter is not None else [0]

    def fresh():
        counter[0] += N
        return np.arange(counter[0] - N, counter[0], dtype=np.float32)[:, None]

    obs, prev_done = fresh(), np.zeros(N, bool)
    transitions = [[] for _ in range(N)]
    for _ in range(steps):
        reset = rng.random(N) < reset_prob
        if reset.any():
            obs = np.where(reset[:, None], fresh(), obs)
            prev_done = prev_done & ~reset
            for e in np.flatnonzero(reset):
                if transitions[e]:
                    transitions[e][-1][5] = True
        next_obs = fresh()
        kind = rng.random(N)
        term = (kind < done_prob / 2) & ~prev_done
        trunc = (kind >= done_prob / 2) & (kind < done_prob) & ~prev_done
        reward = np.where(prev_done, 0.0, rng.normal(size=N)).astype(np.float32)
        encoded = obs_layouts.encode(layout, obs), obs_layouts.encode(layout, next_obs)
        buffer.add(encoded[0], rng.integers(0, 2, N), reward, encoded[1], term, trunc)
        for e in range(N):
            if not prev_done[e]:
                transitions[e].append(
                    [obs[e, 0], reward[e], next_obs[e, 0], term[e], trunc[e], False]
                )
        prev_done, obs = term | trunc, next_obs
    return transitions


@pytest.mark.parametrize("layout", LAYOUTS)
def test_ring_wraps_and_counts(layout):
    buffer = buffer_of(layout, capacity=6, num_envs=2, seed=0)
    assert len(buffer) == 0 and not buffer.ready(1)
    rng = np.random.default_rng(0)
    transitions = scalar_stream(buffer, 2, rng, layout=layout)
    assert len(buffer) == 4 and buffer.ready(4) and not buffer.ready(5)
    scalar_stream(buffer, 5, rng, counter=[100], layout=layout)  # a new stream: break, wrap
    assert len(buffer) == 6  # capacity reached, oldest overwritten
    kept = torch.as_tensor(decode(layout, buffer.sample(500).obs)[:, 0]).unique()
    assert len(kept) == 6 and kept.min() >= 100 + 2 * 2  # only the newest 3 steps x 2 envs
    assert not {float(t[0]) for env in transitions for t in env} & set(kept.tolist())


@pytest.mark.parametrize("vectorization", ["native", "sync"])
def test_truncated_transition_has_true_final_observation(vectorization):
    envs = make_vec_env("CartPole-v1", 2, seed=0, vectorization=vectorization, max_episode_steps=5)
    buffer = ReplayBuffer(capacity=200, num_envs=2, obs_shape=(4,), seed=0)
    obs, _ = envs.reset(seed=0)
    reference, prev_done = set(), np.zeros(2, bool)
    truncated_pairs = set()
    for _ in range(30):
        action = (obs[:, 2] > 0).astype(np.int64)  # balance: episodes end by the time limit
        next_obs, reward, term, trunc, _ = envs.step(action)
        buffer.add(obs, action, reward, next_obs, term, trunc)
        for e in range(2):
            if not prev_done[e]:
                pair = (obs[e].tobytes(), next_obs[e].tobytes())
                reference.add(pair)
                if trunc[e]:
                    truncated_pairs.add(pair)
        prev_done, obs = term | trunc, next_obs
    envs.close()
    assert len(buffer) == len(reference) == 2 * 25  # 30 steps minus 5 pseudo-steps per env
    batch = buffer.sample(3000)
    sampled = {
        (o.numpy().tobytes(), n.numpy().tobytes()) for o, n in zip(batch.obs, batch.next_obs)
    }
    assert sampled == reference  # every pair exact, no pseudo-step, nothing missing
    assert truncated_pairs and truncated_pairs <= sampled
    assert not batch.terminated.any()


class Episodes(gym.Env):
    """obs (env number, episode number, step in the episode); terminates after `length`
    steps when `terminate`, else runs until its time limit."""

    observation_space = gym.spaces.Box(0, 1000, (3,), np.float32)
    action_space = gym.spaces.Discrete(2)

    def __init__(self, number: int, length: int = 10, terminate: bool = True) -> None:
        self.number, self.length, self.terminate, self.episode = number, length, terminate, -1

    def _obs(self):
        return np.array([self.number, self.episode, self.count], np.float32)

    def reset(self, *, seed=None, options=None):
        super().reset(seed=seed)
        self.episode, self.count = self.episode + 1, 0
        return self._obs(), {}

    def step(self, action):
        self.count += 1
        return self._obs(), 1.0, self.terminate and self.count == self.length, False, {}


def cleanrl_client(buffer: ReplayBuffer, mode: gym.vector.AutoresetMode, steps: int) -> set:
    """A client as CleanRL's scripts are: env 0 terminates every 10 steps, env 1 is
    truncated every 7; under SAME_STEP autoreset, next_obs is the final observation at a
    truncation only (the reset one at a termination). The real transitions' pairs."""
    envs = gym.vector.SyncVectorEnv(
        [lambda: Episodes(0), lambda: gym.wrappers.TimeLimit(Episodes(1, terminate=False), 7)],
        autoreset_mode=mode,
    )
    obs, _ = envs.reset(seed=0)
    real, prev_done = set(), np.zeros(2, bool)
    same_step = mode == gym.vector.AutoresetMode.SAME_STEP
    for _ in range(steps):
        next_obs, reward, term, trunc, info = envs.step(np.zeros(2, np.int64))
        stored_next = next_obs.copy()
        for e in np.flatnonzero(trunc if same_step else []):
            stored_next[e] = info["final_obs"][e]
        buffer.add(obs, np.zeros(2, np.int64), reward, stored_next, term, trunc)
        real |= {
            (tuple(obs[e]), tuple(stored_next[e]), bool(term[e]))
            for e in range(2)
            if same_step or not prev_done[e]
        }
        obs, prev_done = next_obs, term | trunc
    return real


@pytest.mark.parametrize("mode", ["next_step", "same_step"])
def test_the_buffer_takes_either_autoreset_mode_when_told(mode):
    """SAME_STEP: every step is a transition, also the first of an episode after a
    termination, whose obs equals the next_obs passed (the reset observation); NEXT_STEP:
    the pseudo-steps are skipped. Told the mode, the buffer keeps every real transition and
    nothing else; a SAME_STEP stream taken for NEXT_STEP loses those first transitions (the
    data alone cannot tell them from pseudo-steps)."""
    gym_mode = {
        "next_step": gym.vector.AutoresetMode.NEXT_STEP,
        "same_step": gym.vector.AutoresetMode.SAME_STEP,
    }[mode]
    for told in (mode, gym_mode):
        buffer = ReplayBuffer(capacity=500, num_envs=2, obs_shape=(3,), seed=0, autoreset_mode=told)
        real = cleanrl_client(buffer, gym_mode, 100)
        assert len(buffer) == len(real) == (200 if mode == "same_step" else 200 - 9 - 12)
        batch = buffer.sample_host(5000)
        sampled = {
            (tuple(o), tuple(n), bool(t))
            for o, n, t in zip(batch.obs, batch.next_obs, batch.terminated)
        }
        assert sampled == real
    if mode == "same_step":
        untold = ReplayBuffer(capacity=500, num_envs=2, obs_shape=(3,), seed=0)
        cleanrl_client(untold, gym_mode, 100)
        assert len(untold) == 200 - 9  # env 0's first transition after each termination
        with pytest.raises(ValueError, match="autoreset_mode"):
            untold.load_state_dict(buffer.state_dict())
    with pytest.raises(ValueError, match="autoreset_mode must be"):
        ReplayBuffer(capacity=10, num_envs=1, obs_shape=(1,), autoreset_mode="same-step")


def test_stream_breaks_keep_the_previous_next_obs():
    """SAME_STEP-style streams (the next obs differs from the last next_obs) stay exact."""
    buffer = ReplayBuffer(capacity=10, num_envs=1, obs_shape=(1,), seed=0)
    a, f = np.zeros(1, np.int64), np.zeros(1, bool)
    buffer.add(np.array([[0.0]]), a, np.ones(1), np.array([[1.0]]), f, np.array([True]))
    buffer.add(np.array([[5.0]]), a, np.ones(1), np.array([[6.0]]), f, f)  # a reset obs
    batch = buffer.sample(200)
    pairs = {(float(o), float(n)) for o, n in zip(batch.obs[:, 0], batch.next_obs[:, 0])}
    assert pairs == {(0.0, 1.0), (5.0, 6.0)} and len(buffer) == 2


def test_n_step_window_stops_at_a_stream_break():
    """A manual reset mid-episode: windows end before the break, bootstrapping from the
    last observation of the old stream."""
    buffer = ReplayBuffer(capacity=10, num_envs=1, obs_shape=(1,), n_step=3, gamma=0.5, seed=0)
    a, f = np.zeros(1, np.int64), np.zeros(1, bool)
    for obs, next_obs in [(0.0, 1.0), (1.0, 2.0), (5.0, 6.0), (6.0, 7.0)]:
        buffer.add(np.array([[obs]]), a, np.ones(1), np.array([[next_obs]]), f, f)
    batch = buffer.sample(200)
    got = {
        float(o): (float(r), float(n), float(d))
        for o, r, n, d in zip(batch.obs[:, 0], batch.rewards, batch.next_obs[:, 0], batch.discounts)
    }
    assert got == {
        0.0: (1.5, 2.0, 0.25),
        1.0: (1.0, 2.0, 0.5),
        5.0: (1.5, 7.0, 0.25),
        6.0: (1.0, 7.0, 0.5),
    }


def naive_n_step(transitions, n, gamma):
    """obs id -> (n-step return, bootstrap obs id, gamma^k, terminated) from per-env lists."""
    out = {}
    for env_transitions in transitions:
        for j, (obs, *_rest) in enumerate(env_transitions):
            total, k, term = 0.0, 0, False
            while True:
                _, reward, next_obs, t, tr, cut = env_transitions[j + k]
                total += gamma**k * reward
                k += 1
                if t or tr or cut or k == n or j + k == len(env_transitions):
                    term = bool(t)
                    break
            out[float(obs)] = (total, float(next_obs), gamma**k, term)
    return out


@settings(max_examples=60, deadline=None)
@given(
    n=st.integers(1, 5),
    num_envs=st.integers(1, 3),
    steps=st.integers(1, 40),
    done_prob=st.floats(0.0, 0.5),
    reset_prob=st.sampled_from([0.0, 0.1, 0.3]),
    seed=st.integers(0, 2**31),
    layout=st.sampled_from(LAYOUTS),
)
def test_n_step_targets_match_naive_reference(
    n, num_envs, steps, done_prob, reset_prob, seed, layout
):
    """Random dones and random partial resets: every sampled target equals the naive one,
    and nothing else (no pseudo-step, no break row) is ever sampled. Observations made of
    parts: every part of obs and next_obs (the true final one at a truncation) is the
    right one."""
    rng = np.random.default_rng(seed)
    buffer = buffer_of(layout, capacity=1000, num_envs=num_envs, n_step=n, gamma=0.9, seed=seed)
    transitions = scalar_stream(buffer, steps, rng, done_prob, reset_prob=reset_prob, layout=layout)
    expected = naive_n_step(transitions, n, 0.9)
    assert len(buffer) == len(expected)
    batch = buffer.sample(3000)  # 3000 draws over at most 120 transitions: all of them
    obs = decode(layout, batch.obs)[:, 0]
    assert set(obs.tolist()) == set(expected)
    want = np.array([expected[o] for o in obs.tolist()], dtype=np.float64)
    np.testing.assert_allclose(batch.rewards.numpy(), want[:, 0], atol=1e-5)
    np.testing.assert_array_equal(decode(layout, batch.next_obs)[:, 0], want[:, 1])
    np.testing.assert_allclose(batch.discounts.numpy(), want[:, 2], rtol=1e-6)
    np.testing.assert_array_equal(batch.terminated.numpy(), want[:, 3].astype(bool))


def test_partial_reset_is_decided_env_by_env():
    """The issue's example: env 0 terminates, then only env 1 is reset by hand. Env 0's
    next step is a pseudo-step; env 1's old stream ends without a done."""
    b = ReplayBuffer(100, 2, (1,), seed=0)

    def f(a, c):
        return np.array([[a], [c]], np.float32)

    no, a0 = np.zeros(2, bool), np.zeros(2, np.int64)
    b.add(f(0, 10), a0, np.ones(2), f(1, 11), np.array([True, False]), no)  # env 0 terminates
    b.add(f(1, 50), a0, np.array([0.0, 1.0]), f(100, 51), no, no)  # only env 1 was reset
    assert len(b) == 3
    batch = b.sample(300)
    pairs = {(float(o), float(n)) for o, n in zip(batch.obs[:, 0], batch.next_obs[:, 0])}
    assert pairs == {(0.0, 1.0), (10.0, 11.0), (50.0, 51.0)}


def test_n_step_windows_go_on_over_another_envs_reset():
    """Env 1 is reset by hand mid-stream; env 0's 3-step windows are not cut by it."""
    b = ReplayBuffer(100, 2, (1,), n_step=3, gamma=0.5, seed=0)
    a0, no = np.zeros(2, np.int64), np.zeros(2, bool)
    steps = [((0, 10), (1, 11)), ((1, 50), (2, 51)), ((2, 51), (3, 52))]  # env 1 reset to 50
    for (o0, o1), (n0, n1) in steps:
        obs, nxt = np.array([[o0], [o1]], np.float32), np.array([[n0], [n1]], np.float32)
        b.add(obs, a0, np.ones(2), nxt, no, no)
    batch = b.sample(400)
    got = {
        float(o): (float(r), float(n), float(d))
        for o, r, n, d in zip(batch.obs[:, 0], batch.rewards, batch.next_obs[:, 0], batch.discounts)
    }
    assert got == {
        0.0: (1.75, 3.0, 0.125),  # 1 + 0.5 + 0.25 over the break row
        1.0: (1.5, 3.0, 0.25),
        2.0: (1.0, 3.0, 0.5),
        10.0: (1.0, 11.0, 0.5),  # cut by its own reset: bootstraps from 11
        50.0: (1.5, 52.0, 0.25),
        51.0: (1.0, 52.0, 0.5),
    }


def test_n_step_targets_across_a_life_loss_a_game_over_and_a_truncation():
    """Hand-computed 3-step targets (gamma 0.5, reward 1 each step) on one env's stream:
    1 -> 2 -> 3 (life lost) -> 4 -> 5 -> 6 (game over) | pseudo 6 -> 10 | 10 -> 11 -> 12
    (truncated) | pseudo 12 -> 20 | 20 -> 21. A lost life cuts the bootstrap but is no
    reset, so 3 -> 4 is a real transition; the game over and the truncation reset."""
    b = ReplayBuffer(100, 1, (1,), n_step=3, gamma=0.5, seed=0)
    steps = [  # obs, next obs, reward, terminated, truncated, life lost
        (1, 2, 1, 0, 0, 0),
        (2, 3, 1, 0, 0, 1),
        (3, 4, 1, 0, 0, 0),
        (4, 5, 1, 0, 0, 0),
        (5, 6, 1, 1, 0, 0),
        (6, 10, 0, 0, 0, 0),
        (10, 11, 1, 0, 0, 0),
        (11, 12, 1, 0, 1, 0),
        (12, 20, 0, 0, 0, 0),
        (20, 21, 1, 0, 0, 0),
    ]
    for obs, nxt, reward, term, trunc, lost in steps:
        b.add(
            np.array([[obs]], np.float32),
            np.zeros(1, np.int64),
            np.array([reward], float),
            np.array([[nxt]], np.float32),
            np.array([bool(term)]),
            np.array([bool(trunc)]),
            life_lost=np.array([bool(lost)]),
        )
    assert len(b) == 8  # ten adds, two pseudo-steps
    batch = b.sample(2000)
    got = {
        float(o): (float(r), float(n), float(d), bool(t))
        for o, r, n, d, t in zip(
            batch.obs[:, 0], batch.rewards, batch.next_obs[:, 0], batch.discounts, batch.terminated
        )
    }
    assert got == {
        1.0: (1.5, 3.0, 0.25, True),  # stops at the lost life: no bootstrap
        2.0: (1.0, 3.0, 0.5, True),
        3.0: (1.75, 6.0, 0.125, True),  # a new life: 3 -> 4 -> 5 -> 6, the game over
        4.0: (1.5, 6.0, 0.25, True),
        5.0: (1.0, 6.0, 0.5, True),
        10.0: (1.5, 12.0, 0.25, False),  # truncated: bootstraps from the final obs 12
        11.0: (1.0, 12.0, 0.5, False),
        20.0: (1.0, 21.0, 0.5, False),
    }


def test_a_life_lost_at_the_newest_step_survives_a_reload():
    """Saved right after a lost life, the reloaded buffer still takes the next step as a
    real transition (the flags alone would read it as a termination)."""
    no = np.zeros(1, bool)
    saved = ReplayBuffer(100, 1, (1,), seed=0)
    saved.add(
        np.array([[1.0]], np.float32),
        np.zeros(1, np.int64),
        np.ones(1),
        np.array([[2.0]], np.float32),
        no,
        no,
        life_lost=np.array([True]),
    )
    reloaded = ReplayBuffer(100, 1, (1,), seed=0)
    reloaded.load_state_dict(saved.state_dict())
    reloaded.add(
        np.array([[2.0]], np.float32),
        np.zeros(1, np.int64),
        np.ones(1),
        np.array([[3.0]], np.float32),
        no,
        no,
    )
    assert len(reloaded) == 2


def test_a_float64_stream_goes_on_across_a_reload():
    """MuJoCo's observations are float64 and stored as float32: reloaded, the buffer reads
    the next add as the stream going on (as the buffer never saved does), not as a break."""
    rng = np.random.default_rng(3)
    obs = rng.normal(size=(2, 3))
    kept, saved = ReplayBuffer(50, 2, (3,), seed=0), ReplayBuffer(50, 2, (3,), seed=0)
    no, act = np.zeros(2, bool), np.zeros(2, np.int64)
    for step in range(6):
        if step == 3:
            saved, reloaded = ReplayBuffer(50, 2, (3,), seed=0), saved
            saved.load_state_dict(reloaded.state_dict())
        nxt = rng.normal(size=(2, 3))
        for buffer in (kept, saved):
            buffer.add(obs, act, np.ones(2), nxt, no, no)
        obs = nxt
    assert len(saved) == len(kept) == 12
    for name, value in kept.state_dict().items():
        other = saved.state_dict()[name]
        assert torch.equal(value, other) if isinstance(value, torch.Tensor) else value == other


def test_n_step_never_reads_across_the_cursor_after_wrapping():
    rng = np.random.default_rng(1)
    buffer = ReplayBuffer(capacity=8, num_envs=1, obs_shape=(1,), n_step=4, gamma=0.5, seed=1)
    transitions = scalar_stream(buffer, 30, rng)  # wraps several times, no dones
    expected = naive_n_step([transitions[0][-8:]], 4, 0.5)  # the 8 kept, windows end at newest
    batch = buffer.sample(400)
    assert {float(x) for x in batch.obs[:, 0]} == set(expected)
    for obs, ret, nxt in zip(batch.obs[:, 0], batch.rewards, batch.next_obs[:, 0]):
        assert float(ret) == pytest.approx(expected[float(obs)][0], abs=1e-5)
        assert float(nxt) == expected[float(obs)][1]


@pytest.mark.parametrize("breaks", [False, True])
def test_uniform_sampling_is_uniform_over_valid_transitions(breaks):
    """Rejection sampling: pseudo-steps are never drawn, every transition equally often.
    With a break before every step (half the rows invalid) the exact fallback is used too."""
    rng = np.random.default_rng(5)
    buffer = ReplayBuffer(capacity=300, num_envs=3, obs_shape=(1,), seed=5)
    if breaks:
        a, f = np.zeros(3, np.int64), np.zeros(3, bool)
        for i in range(40):  # each add starts a new stream: a break row before it
            obs = np.arange(3 * i, 3 * i + 3, dtype=np.float32)[:, None]
            buffer.add(obs, a, np.ones(3), obs + 1000, f, f)
        expected = {float(x) for x in range(120)}
    else:
        transitions = scalar_stream(buffer, 60, rng, done_prob=0.3)
        expected = {float(t[0]) for env in transitions for t in env}
    assert len(buffer) == len(expected)
    draws = 60_000
    counts = np.unique(buffer.sample(draws).obs[:, 0].numpy(), return_counts=True)
    assert set(counts[0].tolist()) == expected
    p = 1 / len(expected)
    sigma = np.sqrt(draws * p * (1 - p))
    assert np.all(np.abs(counts[1] - draws * p) < 5 * sigma)


def test_prioritized_with_alpha_zero_is_uniform_with_unit_weights():
    rng = np.random.default_rng(2)
    buffer = ReplayBuffer(
        capacity=50, num_envs=1, obs_shape=(1,), prioritized=True, alpha=0.0, seed=2
    )
    scalar_stream(buffer, 10, rng)
    batch = buffer.sample(10)
    buffer.update_priorities(batch.indices, torch.as_tensor(rng.exponential(5.0, 10)))
    counts = np.zeros(10)
    for _ in range(200):
        batch = buffer.sample(50, beta=0.7)
        assert torch.all(batch.weights == 1.0)
        np.add.at(counts, batch.obs[:, 0].long().numpy(), 1)
    assert counts.min() > 0.8 * 1000 and counts.max() < 1.2 * 1000  # 10,000 draws over 10


def test_sampling_frequencies_follow_priority_to_the_alpha():
    rng = np.random.default_rng(3)
    alpha, beta = 0.7, 0.5
    buffer = ReplayBuffer(
        capacity=50,
        num_envs=2,
        obs_shape=(1,),
        prioritized=True,
        alpha=alpha,
        priority_eps=0.0,
        seed=3,
    )
    scalar_stream(buffer, 5, rng)
    indices = torch.as_tensor(np.flatnonzero(buffer.ring.valid.reshape(-1).numpy()))
    td = torch.arange(1, len(indices) + 1, dtype=torch.float32)
    buffer.update_priorities(indices, td)
    expected = td.numpy() ** alpha / (td.numpy() ** alpha).sum()
    draws = 40_000
    counts = np.zeros(len(indices))
    position = {int(i): k for k, i in enumerate(indices)}
    for _ in range(draws // 400):
        batch = buffer.sample(400, beta=beta)
        for i in batch.indices.tolist():
            counts[position[i]] += 1
        probs = expected[[position[i] for i in batch.indices.tolist()]]
        w = (len(indices) * probs) ** -beta
        np.testing.assert_allclose(batch.weights.numpy(), w / w.max(), rtol=1e-5)
    sigma = np.sqrt(draws * expected * (1 - expected))
    assert np.all(np.abs(counts - draws * expected) < 5 * sigma)


def test_a_new_transition_in_a_sampled_slot_keeps_the_max_priority():
    """Sample, let the ring overwrite the sampled slots, then update: the stale TD errors
    must not land on the new transitions, which entered with the max priority."""
    rng = np.random.default_rng(6)
    buffer = ReplayBuffer(4, 1, (1,), prioritized=True, alpha=1.0, priority_eps=0.0, seed=6)
    scalar_stream(buffer, 4, rng)
    batch = buffer.sample(32)
    buffer.update_priorities(batch.indices, torch.full((32,), 0.5))  # stored: 0.5 each
    assert set(buffer.priorities.tree.leaves[buffer.ring.flat("valid")].tolist()) == {0.5}
    batch = buffer.sample(32)
    scalar_stream(buffer, 5, rng, counter=[100])  # every sampled transition leaves
    buffer.update_priorities(batch.indices, torch.full((32,), 10.46))
    valid = buffer.ring.valid.reshape(-1).numpy()
    assert set(buffer.priorities.tree.leaves[valid].tolist()) == {1.0}  # the max priority seen
    assert buffer.priorities.max_priority == 1.0
    batch = buffer.sample(8)  # and transitions still stored are updated as before
    buffer.update_priorities(batch.indices, torch.full((8,), 3.0))
    assert buffer.priorities.max_priority == 3.0 and 3.0 in buffer.priorities.tree.leaves


@settings(max_examples=50, deadline=None)
@given(
    size=st.integers(1, 70),
    updates=st.lists(st.tuples(st.integers(0, 69), st.floats(0, 100)), max_size=60),
    seed=st.integers(0, 100),
)
def test_sum_tree_nodes_are_sums_of_their_leaves(size, updates, seed):
    tree = SumTree(size)
    leaves = np.zeros(size)
    rng = np.random.default_rng(seed)
    for index, value in updates:
        index %= size
        tree.update(np.array([index]), np.array([value]))
        leaves[index] = value
        # batched updates too, below and above the size where the numpy walk takes over
        count = 3 if rng.random() < 0.5 else SumTree.SCALAR_UPDATE_MAX + 10
        batch = rng.integers(0, size, count)
        values = rng.random(count)
        tree.update(batch, values)
        leaves[batch] = values  # last write wins in both
    assert tree.total == pytest.approx(leaves.sum())
    for node in range(1, tree.capacity):
        assert tree.nodes[node] == pytest.approx(tree.nodes[2 * node] + tree.nodes[2 * node + 1])
    if tree.total > 0:
        mass = rng.random(100) * tree.total
        found = tree.find(mass)
        cumulative = np.cumsum(leaves)
        assert np.all(leaves[found] > 0)
        expected = np.searchsorted(cumulative, mass, side="right")
        assert np.all((found == expected) | (leaves[np.minimum(expected, size - 1)] == 0))


def same_tensors(state, other) -> bool:
    """Whether two state dicts hold the same tensors (and trees of them) under each key."""
    tensors = [k for k, v in state.items() if isinstance(v, torch.Tensor | dict | tuple)]
    return all(tensors_equal(state[k], other[k]) for k in tensors if k != "rng")


@pytest.mark.parametrize("layout", LAYOUTS)
@pytest.mark.parametrize("prioritized", [False, True])
def test_save_load_restores_contents_cursor_priorities_exactly(prioritized, layout, tmp_path):
    rng = np.random.default_rng(4)
    kwargs = dict(capacity=20, num_envs=2, n_step=3, prioritized=prioritized, seed=4)
    kwargs |= dict(obs_shape=obs_layouts.shape(layout, 1), obs_dtype=obs_layouts.dtype(layout))
    buffer = ReplayBuffer(**kwargs)
    scalar_stream(buffer, 15, rng, done_prob=0.3, layout=layout)
    if prioritized:
        batch = buffer.sample(8)
        buffer.update_priorities(batch.indices, torch.as_tensor(rng.random(8)))
    buffer.save(tmp_path / "replay.pt")
    restored = ReplayBuffer(**kwargs)
    restored.load(tmp_path / "replay.pt")
    assert same_tensors(restored.state_dict(), buffer.state_dict())
    assert (restored.cursor, restored.added, len(restored)) == (
        buffer.cursor,
        buffer.added,
        len(buffer),
    )
    if prioritized:
        np.testing.assert_array_equal(restored.priorities.tree.nodes, buffer.priorities.tree.nodes)
        assert restored.priorities.max_priority == buffer.priorities.max_priority
    for a, b in zip(buffer.sample(16), restored.sample(16)):  # same RNG state: same batch
        assert tensors_equal(a, b)
    # the stream goes on across the reload: no break row (compared part by part)
    scalar_stream(buffer, 3, np.random.default_rng(5), counter=[30], layout=layout)
    scalar_stream(restored, 3, np.random.default_rng(5), counter=[30], layout=layout)
    assert restored.added == buffer.added
    assert same_tensors(restored.state_dict(), buffer.state_dict())
    with pytest.raises(ValueError, match="prioritized and uniform"):
        ReplayBuffer(**{**kwargs, "prioritized": not prioritized}).load(tmp_path / "replay.pt")
    for name, other in [("n_step", 1), ("gamma", 0.5), ("alpha", 0.3)]:
        with pytest.raises(ValueError, match=f"saved buffer has {name}="):
            ReplayBuffer(**{**kwargs, name: other}).load(tmp_path / "replay.pt")


@pytest.mark.parametrize("layout", LAYOUTS)
@pytest.mark.parametrize("prioritized, n_step", [(False, 1), (True, 3)])
def test_sample_host_is_sample_as_numpy(prioritized, n_step, layout):
    """The same draws and values as sample(), as numpy arrays, for twin buffers."""
    kwargs = dict(capacity=40, num_envs=2, n_step=n_step, prioritized=prioritized, seed=9)
    buffers = [buffer_of(layout, **kwargs), buffer_of(layout, **kwargs)]
    for buffer in buffers:
        scalar_stream(buffer, 50, np.random.default_rng(3), done_prob=0.2, layout=layout)
    for _ in range(3):
        batch, host = buffers[0].sample(16, beta=0.5), buffers[1].sample_host(16, beta=0.5)
        for name in ("obs", "next_obs"):
            np.testing.assert_array_equal(
                decode(layout, getattr(batch, name)), decode(layout, getattr(host, name))
            )
        batch, host = (
            batch._replace(obs=None, next_obs=None),
            host._replace(obs=None, next_obs=None),
        )
        for name, value in batch._asdict().items():
            if value is None:
                continue
            other = getattr(host, name)
            assert isinstance(other, np.ndarray), name
            assert other.dtype == value.numpy().dtype, name
            np.testing.assert_array_equal(other, value.numpy(), err_msg=name)
    frames = ReplayBuffer(64, 1, (4, 8, 8), obs_dtype=np.uint8, frame_stack=4)
    with pytest.raises(ValueError, match="flat observations in host memory"):
        frames.sample_host(4)


def test_capacity_is_rounded_up_to_whole_rows():
    buffer = ReplayBuffer(capacity=10, num_envs=4, obs_shape=(1,), seed=0)
    assert buffer.capacity == 12
    rng = np.random.default_rng(0)
    scalar_stream(buffer, 20, rng)
    assert len(buffer) == 12  # all 10 asked for are kept, never fewer


def test_uint8_observations_stay_uint8_and_memory_per_transition():
    buffer = ReplayBuffer(capacity=1000, num_envs=4, obs_shape=(84, 84, 4), obs_dtype=np.uint8)
    assert buffer.obs.dtype == torch.uint8
    tensors = [v for v in buffer.state_dict().values() if isinstance(v, torch.Tensor)]
    per_transition = sum(t.nbytes for t in tensors) / buffer.capacity
    assert per_transition < 1.01 * (84 * 84 * 4 + 8 + 4 + 3)  # one observation, not two


def test_bad_arguments():
    with pytest.raises(ValueError, match="n_step"):
        ReplayBuffer(10, 1, (1,), n_step=0)
    with pytest.raises(ValueError, match="alpha"):
        ReplayBuffer(10, 1, (1,), alpha=1.5)
    buffer = ReplayBuffer(10, 2, (3,))
    with pytest.raises(ValueError, match=r"obs has shape \(2, 4\)"):
        buffer.add(
            np.zeros((2, 4)),
            np.zeros(2, np.int64),
            np.zeros(2),
            np.zeros((2, 3)),
            np.zeros(2, bool),
            np.zeros(2, bool),
        )
    with pytest.raises(ValueError, match="empty buffer"):
        buffer.sample(1)


@pytest.mark.parametrize(
    "kwargs",
    [
        dict(capacity=1000, num_envs=1, obs_shape=(4,)),
        dict(capacity=999, num_envs=4, obs_shape=(3, 2), obs_dtype=np.float64, prioritized=True),
        dict(capacity=500, num_envs=2, obs_shape=(2,), action_shape=(3,), action_dtype=np.float32),
        dict(capacity=5000, num_envs=3, obs_shape=(4, 8, 8), obs_dtype=np.uint8, frame_stack=4),
        dict(
            capacity=64,
            num_envs=1,
            obs_shape=(2, 5, 5),
            obs_dtype=np.uint8,
            frame_stack=2,
            prioritized=True,
        ),
        dict(
            capacity=300,
            num_envs=2,
            obs_shape=obs_layouts.shape("parts", 3),
            obs_dtype=obs_layouts.dtype("parts"),
        ),
        dict(
            capacity=301,
            num_envs=3,
            obs_shape=dict.fromkeys(GOAL_KEYS, (3,)),
            obs_dtype=dict.fromkeys(GOAL_KEYS, np.float32),
            hindsight=True,
        ),
    ],
)
def test_memory_bytes_is_what_a_buffer_allocates(kwargs):
    hindsight = Hindsight(lambda achieved, desired, info: 0.0) if kwargs.get("hindsight") else None
    buffer = ReplayBuffer(**{**kwargs, "hindsight": hindsight})
    obs = buffer.stacks.frames if buffer.frame_stack else buffer.obs
    if hindsight is not None:  # three float32 parts
        obs = torch.cat([part.flatten() for part in obs.values()])
    elif isinstance(obs, dict):  # parts: vec float32, pixels uint8, code int64
        parts = [obs["vec"], *obs["more"]]
        assert [p.dtype for p in parts] == [torch.float32, torch.uint8, torch.int64]
        obs = torch.cat([p.flatten().view(torch.uint8) for p in parts])
    ring = buffer.ring
    host = [ring.actions, ring.rewards, ring.terminated, ring.truncated, ring.valid, ring.bridge]
    if buffer.frame_stack:
        host += [buffer.stacks.depth, buffer.stacks.start_slot, buffer.stacks.start_owner]
        host += [buffer.stacks.lost]
    host_bytes = sum(t.nbytes for t in host) + (
        buffer.priorities.tree.nodes.nbytes if buffer.priorities else 0
    )
    if hindsight is not None:
        episodes = buffer.relabelling.episodes
        host_bytes += sum(getattr(episodes, n).nbytes for n in ("start", "end", "running"))
    assert ReplayBuffer.memory_bytes(**kwargs) == (obs.nbytes, host_bytes)


def test_add_one_is_add_for_a_one_env_stream():
    """add_one (a one-env stream that goes on, from Python scalars) leaves the buffer as
    add() does, over wrap-arounds, terminations, truncations and their pseudo-steps."""
    rng = np.random.default_rng(8)
    general, scalar = (ReplayBuffer(30, 1, (3,), seed=1) for _ in range(2))
    obs = rng.normal(size=(1, 3)).astype(np.float32)
    done = False
    for t in range(100):
        next_obs = rng.normal(size=(1, 3)).astype(np.float32)
        action, reward = int(rng.integers(0, 4)), float(rng.normal())
        terminated, truncated = bool(rng.random() < 0.1), bool(rng.random() < 0.05)
        if done:  # the pseudo-step: reward 0, no flags
            reward, terminated, truncated = 0.0, False, False
        general.add(
            obs,
            np.array([action]),
            np.array([reward]),
            next_obs,
            np.array([terminated]),
            np.array([truncated]),
        )
        if t == 0:  # the first add starts the stream
            scalar.add(
                obs,
                np.array([action]),
                np.array([reward]),
                next_obs,
                np.array([terminated]),
                np.array([truncated]),
            )
        else:
            scalar.add_one(action, reward, next_obs, terminated, truncated)
        obs, done = next_obs, terminated or truncated
        assert len(scalar) == len(general)
        np.testing.assert_array_equal(scalar.last_done, general.last_done)
    for name, value in general.state_dict().items():
        other = scalar.state_dict()[name]
        same = torch.equal(value, other) if isinstance(value, torch.Tensor) else value == other
        assert same, name


def test_box_actions_come_back_exactly_with_their_transitions():
    """Continuous actions (float32 vectors, as SAC and TD3 store them) are sampled with the
    transition they were taken in: each sampled (obs, action, reward, next_obs) is one that
    was added, across an episode end and its pseudo-step, through sample and sample_host."""
    rng = np.random.default_rng(11)
    buffer = ReplayBuffer(64, 2, (3,), action_shape=(2,), action_dtype=np.float32, seed=4)
    added = {}
    obs = rng.normal(size=(2, 3)).astype(np.float32)
    done = np.zeros(2, dtype=bool)
    for t in range(40):
        action = rng.uniform(-2, 2, size=(2, 2)).astype(np.float32)
        reward = rng.normal(size=2)
        next_obs = rng.normal(size=(2, 3)).astype(np.float32)
        terminated = np.array([t % 9 == 8, False])
        truncated = np.array([False, t % 13 == 12])
        reward[done] = 0.0  # the pseudo-step after a done
        buffer.add(obs, action, reward, next_obs, terminated & ~done, truncated & ~done)
        for env in np.flatnonzero(~done):
            added[obs[env].tobytes()] = (action[env], np.float32(reward[env]), next_obs[env])
        done = (terminated | truncated) & ~done
        obs = next_obs
    for batch in (buffer.sample(256), buffer.sample_host(256)):
        obs_, actions, rewards, next_ = (np.asarray(x) for x in batch[:4])
        assert actions.dtype == np.float32 and actions.shape == (256, 2)
        for i in range(256):
            action, reward, next_obs = added[obs_[i].tobytes()]
            np.testing.assert_array_equal(actions[i], action)
            assert rewards[i] == reward
            np.testing.assert_array_equal(next_[i], next_obs)


@pytest.mark.parametrize("told", [False, True])
def test_end_episodes_cuts_a_stream_the_data_cannot_show(told):
    """A SAME_STEP client whose reset observation equals the last next_obs ([2]): without
    end_episodes the two episodes read as one stream (a 3-step window from [0] runs into
    the next episode); told, the window stops at the cut and bootstraps from [2]."""
    buffer = ReplayBuffer(100, 1, (1,), n_step=3, gamma=0.5, autoreset_mode="same_step", seed=0)
    no = np.zeros(1, bool)
    for obs, reward, next_obs in ((0, 1, 1), (1, 2, 2), (2, 4, 3), (3, 8, 4)):
        if obs == 2 and told:
            buffer.end_episodes(np.array([True]))
        buffer.add(np.full((1, 1), obs), [0], [reward], np.full((1, 1), next_obs), no, no)
    batch = buffer.sample(200)
    first = batch.obs[:, 0] == 0
    rewards, discounts = batch.rewards[first].unique(), batch.discounts[first].unique()
    next_obs = batch.next_obs[first].unique()
    if told:  # 1 + 0.5 * 2, then the cut
        assert (rewards.tolist(), discounts.tolist(), next_obs.tolist()) == ([2.0], [0.25], [2])
        assert len(buffer) == 4
    else:  # 1 + 0.5 * 2 + 0.25 * 4 over the reset
        assert (rewards.tolist(), discounts.tolist(), next_obs.tolist()) == ([3.0], [0.125], [3])
    state = buffer.state_dict()
    assert not state["ended"].any()
    buffer.end_episodes()
    copy = ReplayBuffer(100, 1, (1,), n_step=3, gamma=0.5, autoreset_mode="same_step")
    copy.load_state_dict(buffer.state_dict())
    assert copy.state_dict()["ended"].all()
    with pytest.raises(ValueError, match="envs must be 1 booleans"):
        buffer.end_episodes(np.ones(2, bool))
