"""Atari (rlstore[atari]): preprocessing, life losses, the Nature CNN, frame-once replay on a
real ALE stream, whole unclipped games in the logs, and CLI runs with a tiny budget."""

import json
import os
from pathlib import Path

import numpy as np
import pytest
import torch
from extras import requires_extra
from test_frame_stacks import assert_same_as_plain

from rlstore import ReplayBuffer, algos, resolve
from rlstore.algos import ppo
from rlstore.algos._on_policy import build_actor_critic
from rlstore.atari import LifeLoss
from rlstore.cli import main
from rlstore.envs import make_vec_env
from rlstore.networks import CnnActorCritic, CnnQNetwork

pytestmark = requires_extra("atari", "ale_py")


def orthogonal_gain(weight: torch.Tensor) -> torch.Tensor:
    """W W^T / gain^2 is the identity for orthogonal rows: returns W W^T."""
    w = weight.detach().reshape(weight.shape[0], -1)
    return w @ w.T


def test_nature_cnn_shapes_and_init():
    agent = CnnActorCritic((4, 84, 84), 6)
    convs = [m for m in agent.trunk if isinstance(m, (torch.nn.Conv2d, torch.nn.Linear))]
    assert [tuple(m.weight.shape) for m in convs] == [
        (32, 4, 8, 8),
        (64, 32, 4, 4),
        (64, 64, 3, 3),
        (512, 3136),
    ]
    for layer in convs:  # orthogonal with gain sqrt(2), zero bias
        eye = torch.eye(layer.weight.shape[0])
        torch.testing.assert_close(orthogonal_gain(layer.weight), 2 * eye, atol=1e-4, rtol=0)
        assert not layer.bias.any()
    torch.testing.assert_close(orthogonal_gain(agent.actor.weight), 1e-4 * torch.eye(6))
    torch.testing.assert_close(orthogonal_gain(agent.critic.weight), torch.ones(1, 1))
    obs = torch.randint(0, 256, (5, 4, 84, 84), dtype=torch.uint8)
    action, log_prob, value = agent.act(obs)
    assert action.shape == log_prob.shape == value.shape == (5,)
    log_prob2, entropy, value2 = agent.evaluate(obs, action)
    torch.testing.assert_close(log_prob2, log_prob)
    torch.testing.assert_close(value2, value)
    assert entropy.shape == (5,)
    q = CnnQNetwork((4, 84, 84), 6, dueling=True)
    assert q(obs).shape == (5, 6)
    np.testing.assert_array_equal(q.greedy_action(obs.numpy()), q(obs).argmax(-1).numpy())


def test_frames_are_scaled_to_one_inside_the_network():
    agent = CnnActorCritic((4, 84, 84), 4)
    obs = torch.randint(0, 256, (3, 4, 84, 84), dtype=torch.uint8)
    after_scaling = agent.trunk[1:](obs.float() / 255.0)
    torch.testing.assert_close(agent.trunk(obs), after_scaling)


def test_observations_stay_uint8_up_to_the_network(logdir):
    cfg, _ = resolve("ppo", "ALE/Breakout-v5", {"num_envs": 2, "num_steps": 8, "logdir": logdir})
    agent, storage, state = build_actor_critic(cfg, algos.get("ppo"), torch.device("cpu"))
    seen = []
    agent.trunk.register_forward_pre_hook(lambda module, args: seen.append(args[0].dtype))
    with torch.inference_mode():
        agent.act(storage.current_obs)
    state.envs.close()
    assert storage.obs.dtype == torch.uint8 and seen == [torch.uint8]


def random_stream(env_id, num_envs, steps, seed=0, **kwargs):
    envs = make_vec_env(env_id, num_envs, seed, **kwargs)
    assert isinstance(envs, LifeLoss)
    obs, info = envs.reset(seed=seed)
    rng = np.random.default_rng(seed)
    lives = info["lives"].copy()
    for _ in range(steps):
        action = rng.integers(0, envs.single_action_space.n, num_envs)
        next_obs, reward, term, trunc, info = envs.step(action)
        yield obs, action, reward, next_obs, term, trunc, envs.life_lost, lives
        obs, lives = next_obs, info["lives"].copy()
    envs.close()


@pytest.mark.slow
def test_preprocessing_and_life_losses_on_a_real_game():
    games = losses = 0
    prev_done = np.zeros(2, dtype=bool)
    for obs, _, _, next_obs, term, trunc, life_lost, lives in random_stream(
        "ALE/Breakout-v5", 2, 1500
    ):
        assert obs.shape == (2, 4, 84, 84) and obs.dtype == np.uint8
        done = term | trunc
        games, losses = games + int(done.sum()), losses + int(life_lost.sum())
        assert not (life_lost & done).any() and (lives[life_lost] > 0).all()
        # frames keep stacking through life losses; a pseudo-step's next_obs starts a game
        # with zero padding and one real frame
        for env in np.flatnonzero(~prev_done):
            np.testing.assert_array_equal(next_obs[env, :-1], obs[env, 1:])
        for env in np.flatnonzero(prev_done):
            assert not next_obs[env, :3].any() and next_obs[env, 3].any()
        prev_done = done
    assert games >= 2 and losses >= 2 * games


@pytest.mark.slow
def test_frame_once_replay_equals_the_stacks_of_a_real_game():
    kwargs = dict(capacity=1000, num_envs=2, obs_shape=(4, 84, 84), obs_dtype=np.uint8, n_step=3)
    frames, plain = ReplayBuffer(**kwargs, frame_stack=4), ReplayBuffer(**kwargs)
    games = losses = 0
    for obs, action, reward, next_obs, term, trunc, life_lost, _ in random_stream(
        "ALE/Breakout-v5", 2, 3000, seed=1
    ):
        games, losses = games + int((term | trunc).sum()), losses + int(life_lost.sum())
        for buffer in (frames, plain):
            buffer.add(obs, action, np.sign(reward), next_obs, term, trunc, life_lost)
    assert games >= 4 and losses >= 8
    assert assert_same_as_plain(frames, plain) == len(frames) >= len(plain) - 3 * 2
    assert frames.stacks.frames.nbytes < plain.obs.nbytes / 2  # (a small start ring: 128 stacks)


@pytest.mark.slow
def test_logged_returns_are_whole_unclipped_games(logdir, monkeypatch):
    """The run's episode returns are the env's own rewards summed over whole games (all
    lives), counted by a spy on the env, although the learner sees their signs."""
    games, running, raw_rewards, life_losses = [], None, [], [0]
    step = LifeLoss.step

    def spy(self, actions):
        nonlocal running
        out = step(self, actions)
        reward, done = out[1], out[2] | out[3]
        running = np.zeros(len(reward)) if running is None else running
        running += reward
        raw_rewards.extend(reward.tolist())
        life_losses[0] += int(self.life_lost.sum())
        for env in np.flatnonzero(done):
            games.append(float(running[env]))
            running[env] = 0.0
        return out

    monkeypatch.setattr(LifeLoss, "step", spy)
    cfg, preset = resolve(
        "ppo",
        "ALE/SpaceInvaders-v5",
        dict(
            num_envs=2,
            num_steps=128,
            total_timesteps=2048,
            logdir=logdir,
            progress=False,
            device="cpu",
            seed=3,
        ),
    )
    assert cfg.sign_rewards
    result = ppo.train(cfg, preset)
    assert len(games) >= 1 and result.episode_returns == games
    assert max(raw_rewards) > 1 and life_losses[0] > len(games)  # clipping or lives would show


@pytest.mark.slow
@pytest.mark.parametrize("algo", ["ppo", "dqn"])
def test_cli_trains_on_an_atari_id_with_its_defaults(algo, logdir, capsys):
    budget = {
        "ppo": ["--num-envs", "2", "--num-steps", "32", "--total-timesteps", "256"],
        "dqn": ["--total-timesteps", "300", "--learning-starts", "100", "--buffer-size", "500"],
    }[algo]
    env_id = "ALE/Pong-v5" if algo == "dqn" else "ALE/Breakout-v5"
    code = main(["train", algo, "--env", env_id, *budget, "--logdir", logdir, "--no-progress"])
    out = capsys.readouterr().out
    assert code == 0 and f"configs/{algo}/atari.toml" in out
    (run_dir,) = Path(logdir).iterdir()
    config = json.loads((run_dir / "config.json").read_text())
    assert config["sign_rewards"] and not config["sticky_actions"]
    # --torch-threads auto: every core for the CNN (idle threads sleep: OMP_WAIT_POLICY)
    assert config["resolved"]["torch_threads"] == len(os.sched_getaffinity(0))
    record = torch.load(run_dir / "model.pt", weights_only=True)
    assert record["policy"]["network"] == ("cnn_q_network" if algo == "dqn" else "cnn_actor_critic")
    assert main(["eval", str(run_dir), "--episodes", "1"]) == 0


@pytest.mark.slow
def test_gymnasium_wrappers_give_the_same_kind_of_stream():
    """--vectorization sync: Gymnasium's AtariPreprocessing instead of ale-py's vector env,
    with the same shapes, zero padding at a game's start, FIRE reset and life losses."""
    first, losses, games, prev_done = True, 0, 0, np.zeros(2, dtype=bool)
    for obs, _, _, next_obs, term, trunc, life_lost, _ in random_stream(
        "ALE/Breakout-v5", 2, 600, vectorization="sync"
    ):
        if first:
            assert obs.shape == (2, 4, 84, 84) and obs.dtype == np.uint8
            assert not obs[:, :3].any() and obs[:, 3].any()
            first = False
        losses, games = losses + int(life_lost.sum()), games + int((term | trunc).sum())
        for env in np.flatnonzero(~prev_done):  # a pseudo-step's next_obs starts a game
            np.testing.assert_array_equal(next_obs[env, :-1], obs[env, 1:])
        for env in np.flatnonzero(prev_done):
            assert not next_obs[env, :3].any()
        prev_done = term | trunc
    assert losses >= 2


@pytest.mark.slow
@pytest.mark.parametrize("fire_on_life_loss", [False, True])
def test_fire_after_a_lost_life_is_an_option(fire_on_life_loss, logdir, capsys):
    """A policy that only ever does NOOP: FIRE at reset launches Breakout's first ball, and
    without --fire-on-life-loss the game then waits after the first lost life until the
    time limit; with it, every ball is launched and the game ends on its last life."""
    envs = make_vec_env(
        "ALE/Breakout-v5", 1, 0, fire_on_life_loss=fire_on_life_loss, max_episode_steps=3000
    )
    _, info = envs.reset(seed=0)
    lost = steps = 0
    term = trunc = np.zeros(1, bool)
    while not (term[0] or trunc[0]):
        _, _, term, trunc, info = envs.step(np.zeros(1, np.int64))  # NOOP
        lost, steps = lost + int(envs.life_lost[0]), steps + 1
    envs.close()
    if fire_on_life_loss:
        assert term[0] and not trunc[0] and lost == 4 and steps < 1500  # 5 balls, game over
    else:
        assert trunc[0] and lost == 1 and info["lives"][0] == 4  # stalled after one ball
    code = main(
        [
            "train",
            "ppo",
            "--env",
            "ALE/Breakout-v5",
            "--fire-on-life-loss",
            "--vectorization",
            "native",
            "--logdir",
            logdir,
        ]
    )
    assert code == 2 and "use --vectorization auto, sync or async" in capsys.readouterr().err
    assert not Path(logdir).exists()
