"""Observation normalization and reward scaling: the running statistics against numpy and
against Gymnasium's wrappers, resume with them on, and a saved policy using them frozen."""

import dataclasses

import gymnasium as gym
import numpy as np
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

import rlstore
from rlstore.algos import ppo
from rlstore.algos.ppo import PPOConfig
from rlstore.checkpoint import checkpoint_files
from rlstore.normalize import ObsNormalizer, RewardScaler, RunningMeanStd


@settings(max_examples=40, deadline=None)
@given(
    sizes=st.lists(st.integers(1, 40), min_size=1, max_size=8),
    dim=st.integers(1, 4),
    seed=st.integers(0, 2**31),
)
def test_running_statistics_match_numpy_over_everything_seen(sizes, dim, seed):
    """Merged batch by batch (the parallel formula) = numpy over the concatenation, with the
    prior of count 1e-4 (mean 0, variance 1) as Gymnasium starts."""
    rng = np.random.default_rng(seed)
    batches = [rng.normal(3.0, 2.0, size=(n, dim)) for n in sizes]
    rms = RunningMeanStd((dim,))
    for batch in batches:
        rms.update(batch)
    data = np.concatenate(batches)
    prior, n = 1e-4, len(data)
    mean = data.sum(axis=0) / (n + prior)
    m2 = ((data - data.mean(axis=0)) ** 2).sum(axis=0) + prior * 1.0
    m2 += data.mean(axis=0) ** 2 * prior * n / (n + prior)
    np.testing.assert_allclose(rms.mean, mean, rtol=1e-9, atol=1e-12)
    np.testing.assert_allclose(rms.var, m2 / (n + prior), rtol=1e-9)
    assert rms.count == pytest.approx(n + prior)
    once = RunningMeanStd((dim,))
    once.update(data)  # the batching does not matter
    np.testing.assert_allclose(rms.mean, once.mean, rtol=1e-9, atol=1e-12)
    np.testing.assert_allclose(rms.var, once.var, rtol=1e-9)


def test_one_env_normalizes_as_gymnasiums_wrappers():
    """ObsNormalizer and RewardScaler on one env's NEXT_STEP stream give, step for step,
    what Gymnasium's NormalizeObservation and NormalizeReward (then clipping to +-10) give
    inside that env. (Gymnasium keeps the observation statistics in the observation's
    float32, rlstore in float64: hence a tolerance on the observations.)"""
    wrapped = gym.make("Pendulum-v1", max_episode_steps=50)
    wrapped = gym.wrappers.NormalizeObservation(wrapped)
    wrapped = gym.wrappers.TransformObservation(wrapped, lambda o: np.clip(o, -10, 10), None)
    wrapped = gym.wrappers.NormalizeReward(wrapped, gamma=0.99)
    wrapped = gym.wrappers.TransformReward(wrapped, lambda r: np.clip(r, -10, 10))
    theirs = gym.vector.SyncVectorEnv([lambda: wrapped])
    ours = gym.vector.SyncVectorEnv([lambda: gym.make("Pendulum-v1", max_episode_steps=50)])
    obs_norm, reward_scale = ObsNormalizer((3,)), RewardScaler(1, gamma=0.99)
    their_obs, _ = theirs.reset(seed=3)
    our_obs, _ = ours.reset(seed=3)
    np.testing.assert_allclose(obs_norm(our_obs, update=True), their_obs, rtol=1e-3, atol=1e-5)
    rng = np.random.default_rng(3)
    for _ in range(160):  # three episodes and their pseudo-steps
        action = rng.uniform(-2, 2, size=(1, 1)).astype(np.float32)
        their_obs, their_reward, *_ = theirs.step(action)
        our_obs, reward, terminated, truncated, _ = ours.step(action)
        np.testing.assert_allclose(obs_norm(our_obs, update=True), their_obs, rtol=1e-3, atol=1e-4)
        np.testing.assert_allclose(
            reward_scale(reward, terminated, truncated), their_reward, rtol=1e-5, atol=1e-7
        )


def small_run(tmp_path, **changes):
    cfg = PPOConfig(
        env_id="Pendulum-v1",
        total_timesteps=4096,
        num_steps=256,
        num_envs=2,
        norm_obs=True,
        norm_reward=True,
        device="cpu",
        progress=False,
        checkpoint_every=1024,
        keep_checkpoints=10,
        max_episode_steps=100,
        logdir=str(tmp_path),
    )
    return dataclasses.replace(cfg, **changes)


@pytest.mark.slow
def test_resume_with_normalization_is_bitwise_the_same_run(tmp_path):
    cfg = small_run(tmp_path)
    full = ppo.train(cfg)
    saved = checkpoint_files(full.run_dir / "checkpoints")
    for later in saved[:2]:
        later.unlink()
    (full.run_dir / "model.pt").unlink()
    resumed = ppo.train(cfg, resume=full.run_dir)
    assert resumed.episode_returns == full.episode_returns
    for p, q in zip(resumed.model.parameters(), full.model.parameters(), strict=True):
        assert torch.equal(p, q)
    policy = rlstore.load_policy(full.run_dir)
    assert policy.obs_normalizer.rms.count > 4096  # every observation of the run


def test_a_saved_policy_acts_on_its_frozen_statistics(tmp_path):
    run_dir = ppo.train(small_run(tmp_path, norm_reward=False)).run_dir
    policy = rlstore.load_policy(run_dir)
    stats = policy.obs_normalizer.rms
    assert not np.allclose(stats.mean, 0.0) and not np.allclose(stats.var, 1.0)
    obs = np.random.default_rng(0).uniform(-8, 8, size=(64, 3)).astype(np.float32)
    normalized = np.clip((obs - stats.mean) / np.sqrt(stats.var + 1e-8), -10, 10)
    with torch.no_grad():
        mean = policy.network.deterministic_action(torch.as_tensor(normalized, dtype=torch.float32))
        raw = policy.network.deterministic_action(torch.as_tensor(obs))
    np.testing.assert_allclose(policy(obs), np.clip(mean.numpy(), -2, 2), rtol=1e-6)
    assert not np.allclose(policy(obs), np.clip(raw.numpy(), -2, 2))  # the stats matter
    before = stats.count
    policy(obs)
    policy.value(obs)
    assert policy.obs_normalizer.rms.count == before  # frozen
