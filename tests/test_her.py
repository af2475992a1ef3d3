"""--her in training: the bit-flipping env, HER's learning on it against DQN without it,
SAC, TD3 and DDPG with HER on a continuous goal env, bitwise resume, success rates in
TensorBoard and in evaluations. (The relabelling itself: tests/test_hindsight.py.)"""

import dataclasses
import json

import gymnasium as gym
import numpy as np
import pytest
import space_envs  # noqa: F401 (registers GoalPoint-v0)
from extras import needs
from tiny_runs import COMMON, resumes_bitwise

from rlstore.algos import ddpg, dqn, sac, td3
from rlstore.algos.ddpg import DDPGConfig
from rlstore.algos.dqn import DQNConfig
from rlstore.algos.sac import SACConfig
from rlstore.algos.td3 import TD3Config
from rlstore.bit_flipping import BitFlippingEnv
from rlstore.checkpoint import checkpoint_files
from rlstore.evaluate import evaluate


def test_bit_flipping_steps_rewards_and_ends_as_the_paper_says():
    env = gym.make("BitFlipping-v0", n_bits=4)
    # a start with some bits right and some wrong
    seed = next(
        s
        for s in range(100)
        if 0
        < np.sum(np.not_equal(*(env.reset(seed=s)[0][k] for k in ("observation", "desired_goal"))))
        < 4
    )
    obs, _ = env.reset(seed=seed)
    state, goal = obs["observation"].copy(), obs["desired_goal"]
    assert (obs["achieved_goal"] == state).all() and env.action_space.n == 4
    differing = list(np.flatnonzero(state != goal))
    for i, bit in enumerate(differing):  # flip the differing bits one by one: reach the goal
        obs, reward, terminated, truncated, info = env.step(bit)
        last = i == len(differing) - 1
        assert reward == (0.0 if last else -1.0) and terminated == last and not truncated
        assert info["is_success"] == last
    obs, _ = env.reset(seed=seed)
    same = int(np.flatnonzero(obs["observation"] == obs["desired_goal"])[0])
    for step in range(1, 5):  # flipping a right bit back and forth never reaches the goal
        obs, reward, terminated, truncated, _ = env.step(same)
        assert reward == -1.0 and not terminated and truncated == (step == 4)
    achieved = np.array([[0, 1, 1, 0], [1, 1, 1, 1]], np.int8)
    desired = np.array([[0, 1, 1, 0], [1, 0, 1, 1]], np.int8)
    np.testing.assert_array_equal(
        BitFlippingEnv.compute_reward(achieved, desired, None), [0.0, -1.0]
    )
    np.testing.assert_array_equal(
        BitFlippingEnv.compute_terminated(achieved, desired, None), [True, False]
    )


def bit_flipping(her: bool, logdir) -> DQNConfig:
    return DQNConfig(
        env_id="BitFlipping-v0",
        env_kwargs=("n_bits=8",),
        her=her,
        total_timesteps=6000,
        q_hidden=(64,),
        learning_rate=1e-3,
        gamma=0.9,
        buffer_size=10_000,
        learning_starts=500,
        exploration_fraction=0.2,
        end_e=0.05,
        train_frequency=2,
        target_network_frequency=250,
        eval_every=6000,
        eval_episodes=100,
        logdir=str(logdir),
        device="cpu",
        progress=False,
    )


@pytest.mark.slow
def test_dqn_with_her_solves_8_bits_where_dqn_alone_does_not(tmp_path):
    """The paper's figure 1 in small: 8 bits, 6,000 steps (about 3 s each)."""
    rates = {}
    for her in (True, False):
        result = dqn.train(bit_flipping(her, tmp_path))
        summary = json.loads((result.run_dir / "summary.json").read_text())
        rates[her] = summary["evaluations"][-1]["success_rate"]
    assert rates[True] >= 0.9 and rates[False] <= 0.2, rates


@pytest.mark.parametrize("strategy", ["future", "final", "episode"])
def test_dqn_with_her_resumes_bitwise(strategy, logdir):
    """A run with HER killed mid-way and resumed: the same returns and parameters (the
    buffer's episode index and relabelling draws are part of the checkpoint; the bit
    flipping env's state too)."""
    cfg = DQNConfig(
        env_id="BitFlipping-v0",
        env_kwargs=("n_bits=5",),
        her=True,
        her_strategy=strategy,
        total_timesteps=1500,
        learning_starts=300,
        buffer_size=700,
        batch_size=32,
        num_envs=2,
        target_network_frequency=200,
        checkpoint_every=500,
        logdir=logdir,
        **COMMON,
    )
    resumes_bitwise(dqn, cfg)


GOAL = dict(
    env_id="space_envs:GoalPoint-v0",
    her=True,
    total_timesteps=900,
    learning_starts=200,
    num_envs=2,
    buffer_size=400,
    batch_size=32,
    hidden=(32, 32),
    checkpoint_every=300,
    **COMMON,
)


@pytest.mark.parametrize(
    "module, cfg",
    [
        (sac, SACConfig(**GOAL)),
        (td3, TD3Config(**GOAL, her_strategy="final")),
        (ddpg, DDPGConfig(**GOAL, her_strategy="episode", her_goals=2)),
    ],
    ids=["sac", "td3", "ddpg"],
)
def test_continuous_runs_with_her_relabel_and_resume(module, cfg, logdir, monkeypatch):
    """SAC, TD3 and DDPG train with relabelled batches (checked: every batch's first
    goals * batch // (goals + 1) goals are goals the buffer drew), and resume."""
    from rlstore.storage.replay import ReplayBuffer

    relabelled, sample = [], ReplayBuffer.sample

    def watched(buffer, batch_size, *args):
        batch = sample(buffer, batch_size, *args)
        assert buffer.hindsight.strategy == cfg.her_strategy  # the option reached the buffer
        n = buffer.hindsight.relabelled(batch_size)
        assert n == batch_size * cfg.her_goals // (cfg.her_goals + 1)
        gap = batch.next_obs["achieved_goal"][:n] - batch.obs["desired_goal"][:n]
        assert ((batch.rewards[:n] == 0) == (gap.norm(dim=1) <= 0.2)).all()  # GoalPoint's
        relabelled.append(n)
        return batch

    monkeypatch.setattr(ReplayBuffer, "sample", watched)
    cfg = dataclasses.replace(cfg, logdir=logdir)
    full = module.train(cfg)
    assert relabelled and set(relabelled) == {32 * cfg.her_goals // (cfg.her_goals + 1)}
    saved = checkpoint_files(full.run_dir / "checkpoints")
    for later in saved[: len(saved) // 2]:  # as if the run had died in the middle
        later.unlink()
    (full.run_dir / "model.pt").unlink()
    resumed = module.train(cfg, resume=full.run_dir)  # the envs reset: their state is not saved
    assert resumed.global_step == full.global_step and resumed.start_step < full.global_step


def test_success_rates_in_tensorboard_summary_and_eval(logdir):
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    cfg = dataclasses.replace(
        bit_flipping(True, logdir), total_timesteps=1500, eval_every=1500, eval_episodes=20
    )
    run_dir = dqn.train(cfg).run_dir
    tags = EventAccumulator(str(run_dir)).Reload().Tags()["scalars"]
    assert {"charts/success_rate", "eval/success_rate"} <= set(tags)
    events = EventAccumulator(str(run_dir)).Reload().Scalars("charts/success_rate")
    assert {e.value for e in events} <= {0.0, 1.0} and len(events) > 50
    result = evaluate(run_dir, episodes=30)
    assert 0.0 <= result["success_rate"] <= 1.0
    assert (
        json.loads((run_dir / "eval.json").read_text())["evaluations"][-1]["success_rate"]
        == result["success_rate"]
    )


def test_successes_are_read_at_episode_ends_only():
    from rlstore.goals import ended_successes, episode_success

    info = {"is_success": np.array([1.0, 0.0, 1.0]), "_is_success": np.array([True, True, False])}
    ended = np.array([True, True, True])
    assert ended_successes(info, ended) == [1.0, 0.0]  # env 2 did not say
    assert ended_successes(info, np.array([False, True, False])) == [0.0]
    maze = {"success": np.array([True, False]), "_success": np.array([True, True])}
    assert ended_successes(maze, np.array([True, False])) == [1.0]  # PointMaze's key
    assert ended_successes({}, ended) == []
    assert episode_success({"is_success": np.float32(1.0)}) == 1.0
    assert episode_success({"success": False}) == 0.0 and episode_success({}) is None


@needs("robotics", "gymnasium_robotics")
def test_sac_with_her_trains_on_fetch_reach(logdir):
    """Gymnasium-Robotics' FetchReach builds (MuJoCo below 4) and trains with --her; its
    success rate reaches the evaluation."""
    cfg = SACConfig(
        env_id="FetchReach-v4",
        her=True,
        total_timesteps=300,
        learning_starts=100,
        batch_size=32,
        hidden=(32, 32),
        eval_every=300,
        eval_episodes=2,
        logdir=logdir,
        device="cpu",
        progress=False,
    )
    result = sac.train(cfg)
    summary = json.loads((result.run_dir / "summary.json").read_text())
    assert summary["evaluations"][-1]["success_rate"] in (0.0, 0.5, 1.0)
