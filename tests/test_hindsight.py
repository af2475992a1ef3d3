"""Hindsight experience replay in the ReplayBuffer, against a naive reference written from
the paper (Andrychowicz et al. 2017): the reference keeps each env's episodes as explicit
lists of transitions and says which goals may relabel a transition; the buffer's batches
must draw only those, uniformly, with the rewards and terminations the env's functions give.

Every observation has a unique id, used as its `observation` and its `achieved_goal`, so a
relabelled goal names exactly the step it came from."""

import copy

import numpy as np
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from rlstore.storage import Hindsight, ReplayBuffer

SHAPES = {"observation": (1,), "achieved_goal": (1,), "desired_goal": (1,)}


def reached(achieved, desired, info):
    """A sparse reward: 0 on reaching the goal, else -1 (the paper's)."""
    assert len(info) == len(achieved)
    return -(np.abs(achieved - desired).sum(-1) > 0).astype(np.float64)


def success(achieved, desired, info):
    return np.abs(achieved - desired).sum(-1) == 0


def goal_buffer(capacity, num_envs, strategy="future", goals=4, terminations=False, **kwargs):
    hindsight = kwargs.pop("hindsight", None) or Hindsight(
        reached, success if terminations else None, goals, strategy
    )
    obs_dtype = {key: np.float32 for key in SHAPES}
    return ReplayBuffer(
        capacity,
        num_envs,
        SHAPES,
        obs_dtype,
        action_shape=(1,),
        action_dtype=np.float32,
        hindsight=hindsight,
        **kwargs,
    )


class Reference:
    """The episodes of each env's stream as lists of transitions, written from the paper,
    knowing of the buffer only that it keeps the transitions of its last rows - 1 rows (a
    vector step writes one row, a stream break one more)."""

    def __init__(self, num_envs, rows):
        self.rows, self.writes = rows, 0
        self.running = [[] for _ in range(num_envs)]
        self.episodes = []  # finished ones
        self.where = {}  # a transition's obs id -> (its episode, its place in it)

    def stored(self, transition):
        return transition["write"] > self.writes - self.rows

    def end(self, env):
        if self.running[env]:
            self.episodes.append(self.running[env])
        self.running[env] = []

    def add(self, env, transition):
        transition["write"] = self.writes
        episode = self.running[env]
        self.where[transition["obs"]] = (episode, len(episode))
        episode.append(transition)
        if transition["terminated"] or transition["truncated"]:
            self.end(env)

    def goals(self, obs_id, strategy):
        """The goals (next observations' ids) that may relabel the transition from obs_id."""
        episode, place = self.where[obs_id]
        kept = [t for t in episode if self.stored(t)]
        if strategy == "final":
            return [kept[-1]["next_obs"]]
        if strategy == "future":
            kept = [t for t in episode[place:] if self.stored(t)]
        return [t["next_obs"] for t in kept]


def goal_stream(buffer, reference, steps, rng, done_prob=0.2, reset_prob=0.0, start=None):
    """NEXT_STEP vector steps of unique observation ids into the buffer and the reference.
    With reset_prob, an env's stream is also cut by hand before a step (a partial reset,
    or a resume without the env's state), abandoning its episode. Goes on from `start`,
    a previous call's return (else from a reset); returns where it stopped."""
    N = buffer.num_envs
    counter = [1] if start is None else [start[0]]

    def fresh(n):
        counter[0] += n
        return np.arange(counter[0] - n, counter[0], dtype=np.float32)

    def observe(ids, desired):
        return {
            "observation": ids[:, None],
            "achieved_goal": ids[:, None],
            "desired_goal": desired[:, None],
        }

    if start is None:
        obs, desired, prev_done = fresh(N), -fresh(N), np.zeros(N, bool)
    else:
        obs, desired, prev_done = (x.copy() for x in start[1:])
    for _ in range(steps):
        reset = (rng.random(N) < reset_prob) & (reference.writes > 0)
        if reset.any():
            obs, desired = np.where(reset, fresh(N), obs), np.where(reset, -fresh(N), desired)
            prev_done &= ~reset
            for env in np.flatnonzero(reset):
                reference.end(env)
            reference.writes += 1  # the break row
        next_obs = fresh(N)
        kind = rng.random(N)
        term = (kind < done_prob / 2) & ~prev_done
        trunc = (kind >= done_prob / 2) & (kind < done_prob) & ~prev_done
        reward = np.where(prev_done, 0.0, rng.normal(size=N)).astype(np.float32)
        next_desired = np.where(prev_done, -fresh(N), desired)  # a reset draws a new goal
        buffer.add(
            observe(obs, desired),
            rng.uniform(-1, 1, (N, 1)),
            reward,
            observe(next_obs, next_desired),
            term,
            trunc,
        )
        for env in np.flatnonzero(~prev_done):
            transition = dict(
                obs=float(obs[env]),
                next_obs=float(next_obs[env]),
                desired=float(desired[env]),
                reward=float(reward[env]),
                terminated=bool(term[env]),
                truncated=bool(trunc[env]),
            )
            reference.add(env, transition)
        reference.writes += 1
        prev_done, obs, desired = term | trunc, next_obs, next_desired
    return counter[0], obs, desired, prev_done


def check_batch(buffer, reference, batch, strategy, terminations=False):
    """Every transition of the batch against the reference; the (obs, goal) pairs drawn."""
    n = buffer.hindsight.relabelled(len(batch.rewards))
    obs = {key: np.asarray(part)[:, 0] for key, part in batch.obs.items()}
    nxt = {key: np.asarray(part)[:, 0] for key, part in batch.next_obs.items()}
    np.testing.assert_array_equal(obs["observation"], obs["achieved_goal"])
    pairs = []
    for i in range(len(obs["observation"])):
        episode, place = reference.where[float(obs["observation"][i])]
        real = episode[place]
        assert reference.stored(real)
        assert nxt["observation"][i] == real["next_obs"]  # the true final one at a truncation
        assert nxt["desired_goal"][i] == obs["desired_goal"][i]
        goal = float(obs["desired_goal"][i])
        if i < n:
            assert goal in reference.goals(real["obs"], strategy), (real, goal)
            assert float(batch.rewards[i]) == (0.0 if goal == real["next_obs"] else -1.0)
            ends = goal == real["next_obs"] if terminations else real["terminated"]
            assert bool(batch.terminated[i]) == ends
            pairs.append((real["obs"], goal))
        else:
            assert goal == real["desired"]
            assert float(batch.rewards[i]) == np.float32(real["reward"])
            assert bool(batch.terminated[i]) == real["terminated"]
        assert float(batch.discounts[i]) == np.float32(0.99)
    return pairs


@settings(max_examples=40, deadline=None)
@given(
    num_envs=st.integers(1, 3),
    capacity=st.integers(3, 40),
    steps=st.integers(1, 60),
    done_prob=st.sampled_from([0.0, 0.1, 0.4]),
    reset_prob=st.sampled_from([0.0, 0.1]),
    strategy=st.sampled_from(["future", "final", "episode"]),
    goals=st.integers(0, 5),
    terminations=st.booleans(),
    seed=st.integers(0, 10_000),
)
def test_relabelled_goals_come_from_the_transitions_own_episode(
    num_envs, capacity, steps, done_prob, reset_prob, strategy, goals, terminations, seed
):
    """With random terminations, truncations, partial resets and the ring wrapping: every
    relabelled goal was reached in the transition's own episode of its own env, at or after
    it (future), at its last stored step (final) or at any stored step (episode); never at
    another env's, another episode's, or a pseudo-step; rewards and terminations recomputed,
    the rest of the batch as stored."""
    buffer = goal_buffer(capacity, num_envs, strategy, goals, terminations, seed=seed)
    reference = Reference(num_envs, buffer.rows)
    goal_stream(buffer, reference, steps, np.random.default_rng(seed), done_prob, reset_prob)
    if len(buffer):
        check_batch(buffer, reference, buffer.sample(64), strategy, terminations)


@pytest.mark.parametrize("strategy", ["future", "episode"])
def test_goals_are_drawn_uniformly_over_the_allowed_steps(strategy):
    """Pooled chi-square of the (transition, goal) counts against uniform draws over each
    transition's allowed goals (bridges of other envs' resets included in the stream)."""
    buffer = goal_buffer(200, 2, strategy, goals=1_000_000, seed=3)
    reference = Reference(2, buffer.rows)
    goal_stream(buffer, reference, 60, np.random.default_rng(3), 0.15, reset_prob=0.05)
    counts = {}
    for _ in range(60):
        for pair in check_batch(buffer, reference, buffer.sample(512), strategy):
            counts[pair] = counts.get(pair, 0) + 1
    per_obs = {}
    for (obs, _), count in counts.items():
        per_obs[obs] = per_obs.get(obs, 0) + count
    chi2, dof = 0.0, 0
    for obs, total in per_obs.items():
        allowed = reference.goals(obs, strategy)
        expected = total / len(allowed)
        chi2 += sum((counts.get((obs, g), 0) - expected) ** 2 / expected for g in allowed)
        dof += len(allowed) - 1
    assert dof > 300
    assert chi2 < dof + 5 * np.sqrt(2 * dof), (chi2, dof)


def test_an_abandoned_episode_never_lends_goals_to_the_next():
    """SB3's HerReplayBuffer merges an episode cut by a reset (a second learn(), a resume)
    with the next one unless truncate_last_trajectory() is called; here the stream says
    where the episode ended."""
    buffer = goal_buffer(100, 1, "episode", goals=1_000_000, seed=0)
    reference = Reference(1, buffer.rows)
    where = goal_stream(buffer, reference, 5, np.random.default_rng(0), 0.0)
    first = {t["next_obs"] for t in reference.running[0]}
    reference.end(0)  # a new stream: fresh ids from a reset
    reference.writes += 1  # (its break row)
    start = (where[0] + 10, where[1] + 1000, where[2], where[3])
    goal_stream(buffer, reference, 5, np.random.default_rng(1), 0.0, start=start)
    second = {t["next_obs"] for t in reference.running[0]}
    batch = buffer.sample(1000)
    n = buffer.hindsight.relabelled(len(batch.rewards))
    obs, goal = batch.obs["observation"][:n, 0], batch.obs["desired_goal"][:n, 0]
    from_first = np.isin(obs, [t["obs"] for t in reference.episodes[0]])
    assert set(goal[from_first].tolist()) == first  # every step's goal drawn, none after
    assert set(goal[~from_first].tolist()) == second


@pytest.mark.parametrize("length", ["capacity", "twice"])
def test_episodes_as_long_as_the_buffer_or_longer_sample_every_stored_step(length):
    """SB3 takes an episode's length modulo the buffer size: one exactly as long is never
    sampled and longer ones lose steps. Here every stored transition is sampled, and the
    episode strategy draws goals from every stored step, and only those."""
    capacity = 8
    buffer = goal_buffer(capacity, 1, "episode", goals=1_000_000, seed=0)
    reference = Reference(1, buffer.rows)
    steps = capacity if length == "capacity" else 2 * capacity
    goal_stream(buffer, reference, steps, np.random.default_rng(0), 0.0)
    stored = [t for t in reference.running[0] if reference.stored(t)]
    assert len(stored) == len(buffer) == capacity
    batch = buffer.sample(2000)
    n = buffer.hindsight.relabelled(len(batch.rewards))
    obs, goal = batch.obs["observation"][:n, 0], batch.obs["desired_goal"][:n, 0]
    assert set(obs.tolist()) == {t["obs"] for t in stored}
    assert set(goal.tolist()) == {t["next_obs"] for t in stored}


def test_a_finished_episode_whose_start_was_overwritten_keeps_its_stored_steps():
    buffer = goal_buffer(6, 1, "final", seed=0)
    reference = Reference(1, buffer.rows)
    where = goal_stream(buffer, reference, 9, np.random.default_rng(0), 0.0)  # 6 kept
    check_batch(buffer, reference, buffer.sample(256), "final")
    goal_stream(buffer, reference, 3, np.random.default_rng(1), 0.5, start=where)  # ends
    check_batch(buffer, reference, buffer.sample(256), "final")


def test_save_and_restore_with_episodes_running_is_bitwise(tmp_path):
    """A buffer reloaded mid-episode goes on as the original: the same episodes (the
    streams go on across the reload), the same batches."""
    buffer = goal_buffer(30, 2, seed=4)
    reference = Reference(2, buffer.rows)
    where = goal_stream(buffer, reference, 20, np.random.default_rng(0), 0.2, 0.1)
    buffer.save(tmp_path / "buffer.pt")
    restored = goal_buffer(30, 2, seed=99)
    restored.load(tmp_path / "buffer.pt")
    twin = copy.deepcopy(reference)
    goal_stream(buffer, reference, 15, np.random.default_rng(1), 0.2, start=where)
    goal_stream(restored, twin, 15, np.random.default_rng(1), 0.2, start=where)
    assert reference.episodes == twin.episodes
    a, b = buffer.sample(128), restored.sample(128)
    for x, y in zip(a, b):
        if isinstance(x, dict):
            assert all(torch.equal(x[k], y[k]) for k in x)
        elif x is not None:
            assert torch.equal(x, y)
    check_batch(restored, twin, b, "future")


def test_sample_host_relabels_as_sample():
    buffers = []
    for _ in range(2):
        buffer = goal_buffer(50, 2, seed=7, terminations=True)
        goal_stream(buffer, Reference(2, buffer.rows), 40, np.random.default_rng(1), 0.2, 0.1)
        buffers.append(buffer)
    a, b = buffers[0].sample(200), buffers[1].sample_host(200)
    for x, y in zip(a, b):
        if isinstance(x, dict):
            assert all(np.array_equal(x[k].numpy(), y[k]) for k in x)
        elif x is not None:
            np.testing.assert_array_equal(x.numpy(), y)


def test_refused_combinations():
    hindsight = Hindsight(reached)
    dtypes = {key: np.float32 for key in SHAPES}
    with pytest.raises(ValueError, match="n_step=1"):
        ReplayBuffer(10, 1, SHAPES, dtypes, n_step=3, hindsight=hindsight)
    with pytest.raises(ValueError, match="n_step=1"):
        ReplayBuffer(10, 1, SHAPES, dtypes, prioritized=True, hindsight=hindsight)
    with pytest.raises(ValueError, match="achieved_goal"):
        ReplayBuffer(10, 1, (3,), hindsight=hindsight)
    with pytest.raises(ValueError, match="goals must be"):
        Hindsight(reached, goals=-1)
    with pytest.raises(ValueError, match="load each other"):
        plain = ReplayBuffer(10, 1, SHAPES, dtypes)
        plain.load_state_dict(goal_buffer(10, 1).state_dict())


def test_a_reward_function_that_does_not_take_arrays_is_one_clear_error():
    buffer = goal_buffer(10, 1, hindsight=Hindsight(lambda a, g, info: float(np.sum(a == g))))
    goal_stream(buffer, Reference(1, buffer.rows), 5, np.random.default_rng(0), 0.0)
    with pytest.raises(ValueError, match=r"returned shape \(\) for 8 goals, not \(8,\)"):
        buffer.sample(10)


def test_relabelling_keeps_the_action_masks_of_each_slot():
    """With action masks (kept beside each observation), relabelled batches still carry the
    masks of their own obs and next_obs."""
    obs_dtype = {key: np.float32 for key in SHAPES}
    buffer = ReplayBuffer(
        40,
        1,
        SHAPES,
        obs_dtype,
        seed=0,
        action_mask_shape=(3,),
        hindsight=Hindsight(reached, goals=1_000_000),
    )

    def observe(i):  # the mask is a function of the observation's id
        ids = np.array([[float(i)]], np.float32)
        mask = np.array([[i % 2 == 0, True, i % 3 == 0]])
        return {"observation": ids, "achieved_goal": ids, "desired_goal": -ids}, mask

    for i in range(1, 30):
        (obs, mask), (nxt, next_mask) = observe(i), observe(i + 1)
        buffer.add(
            obs,
            [0],
            [-1.0],
            nxt,
            [False],
            [i % 10 == 0],
            action_mask=mask,
            next_action_mask=next_mask,
        )
    batch = buffer.sample(200)
    for i, j, m, nm in zip(
        batch.obs["observation"][:, 0].tolist(),
        batch.next_obs["observation"][:, 0].tolist(),
        batch.action_masks,
        batch.next_action_masks,
    ):
        assert (m.numpy() == observe(int(i))[1][0]).all()
        assert (nm.numpy() == observe(int(j))[1][0]).all()
    assert (batch.obs["desired_goal"][:199] >= 0).all()  # relabelled: reached ids
