"""Evaluation: load_policy (actions, values, Q-values) and `rlstore eval`."""

import json
import shutil

import numpy as np
import pytest
import torch
from extras import needs
from tiny_runs import COMMON, SETUPS, replace

import rlstore
from rlstore.algos import dqn, ppo
from rlstore.algos.ppo import PPOConfig
from rlstore.checkpoint import checkpoint_files
from rlstore.cli import main


def test_eval_and_load_policy(tmp_path, capsys):
    _, cfg = SETUPS["ppo"]
    run_dir = ppo.train(replace(cfg, logdir=str(tmp_path), track_tensorboard=True)).run_dir
    capsys.readouterr()
    assert main(["eval", str(run_dir), "--episodes", "3"]) == 0
    first, *_, last = capsys.readouterr().out.splitlines()
    assert "3 episodes, deterministic: the policy's mode; --stochastic samples" in first
    assert "eval ppo CartPole-v1 (3 episodes, deterministic): return" in last and "+-" in last
    [result] = json.loads((run_dir / "eval.json").read_text())["evaluations"]
    assert len(result["returns"]) == 3 and result["mean_return"] == np.mean(result["returns"])
    assert all(length <= 60 for length in result["lengths"])  # the run's own time limit
    policy = rlstore.load_policy(run_dir)
    seed, limit = policy.config["seed"] + 10_000, policy.config["max_episode_steps"]
    assert result["returns"] == rollout_returns(policy, seed, 3, max_episode_steps=limit)
    obs = np.random.default_rng(0).normal(size=(5, 4)).astype(np.float32)
    actions = policy(obs)
    assert actions.shape == (5,) and set(actions.tolist()) <= {0, 1}
    assert policy(obs[0]).shape == ()
    with torch.no_grad():  # the value is the critic's, for a batch or one observation
        critic = policy.network.critic(torch.from_numpy(obs)).squeeze(-1).numpy()
    np.testing.assert_allclose(policy.value(obs), critic, rtol=1e-6)
    assert policy.value(obs[0]) == pytest.approx(critic[0], rel=1e-6)
    with pytest.raises(TypeError, match="use value"):
        policy.q_values(obs)
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    events = EventAccumulator(str(run_dir))
    events.Reload()
    assert "eval/episodic_return" in events.Tags()["scalars"]


def rollout_returns(policy, seed: int, episodes: int, **env_kwargs) -> list[float]:
    """The oracle: the policy's mode, one episode per seed from `seed` on."""
    import gymnasium as gym

    env, returns = gym.make(policy.env_id, **env_kwargs), []
    for episode in range(episodes):
        obs, _ = env.reset(seed=seed + episode)
        total, done = 0.0, False
        while not done:
            obs, reward, terminated, truncated, _ = env.step(policy(obs, deterministic=True))
            total, done = total + float(reward), terminated or truncated
        returns.append(total)
    return returns


def test_eval_json_keeps_one_entry_per_model_and_mode(tmp_path, capsys):
    _, cfg = SETUPS["ppo"]
    run_dir = ppo.train(replace(cfg, logdir=str(tmp_path))).run_dir
    newest = checkpoint_files(run_dir / "checkpoints")[0]
    assert main(["eval", str(run_dir), "--episodes", "2"]) == 0
    assert main(["eval", str(run_dir), "--episodes", "2", "--stochastic"]) == 0
    assert "stochastic: actions sampled from the policy" in capsys.readouterr().out
    relative = str(newest.relative_to(run_dir))  # a path relative to the run directory
    assert main(["eval", str(run_dir), "--episodes", "1", "--checkpoint", relative]) == 0
    assert main(["eval", str(run_dir), "--episodes", "3"]) == 0  # replaces the first entry
    entries = json.loads((run_dir / "eval.json").read_text())["evaluations"]
    settings = [(e["model"], e["mode"], e["episodes"]) for e in entries]
    assert settings == [
        ("model.pt", "stochastic", 2),
        (relative, "deterministic", 1),
        ("model.pt", "deterministic", 3),
    ]


def test_eval_dqn_and_continuous_policies(tmp_path, capsys):
    _, cfg = SETUPS["dqn"]
    run_dir = dqn.train(replace(cfg, logdir=str(tmp_path / "d"))).run_dir
    capsys.readouterr()
    assert main(["eval", str(run_dir), "--episodes", "2"]) == 0
    assert "eval dqn CartPole-v1 (2 episodes, greedy): return" in capsys.readouterr().out
    policy = rlstore.load_policy(run_dir)
    obs = np.random.default_rng(1).normal(size=(6, 4)).astype(np.float32)
    q = policy.q_values(obs)
    assert q.shape == (6, 2) and policy.q_values(obs[0]).shape == (2,)
    np.testing.assert_array_equal(policy(obs), q.argmax(-1))  # acts greedily on them
    with pytest.raises(TypeError, match="use q_values"):
        policy.value(obs)
    run_dir = ppo.train(
        PPOConfig(
            env_id="Pendulum-v1",
            total_timesteps=512,
            num_steps=64,
            logdir=str(tmp_path / "p"),
            **COMMON,
        )
    ).run_dir
    policy = rlstore.load_policy(run_dir / "model.pt")
    actions = policy(np.zeros((64, 3), np.float32), deterministic=False)
    assert actions.shape == (64, 1) and np.all(np.abs(actions) <= 2.0)  # clipped to the env
    assert main(["eval", str(run_dir), "--episodes", "1"]) == 0


def test_eval_bad_input(tmp_path, capsys):
    assert main(["eval", str(tmp_path)]) == 2
    assert "is not a run directory" in capsys.readouterr().err
    _, cfg = SETUPS["ppo"]
    run_dir = ppo.train(replace(cfg, logdir=str(tmp_path))).run_dir
    assert main(["eval", str(tmp_path)]) == 2  # the directory above: it names the run
    assert f"{tmp_path} is not a run directory but holds 1 run ({run_dir.name}); give one" in (
        capsys.readouterr().err
    )
    (run_dir / "model.pt").unlink()
    assert main(["eval", str(run_dir)]) == 2
    err = capsys.readouterr().err
    assert "has no model.pt" in err and "--checkpoint" in err and err.count("\n") == 1
    newest = checkpoint_files(run_dir / "checkpoints")[0]
    assert main(["eval", str(run_dir), "--checkpoint", str(newest), "--episodes", "1"]) == 0
    assert main(["eval", str(run_dir), "--checkpoint", newest.name, "--episodes", "1"]) == 0
    capsys.readouterr()
    assert main(["eval", str(run_dir), "--checkpoint", "checkpoints/step_9.pt"]) == 2
    err = capsys.readouterr().err
    assert "--checkpoint checkpoints/step_9.pt: that file does not exist" in err
    assert str(newest) in err and err.count("\n") == 1
    assert main(["eval", str(tmp_path / "no-such-run")]) == 2
    assert "no-such-run does not exist" in capsys.readouterr().err
    if shutil.which("ffmpeg") is None:
        try:
            import moviepy  # noqa: F401
        except ImportError:
            assert main(["eval", str(run_dir), "--checkpoint", str(newest), "--video"]) == 2
            assert "rlstore[video]" in capsys.readouterr().err


@pytest.mark.slow
@needs("video", "moviepy", "pygame")
def test_eval_records_a_video_when_moviepy_is_installed(tmp_path, monkeypatch, capfd):
    monkeypatch.setenv("XDG_RUNTIME_DIR", str(tmp_path / "not-there"))  # no display, no session
    _, cfg = SETUPS["ppo"]
    run_dir = ppo.train(replace(cfg, logdir=str(tmp_path))).run_dir
    assert main(["eval", str(run_dir), "--episodes", "1", "--video"]) == 0
    assert main(["eval", str(run_dir), "--episodes", "1", "--video"]) == 0  # a second file
    assert "XDG_RUNTIME_DIR" not in capfd.readouterr().err  # SDL's complaint stays out
    names = sorted(p.name for p in (run_dir / "videos").glob("*.mp4"))
    assert names == ["model-deterministic-1-episode-0.mp4", "model-deterministic-episode-0.mp4"]


def test_eval_samples_only_when_asked(tmp_path, monkeypatch):
    """--stochastic reaches the policy call; the default takes the mode."""
    _, cfg = SETUPS["ppo"]
    run_dir = ppo.train(replace(cfg, logdir=str(tmp_path))).run_dir
    seen = set()
    real_call = rlstore.Policy.__call__

    def watched(self, obs, deterministic=True, action_mask=None):
        seen.add(deterministic)
        return real_call(self, obs, deterministic, action_mask)

    monkeypatch.setattr(rlstore.Policy, "__call__", watched)
    assert main(["eval", str(run_dir), "--episodes", "1"]) == 0
    assert seen == {True}
    seen.clear()
    assert main(["eval", str(run_dir), "--episodes", "1", "--stochastic"]) == 0
    assert seen == {False}


@pytest.mark.slow
@needs("video", "moviepy", "pygame")
def test_eval_records_a_sac_video(tmp_path, monkeypatch):
    """A continuous-action policy (SAC on Pendulum) renders and records as the others."""
    from rlstore.algos import sac

    monkeypatch.setenv("XDG_RUNTIME_DIR", str(tmp_path / "not-there"))
    _, cfg = SETUPS["sac"]
    run_dir = sac.train(replace(cfg, logdir=str(tmp_path), total_timesteps=400)).run_dir
    assert main(["eval", str(run_dir), "--episodes", "1", "--video"]) == 0
    assert [p.name for p in (run_dir / "videos").glob("*.mp4")] == [
        "model-deterministic-episode-0.mp4"
    ]


def test_evaluation_cuts_episodes_of_an_env_without_a_time_limit(tmp_path, capsys):
    """Endless-v0 never ends and has no time limit: evaluation cuts its episodes at
    EVAL_STEP_LIMIT (or --max-episode-steps) and says so; an env with a limit is not cut."""
    import space_envs  # noqa: F401 (registers Endless-v0)

    from rlstore.envs import check_env_id
    from rlstore.evaluate import EVAL_STEP_LIMIT, eval_step_limit

    assert eval_step_limit(check_env_id("space_envs:Endless-v0"), {}) == EVAL_STEP_LIMIT
    assert eval_step_limit(check_env_id("space_envs:Endless-v0"), {"max_episode_steps": 9}) is None
    assert eval_step_limit(check_env_id("CartPole-v1"), {}) is None
    result = rlstore.train(
        "ppo",
        env="space_envs:Endless-v0",
        total_timesteps=256,
        num_envs=2,
        num_steps=64,
        logdir=str(tmp_path),
        progress=False,
    )
    capsys.readouterr()
    assert main(["eval", str(result.run_dir), "--episodes", "2"]) == 0
    out = capsys.readouterr().out
    assert f"2 of 2 episodes cut at {EVAL_STEP_LIMIT:,} steps" in out
    assert f"length {EVAL_STEP_LIMIT:.1f}" in out
    assert main(["eval", str(result.run_dir), "--episodes", "3", "--max-episode-steps", "7"]) == 0
    out = capsys.readouterr().out
    assert "cut at" not in out and "return 7.0 +- 0.0" in out  # the user's limit: no notice


def test_eval_plays_on_another_env_and_without_masks_when_asked(tmp_path, capsys):
    import space_envs  # noqa: F401 (registers MaskedPick-v0)

    result = rlstore.train(
        "dqn",
        env="space_envs:MaskedPick-v0",
        total_timesteps=300,
        learning_starts=100,
        buffer_size=300,
        logdir=str(tmp_path),
        progress=False,
    )
    capsys.readouterr()
    assert main(["eval", str(result.run_dir), "--episodes", "2"]) == 0
    assert 'action masks from info["action_mask"]' in capsys.readouterr().out
    # the env raises on a masked action: played without the masks, the policy meets one
    with pytest.raises(ValueError, match="is masked"):
        main(["eval", str(result.run_dir), "--episodes", "20", "--action-masks", "off"])
    capsys.readouterr()
    # --env: the env made by a function, which the run did not record
    assert main(["eval", str(result.run_dir), "--env", "space_envs:make_masked_pick"]) == 0
    assert "eval dqn space_envs:make_masked_pick (10 episodes" in capsys.readouterr().out
