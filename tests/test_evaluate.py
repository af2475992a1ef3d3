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
from rlstore.checkpoint import checkpoint_files
from rlstore.cli import main
from rlstore.config import PPOConfig


def test_eval_and_load_policy(tmp_path, capsys):
    _, cfg = SETUPS["ppo"]
    run_dir = ppo.train(replace(cfg, logdir=str(tmp_path), track_tensorboard=True)).run_dir
    capsys.readouterr()
    assert main(["eval", str(run_dir), "--episodes", "3", "--deterministic"]) == 0
    out = capsys.readouterr().out
    assert "eval ppo CartPole-v1 (3 episodes, deterministic): return" in out and "+-" in out
    result = json.loads((run_dir / "eval.json").read_text())
    assert len(result["returns"]) == 3 and result["mean_return"] == np.mean(result["returns"])
    assert all(length <= 60 for length in result["lengths"])  # the run's own time limit
    policy = rlstore.load_policy(run_dir)
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
    run_dir = ppo.train(PPOConfig(env_id="Pendulum-v1", total_timesteps=512, num_steps=64,
                                  logdir=str(tmp_path / "p"), **COMMON)).run_dir  # fmt: skip
    policy = rlstore.load_policy(run_dir / "model.pt")
    actions = policy(np.zeros((64, 3), np.float32), deterministic=False)
    assert actions.shape == (64, 1) and np.all(np.abs(actions) <= 2.0)  # clipped to the env
    assert main(["eval", str(run_dir), "--episodes", "1"]) == 0


def test_eval_bad_input(tmp_path, capsys):
    assert main(["eval", str(tmp_path)]) == 2
    assert "is not a run directory" in capsys.readouterr().err
    _, cfg = SETUPS["ppo"]
    run_dir = ppo.train(replace(cfg, logdir=str(tmp_path))).run_dir
    (run_dir / "model.pt").unlink()
    assert main(["eval", str(run_dir)]) == 2
    err = capsys.readouterr().err
    assert "has no final model" in err and "--checkpoint" in err and err.count("\n") == 1
    newest = checkpoint_files(run_dir / "checkpoints")[0]
    assert main(["eval", str(run_dir), "--checkpoint", str(newest), "--episodes", "1"]) == 0
    if shutil.which("ffmpeg") is None:
        try:
            import moviepy  # noqa: F401
        except ImportError:
            assert main(["eval", str(run_dir), "--checkpoint", str(newest), "--video"]) == 2
            assert "rlstore[video]" in capsys.readouterr().err


@needs("video", "moviepy", "pygame")
def test_eval_records_a_video_when_moviepy_is_installed(tmp_path):
    _, cfg = SETUPS["ppo"]
    run_dir = ppo.train(replace(cfg, logdir=str(tmp_path))).run_dir
    assert main(["eval", str(run_dir), "--episodes", "1", "--video"]) == 0
    assert list((run_dir / "videos").glob("*.mp4"))
