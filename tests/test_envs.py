"""The autoreset contract (docs/reference/episode-boundaries.md) on real CartPole envs with a 5-step
limit; vectorization choices; episode statistics."""

import dataclasses

import gymnasium as gym
import numpy as np
import pytest
import torch
from extras import needs
from gymnasium.vector import AutoresetMode

from rlstore.envs import make_vec_env
from rlstore.episode_stats import EpisodeStats
from rlstore.storage import RolloutStorage

LIMIT = 5


@pytest.mark.parametrize(
    "vectorization, expected",
    [
        ("native", "CartPoleVectorEnv"),
        ("sync", "LeanSyncVectorEnv"),
        ("async", "AsyncVectorEnv"),
    ],
)
def test_every_vectorization_is_next_step(vectorization, expected):
    envs = make_vec_env("CartPole-v1", 2, seed=0, vectorization=vectorization)
    assert envs.metadata["autoreset_mode"] == AutoresetMode.NEXT_STEP
    assert type(envs).__name__ == expected
    envs.close()


def test_same_seed_same_observations_and_action_samples():
    runs = []
    for _ in range(2):
        envs = make_vec_env("Acrobot-v1", 2, seed=4)
        obs, _ = envs.reset(seed=4)
        runs.append((obs, envs.action_space.sample()))
        envs.close()
    np.testing.assert_array_equal(runs[0][0], runs[1][0])
    np.testing.assert_array_equal(runs[0][1], runs[1][1])


def test_auto_prefers_native_vectorization_from_6_envs():
    envs = make_vec_env("CartPole-v1", 6, seed=0)
    assert type(envs).__name__ == "CartPoleVectorEnv"
    envs.close()
    envs = make_vec_env("CartPole-v1", 5, seed=0)  # fewer: sync steps faster
    assert type(envs).__name__ == "LeanSyncVectorEnv"
    envs.close()
    envs = make_vec_env("Acrobot-v1", 2, seed=0)  # no vector_entry_point
    assert type(envs).__name__ == "LeanSyncVectorEnv"
    envs.close()


def balanced_actions(obs):
    """Push against the pole so that episodes last to the time limit (no termination)."""
    return (obs[:, 2] > 0).astype(np.int64)


@pytest.mark.parametrize("vectorization", ["native", "sync"])
def test_time_limit_truncates_and_pseudo_step_follows(vectorization):
    envs = make_vec_env(
        "CartPole-v1", 2, seed=3, vectorization=vectorization, max_episode_steps=LIMIT
    )
    obs, _ = envs.reset(seed=3)
    history = []
    for _ in range(3 * (LIMIT + 1)):
        next_obs, reward, term, trunc, _ = envs.step(balanced_actions(obs))
        history.append((obs, next_obs, reward, term, trunc))
        obs = next_obs
    envs.close()
    # Every (LIMIT + 1)th step is a pseudo-step: reward 0, no flags, a fresh reset obs.
    for t, (_, next_obs, reward, term, trunc) in enumerate(history):
        if t % (LIMIT + 1) == LIMIT - 1:  # the 5th real step of an episode: truncated
            assert trunc.all() and not term.any()
            assert reward.tolist() == [1.0, 1.0]
        elif t % (LIMIT + 1) == LIMIT:  # the pseudo-step
            assert not trunc.any() and not term.any()
            assert reward.tolist() == [0.0, 0.0]
            assert np.all(np.abs(next_obs) <= 0.05)  # reset observations lie in [-0.05, 0.05]
        else:
            assert not trunc.any() and not term.any()


def test_final_observation_is_the_next_obs_of_the_truncated_step():
    """Replaying the same seed and actions in one plain env: the obs returned with the
    truncation is the episode's true last observation (what bootstrapping must use)."""
    envs = make_vec_env("CartPole-v1", 1, seed=5, vectorization="sync", max_episode_steps=LIMIT)
    single = gym.make("CartPole-v1", max_episode_steps=LIMIT)
    obs, _ = envs.reset(seed=5)
    single_obs, _ = single.reset(seed=5)  # sub-env i of a vector env is seeded with seed + i
    np.testing.assert_array_equal(obs[0], single_obs)
    for _ in range(LIMIT):
        action = balanced_actions(obs)
        obs, _, _, trunc, _ = envs.step(action)
        single_obs, _, _, single_trunc, _ = single.step(int(action[0]))
    assert trunc[0] and single_trunc
    np.testing.assert_array_equal(obs[0], single_obs)
    envs.close()


def test_storage_and_stats_skip_pseudo_steps_and_bootstrap_from_final_obs():
    num_envs, T = 2, 2 * (LIMIT + 1)
    envs = make_vec_env("CartPole-v1", num_envs, seed=1, max_episode_steps=LIMIT)
    storage = RolloutStorage(T, num_envs, obs_shape=(4,))
    stats = EpisodeStats(num_envs)
    obs, _ = envs.reset(seed=1)
    storage.reset(obs)
    value_of = lambda o: torch.as_tensor(o).sum(-1)  # noqa: E731  a fake critic
    finished = []
    for _ in range(T):
        current = storage.current_obs.numpy()
        next_obs, reward, term, trunc, _ = envs.step(balanced_actions(current))
        storage.insert(
            next_obs,
            torch.as_tensor(balanced_actions(current)),
            torch.zeros(num_envs),
            value_of(current),
            reward,
            term,
            trunc,
        )
        finished += stats.update(reward, term, trunc)[1].tolist()
    envs.close()
    # Pseudo-steps (after each truncation) are invalid and left out of the flat rollout.
    valid = storage.valid[:, 0].tolist()
    assert valid == [True] * LIMIT + [False] + [True] * LIMIT + [False]
    assert len(storage.flatten()["obs"]) == 2 * LIMIT * num_envs
    # Each episode lasted exactly LIMIT real steps: the pseudo-step is not counted.
    assert finished == [LIMIT] * 2 * num_envs
    # The bootstrap of the truncated step is the value of its final observation.
    storage.compute_returns(value_of(storage.current_obs.numpy()), gamma=0.9, gae_lambda=0.0)
    t = LIMIT - 1
    final_obs = storage.obs[t + 1]
    expected = storage.rewards[t] + 0.9 * value_of(final_obs)
    torch.testing.assert_close(storage.returns[t], expected)


def test_episode_stats_hand_computed():
    stats = EpisodeStats(2)
    r = np.array([1.0, 2.0])
    no, yes = np.array([False, False]), np.array([True, False])
    assert stats.update(r, no, no)[0].size == 0
    returns, lengths = stats.update(r, yes, no)  # env 0 terminates after 2 steps
    assert returns.tolist() == [2.0] and lengths.tolist() == [2]
    stats.update(np.array([0.0, 2.0]), no, no)  # env 0 pseudo-step: not counted
    returns, lengths = stats.update(r, no, np.array([False, True]))  # env 1 truncated
    assert returns.tolist() == [8.0] and lengths.tolist() == [4]
    returns, _ = stats.update(r, no, no)  # env 1 pseudo-step, env 0 goes on
    assert returns.size == 0
    assert stats.returns.tolist() == [2.0, 0.0] and stats.lengths.tolist() == [2, 0]


def test_truncation_as_termination_reports_time_limits_as_terminations(tmp_path):
    """--truncation-as-termination: the same stream, with every truncation reported as a
    termination (and none as a truncation), so that learners cut the bootstrap there."""
    from rlstore import algos
    from rlstore.algos.ppo import PPOConfig
    from rlstore.envs import make_training_envs

    cfg = PPOConfig(env_id="CartPole-v1", num_envs=3, max_episode_steps=15, seed=4)
    plain = make_training_envs(cfg, algos.get("ppo"))
    cut = make_training_envs(
        dataclasses.replace(cfg, truncation_as_termination=True), algos.get("ppo")
    )
    plain.reset(seed=4)
    cut.reset(seed=4)
    truncations = 0
    for _ in range(100):
        action = plain.action_space.sample()
        obs, reward, term, trunc, _ = plain.step(action)
        obs2, reward2, term2, trunc2, _ = cut.step(action)
        np.testing.assert_array_equal(obs, obs2)
        np.testing.assert_array_equal(reward, reward2)
        np.testing.assert_array_equal(term2, term | trunc)
        assert not trunc2.any()
        truncations += int(trunc.sum())
    assert truncations > 0


def test_update_one_is_update_for_one_env():
    """EpisodeStats.update_one (Python scalars) gives the episodes and state of update()."""
    rng = np.random.default_rng(9)
    batched, scalar = EpisodeStats(1), EpisodeStats(1)
    for _ in range(200):
        reward, terminated, truncated = float(rng.normal()), rng.random() < 0.1, rng.random() < 0.05
        returns, lengths = batched.update(
            np.array([reward]), np.array([terminated]), np.array([truncated])
        )
        ended = scalar.update_one(reward, terminated or truncated)
        assert (ended is None) == (len(returns) == 0)
        if ended is not None:
            assert ended == (returns[0], lengths[0])
        for name, value in batched.state_dict().items():
            assert torch.equal(value, scalar.state_dict()[name]), name


def test_an_env_that_fails_to_make_leaves_no_second_error(monkeypatch):
    """The user's error is the only one: the half-made vector env's __del__ (Gymnasium
    1.1's closes it; 1.4's does not) must not raise one more, printed after the message."""
    import gc

    from rlstore.lean_envs import LeanSyncVectorEnv

    unraisable = []
    monkeypatch.setattr("sys.unraisablehook", unraisable.append)

    def broken_env() -> gym.Env:
        raise RuntimeError("the user's env is broken")

    try:
        LeanSyncVectorEnv([broken_env])
    except RuntimeError as error:  # (pytest.raises would keep the env alive in its traceback)
        assert "broken" in str(error)
    else:
        raise AssertionError("LeanSyncVectorEnv made a broken env")
    gc.collect()
    assert unraisable == []


@needs("mujoco", "mujoco")
def test_mujoco_warnings_become_python_warnings_and_no_log_file(tmp_path, monkeypatch):
    """Left alone, MuJoCo appends each warning to MUJOCO_LOG.TXT in the working directory;
    a MuJoCo env built by rlstore routes them to Python's warnings instead, and keeps a
    handler the user set."""
    import mujoco

    monkeypatch.chdir(tmp_path)
    users_handler = mujoco.get_mju_user_warning()
    try:
        mujoco.set_mju_user_warning(None)
        envs = make_vec_env("Hopper-v4", 1, 0)
        envs.reset(seed=0)
        env = envs.envs[0].unwrapped
        env.data.qvel[:] = 1e12  # MuJoCo warns: the simulation is unstable
        with pytest.warns(RuntimeWarning, match="MuJoCo: Nan, Inf or huge value in QVEL"):
            mujoco.mj_step(env.model, env.data)
        envs.close()
        assert list(tmp_path.iterdir()) == []

        caught = []
        mujoco.set_mju_user_warning(caught.append)
        make_vec_env("Hopper-v4", 1, 0).close()
        assert mujoco.get_mju_user_warning() == caught.append
    finally:
        mujoco.set_mju_user_warning(users_handler)


def test_the_lean_vector_env_reads_its_format_1_checkpoint_names():
    """Format-1 checkpoints saved LeanSyncVectorEnv's attributes under a SyncVectorEnv's
    names; env_snapshots.load_env_state renames them (storage/migrations.py)."""
    from rlstore.storage.migrations import lean_env_state

    saved = {"_observations": 1, "_rewards": 2, "_autoreset_envs": 3, "_env_obs": 4, "seed": 5}
    assert lean_env_state(saved) == {
        "observations": 1,
        "rewards": 2,
        "autoreset": 3,
        "seed": 5,
    }
