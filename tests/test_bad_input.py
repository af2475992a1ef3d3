"""Every user mistake: one clear line on stderr, exit status 2, no traceback, nothing written."""

import subprocess
import sys
from pathlib import Path

import pytest

from rlstore.cli import main


def run_main(args, logdir, capsys):
    code = main(["train", *args, "--logdir", logdir, "--no-progress"])
    captured = capsys.readouterr()
    return code, captured.err


@pytest.mark.parametrize(
    "args, message",
    [
        (["ppo", "--env", "CartPol-v1"], "unknown env id 'CartPol-v1'; did you mean CartPole-v1"),
        (["ppo", "--num-minibatches", "3"], "--num-minibatches 3 does not divide the batch"),
        (["ppo", "--num-envs", "0"], "--num-envs must be at least 1"),
        (["ppo", "--total-timesteps", "100"], "smaller than one rollout"),
        (["a2c", "--total-timesteps", "10"], "smaller than one rollout"),
        (["ppo", "--device", "tpu"], "unknown --device 'tpu'"),
        (["ppo", "--device", "cuda"], "no CUDA GPU is available; use --device cpu"),
        (["ppo", "--config", "nowhere.toml"], "--config file 'nowhere.toml' does not exist"),
        (["ppo", "--gamma", "1.5"], "--gamma must lie in [0, 1]"),
        (["dqn", "--env", "Pendulum-v1"], "DQN needs a Discrete action space; Pendulum-v1 has"),
        (["dqn", "--batch-size", "20000"], "--batch-size 20000 must lie in [1, --buffer-size"),
        (["dqn", "--total-timesteps", "5000"], "--learning-starts 10000 is larger than"),
        (["dqn", "--n-step", "0"], "--n-step must be at least 1"),
        (["dqn", "--per-alpha", "1.5"], "--per-alpha must lie in [0, 1]"),
    ],
)
def test_bad_input_gives_one_line_and_exit_2(args, message, logdir, capsys):
    code, err = run_main(args, logdir, capsys)
    assert code == 2
    assert err.count("\n") == 1 and err.startswith("rlstore: error: ")
    assert message in err
    assert not Path(logdir).exists()  # nothing was created


def test_config_file_with_unknown_or_mistyped_keys(tmp_path, logdir, capsys):
    bad = tmp_path / "bad.toml"
    bad.write_text("learnin_rate = 0.1\n")
    code, err = run_main(["ppo", "--config", str(bad)], logdir, capsys)
    assert code == 2 and "unknown key 'learnin_rate' (did you mean 'learning_rate'?)" in err
    bad.write_text("num_envs = 'four'\n")
    code, err = run_main(["ppo", "--config", str(bad)], logdir, capsys)
    assert code == 2 and "'num_envs' = 'four' has the wrong type" in err
    bad.write_text("num_envs = [\n")
    code, err = run_main(["ppo", "--config", str(bad)], logdir, capsys)
    assert code == 2 and "is not valid: " in err and err.count("\n") == 1
    assert not Path(logdir).exists()


def test_unknown_command_and_missing_algorithm(capsys):
    assert main(["trian", "ppo"]) == 2
    assert "unknown command 'trian'" in capsys.readouterr().err
    assert main([]) == 2


def test_console_script_exit_status_and_no_traceback(tmp_path):
    existing = tmp_path / "runs" / "keep.txt"
    existing.parent.mkdir()
    existing.write_text("precious")
    proc = subprocess.run(
        [
            sys.executable,
            "-m",
            "rlstore",
            "train",
            "ppo",
            "--env",
            "NoSuchEnv-v0",
            "--logdir",
            str(existing.parent),
        ],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert proc.returncode == 2
    assert "Traceback" not in proc.stderr and proc.stderr.count("\n") == 1
    assert existing.read_text() == "precious" and len(list(existing.parent.iterdir())) == 1
