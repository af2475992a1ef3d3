"""The collect pipeline (rlstore/collect.py), against the env stepped by hand: what each
collector hands its storage and the run, step by step."""

from types import SimpleNamespace

import gymnasium as gym
import numpy as np

from rlstore.collect import Collector, ReplayCollector, RolloutCollector, env_actions
from rlstore.masks import ActionMasks
from rlstore.normalize import ObsNormalizer, RewardScaler


def recording_run(sign_rewards: bool) -> SimpleNamespace:
    """A run that keeps what record_step got."""
    recorded = []
    return SimpleNamespace(
        cfg=SimpleNamespace(sign_rewards=sign_rewards),
        recorded=recorded,
        record_step=lambda *args: recorded.append(args),
    )


def pendulums(seed: int) -> gym.vector.VectorEnv:
    """Two Pendulums cut at 5 steps (rewards in (-16.3, 0], truncations, pseudo-steps)."""
    envs = gym.vector.SyncVectorEnv([lambda: gym.make("Pendulum-v1", max_episode_steps=5)] * 2)
    envs.reset(seed=seed)
    return envs


def test_the_rollout_collector_stores_the_transformed_step_and_counts_the_envs_own():
    """With --norm-obs, --norm-reward and --sign-rewards: the storage gets the normalized
    observations and the scaled rewards' signs, the run the env's own rewards and flags,
    each equal to the same env stepped by hand through its own normalizer and scaler."""
    inserted = []
    storage = SimpleNamespace(insert=lambda *args, **kwargs: inserted.append((args, kwargs)))
    run = recording_run(sign_rewards=True)
    collector = RolloutCollector(
        pendulums(0), run, storage, ObsNormalizer((3,), 10.0), RewardScaler(2, 0.99)
    )
    by_hand, norm, scale = pendulums(0), ObsNormalizer((3,), 10.0), RewardScaler(2, 0.99)
    rng = np.random.default_rng(0)
    for t in range(12):
        action = rng.uniform(-2, 2, (2, 1)).astype(np.float32)
        step = collector.step(action, action, np.zeros(2), np.zeros(2))
        obs, reward, terminated, truncated, _ = by_hand.step(action)
        stored, kwargs = inserted[t]
        np.testing.assert_array_equal(stored[0], norm(obs, update=True))
        np.testing.assert_array_equal(stored[4], np.sign(scale(reward, terminated, truncated)))
        np.testing.assert_array_equal(stored[5], terminated)
        np.testing.assert_array_equal(stored[6], truncated)
        assert stored[7] is None and kwargs == {"action_mask": None}  # no lives, no masks
        np.testing.assert_array_equal(run.recorded[t][0], reward)  # the env's own
        np.testing.assert_array_equal(step.obs, obs)
    learnt = np.array([args[4] for args, _ in inserted])
    assert set(np.unique(learnt)) <= {-1.0, 0.0} and (learnt == -1).any()
    assert np.any([recorded[2] for recorded in run.recorded])  # the time limit was met


def test_learnt_rewards_scale_then_sign_and_are_the_rewards_without_either():
    rewards, flags = np.array([-3.0, 0.5]), np.array([False, False])
    plain = Collector(pendulums(0), recording_run(sign_rewards=False))
    assert plain.learnt_rewards(rewards, flags, flags) is rewards
    assert not plain.changes_rewards
    signed = Collector(pendulums(0), recording_run(sign_rewards=True))
    np.testing.assert_array_equal(signed.learnt_rewards(rewards, flags, flags), [-1.0, 1.0])
    scaled = Collector(pendulums(0), recording_run(False), reward_scale=RewardScaler(2, 0.9))
    first = scaled.learnt_rewards(rewards, flags, flags)
    # the first step's returns are the rewards: their variance (3.0625) scales them (to the
    # running statistics' prior count of 1e-4)
    np.testing.assert_allclose(first, rewards / np.sqrt(3.0625), rtol=1e-4)


def test_the_replay_collector_stores_each_transition_with_the_masks_at_both_ends():
    """Under Taxi's action masks: a transition is stored with the masks of the
    observations it was taken at and of those it led to (the target's next action)."""
    added = []
    buffer = SimpleNamespace(add=lambda *args, **kwargs: added.append((args, kwargs)))
    envs = ActionMasks(gym.vector.SyncVectorEnv([lambda: gym.make("Taxi-v4")] * 2), "info")
    obs, _ = envs.reset(seed=1)
    collector = ReplayCollector(envs, recording_run(sign_rewards=False), buffer)
    rng = np.random.default_rng(1)
    for t in range(20):
        before = envs.masks.copy()
        action = np.array([rng.choice(np.flatnonzero(mask)) for mask in before])
        next_obs = collector.step(obs, action)
        (stored_obs, stored_action, reward, stored_next, *_), kwargs = added[t]
        assert stored_obs is obs and stored_next is next_obs and stored_action is action
        np.testing.assert_array_equal(kwargs["action_mask"], before)
        np.testing.assert_array_equal(kwargs["next_action_mask"], envs.masks)
        assert set(np.unique(reward)) <= {-1.0, -10.0, 20.0}
        obs = next_obs


def test_env_actions_clip_boxes_and_reshape_heads():
    box = gym.spaces.Box(-1.0, 1.0, (2,))
    np.testing.assert_array_equal(
        env_actions(np.array([[-3.0, 0.5]]), box), np.array([[-1.0, 0.5]])
    )
    head = SimpleNamespace(env_action=lambda action: action + 10)  # MultiDiscrete's start
    discrete = gym.spaces.Discrete(3)
    np.testing.assert_array_equal(env_actions(np.array([0, 2]), discrete, head), [10, 12])
    assert env_actions(actions := np.array([0, 2]), discrete) is actions


def test_the_replay_collector_learns_signs_and_counts_the_envs_own_rewards():
    """--sign-rewards under replay (SAC, TD3, DDPG, TQC and CrossQ take it too): the buffer
    gets the signs, the run the env's own rewards, as the same env stepped by hand gives."""
    added = []
    buffer = SimpleNamespace(add=lambda *args, **kwargs: added.append(args))
    run = recording_run(sign_rewards=True)
    collector, by_hand = ReplayCollector(pendulums(2), run, buffer), pendulums(2)
    obs = np.zeros((2, 3), np.float32)
    for t in range(8):
        action = np.full((2, 1), 0.5, np.float32)
        obs = collector.step(obs, action)
        reward = by_hand.step(action)[1]
        np.testing.assert_array_equal(added[t][2], np.sign(reward))
        np.testing.assert_array_equal(run.recorded[t][0], reward)
    assert (np.array([args[2] for args in added]) == -1).any()
