"""Every user mistake: one clear line on stderr, exit status 2, no traceback, nothing written."""

import subprocess
import sys
from pathlib import Path

import pytest
import space_envs  # noqa: F401 (registers the test envs)

from rlstore.cli import main


def run_main(args, logdir, capsys):
    code = main(["train", *args, "--logdir", logdir, "--no-progress"])
    captured = capsys.readouterr()
    return code, captured.err


@pytest.mark.parametrize(
    "args, message",
    [
        (["ppo", "--env", "CartPol-v1"], "unknown env id 'CartPol-v1'; did you mean CartPole-v1"),
        (["ppo", "--num-minibatches", "3"], "--num-minibatches 3 does not divide the rollout"),
        (["ppo", "--num-envs", "0"], "--num-envs must be at least 1"),
        (["ppo", "--total-timesteps", "100"], "smaller than one rollout"),
        (["a2c", "--total-timesteps", "10"], "smaller than one rollout"),
        (["ppo", "--device", "tpu"], "unknown --device 'tpu'"),
        (["ppo", "--device", "cuda"], "no CUDA GPU is available; use --device cpu"),
        (["ppo", "--config", "nowhere.toml"], "--config file 'nowhere.toml' does not exist"),
        (["ppo", "--config", "/"], "--config file '/' is a directory; give the path of a TOML"),
        (["ppo", "--gamma", "1.5"], "--gamma must lie in [0, 1]"),
        (["dqn", "--env", "Pendulum-v1"], "DQN needs a Discrete action space; Pendulum-v1 has"),
        (["dqn", "--batch-size", "20000"], "--batch-size 20000 must lie in [1, --buffer-size"),
        (["dqn", "--total-timesteps", "5000"], "--learning-starts 10000 is larger than"),
        (["dqn", "--n-step", "0"], "--n-step must be at least 1"),
        (["dqn", "--per-alpha", "1.5"], "--per-alpha must lie in [0, 1]"),
        (["ppo", "--learning-rate", "-1"], "--learning-rate must be > 0 (got -1.0)"),
        (["a2c", "--learning-rate", "nan"], "--learning-rate must be > 0 (got nan)"),
        (["ppo", "--seed", "-1"], "--seed must be at least 0 (got -1)"),
        (["dqn", "--tau", "0"], "--tau must lie in (0, 1] (got 0.0)"),
        (["ppo", "--torch-threads", "0"], "--torch-threads must be at least 1 (got 0)"),
        (["ppo", "--num-envs", "four"], "Error parsing --num-envs"),
        (["ppo", "--vectorization", "fast"], "invalid choice 'fast'"),
        (["ppo", "--bogus", "3"], "unknown option --bogus"),
        (["ppx"], "unknown algorithm 'ppx'; did you mean 'ppo'?"),
        (["--env", "CartPole-v1", "ppo"], "name the algorithm first"),
        (["ppo", "--config", "fastest"], "--config 'fastest' is neither a file nor a packaged"),
        (
            ["ppo", "--env", "space_envs:Mission-v0"],
            "Mission-v0: the observation's part ['mission'] is Text(",
        ),
        (["ppo", "--env", "space_envs:Mission-v0"], "; leave it out with --drop-obs-keys mission"),
        (
            ["ppo", "--env", "space_envs:Mission-v0", "--drop-obs-keys", "goal"],
            "--drop-obs-keys goal: the observation has no key 'goal' (its keys: mission, state)",
        ),
        (
            ["ppo", "--env", "space_envs:Mission-v0", "--drop-obs-keys", "mission", "state"],
            "the observation would have no key left",
        ),
        (["ppo", "--drop-obs-keys", "x"], "--drop-obs-keys leaves keys out of Dict observations"),
        (
            ["ppo", "--env", "space_envs:BadMask-v0"],
            "the env's action masks are int8 of shape (2,) per env; Discrete(3) needs 3",
        ),
        (
            ["dqn", "--env", "space_envs:BoxGrid-v0"],
            "DQN needs a Discrete action space; space_envs:BoxGrid-v0 has",
        ),
        (
            ["sac", "--env", "space_envs:DictTarget-v0"],
            "SAC takes vector observations, not images such as those in",
        ),
        (["ppo", "--env", "FrozenLake-v1", "--norm-obs"], "--norm-obs normalizes float vector"),
        (["ppo", "--hidden", "0"], "--hidden needs one or more layer widths >= 1"),
        (["dqn", "--norm-obs"], "unknown option --norm-obs"),
        (["dqn", "--q-hidden", "0"], "--q-hidden needs one or more layer widths >= 1"),
        (
            ["ppo", "--sticky-actions"],
            "--sticky-actions applies to Atari games only and CartPole-v1 is not one",
        ),
        (
            ["sac", "--env", "Pendulum-v1", "--fire-on-life-loss"],
            "--fire-on-life-loss applies to Atari games only",
        ),
        (
            ["ppo", "--her"],
            "unknown option --her (an option of c51, crossq, ddpg, dqn, qrdqn, rainbow, sac, "
            "td3, tqc)",
        ),
        (["sac", "--env", "Pendulum-v1", "--her"], "--her needs a goal-conditioned env, whose"),
        (
            ["dqn", "--env", "space_envs:DictTarget-v0", "--her"],
            "DictTarget-v0 observes a Dict of ['image', 'offset']; train without --her",
        ),
        (
            ["td3", "--env", "space_envs:GoalWithoutReward-v0", "--her"],
            "with the env's compute_reward(achieved_goal, desired_goal, info), which",
        ),
        (["ddpg", "--env", "space_envs:GoalPoint-v0", "--her-goals", "-1"], "--her-goals must be"),
        (
            ["sac", "--env", "space_envs:GoalScalarReward-v0", "--her"],
            "with arrays of goals, one per row; on three goals it failed (",
        ),
        (["dqn", "--env", "BitFlipping-v0", "--her", "--n-step", "3"], "--her takes one-step"),
        (["dqn", "--env", "BitFlipping-v0", "--her", "--prioritized"], "--her takes one-step"),
    ],
)
def test_bad_input_gives_one_line_and_exit_2(args, message, logdir, capsys):
    code, err = run_main(args, logdir, capsys)
    assert code == 2
    assert err.count("\n") == 1 and err.startswith("rlstore: error: ")
    assert message in err
    assert "rlstore ppo --help" not in err and "Traceback" not in err
    assert not Path(logdir).exists()  # nothing was created


def test_logdir_that_cannot_hold_runs(tmp_path, capsys):
    a_file = tmp_path / "notes.txt"
    a_file.write_text("precious")
    for logdir, message in [
        (a_file, "notes.txt is a file; give a directory"),
        (a_file / "runs", "notes.txt is a file; give a directory"),
        (Path("/proc/rlstore-runs"), "cannot write in /proc"),
    ]:
        code = main(["train", "ppo", "--logdir", str(logdir), "--no-progress"])
        err = capsys.readouterr().err
        assert code == 2 and err.count("\n") == 1 and f"--logdir {logdir}: " in err
        assert message in err
    assert a_file.read_text() == "precious" and list(tmp_path.iterdir()) == [a_file]


def test_dqn_total_timesteps_error_names_its_own_flags(logdir, capsys):
    code, err = run_main(["dqn", "--total-timesteps", "100"], logdir, capsys)
    assert code == 2 and "--learning-starts 10000 is larger than" in err
    assert "--num-steps" not in err


@pytest.mark.parametrize(
    "env_id, module, extra",
    [
        ("LunarLander-v3", "Box2D", "box2d"),
        ("CarRacing-v3", "Box2D", "box2d"),
        ("HalfCheetah-v5", "mujoco", "mujoco"),
        ("ALE/Pong-v5", "ale_py", "atari"),
        ("BreakoutNoFrameskip-v4", "ale_py", "atari"),
        ("FetchReach-v4", "gymnasium_robotics", "robotics"),
    ],
)
def test_an_env_without_its_extra_names_the_extra(env_id, module, extra, logdir, capsys):
    import importlib.util

    if importlib.util.find_spec(module) is not None:
        pytest.skip(f"{module} is installed")
    code, err = run_main(["ppo", "--env", env_id], logdir, capsys)
    assert code == 2 and err.count("\n") == 1
    assert f'pip install "rlstore[{extra}]"' in err
    assert not Path(logdir).exists()


def test_images_are_refused_by_the_algorithms_without_a_cnn(logdir, capsys):
    import gymnasium as gym
    import numpy as np

    class Images(gym.Env):
        observation_space = gym.spaces.Box(0, 255, (96, 96, 3), np.uint8)
        action_space = gym.spaces.Box(-1, 1, (2,))

    gym.register("rlstore-test/Images-v0", entry_point=Images, max_episode_steps=10)
    try:
        for algo in ("sac", "td3", "ddpg"):
            code, err = run_main([algo, "--env", "rlstore-test/Images-v0"], logdir, capsys)
            assert code == 2 and err.count("\n") == 1
            assert f"{algo.upper()} takes vector observations, not images such as" in err
            assert "images train with a2c, c51, dqn, ppo, ppo_lstm, pqn, qrdqn, rainbow" in err
    finally:
        del gym.registry["rlstore-test/Images-v0"]
    assert not Path(logdir).exists()


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
    assert main([]) == 2  # no command: the usage, exit 2
    assert "usage: rlstore" in capsys.readouterr().out
    assert main(["train"]) == 2  # no algorithm
    err = capsys.readouterr().err
    names = "{a2c, c51, crossq, ddpg, dqn, ppo, ppo_lstm, pqn, qrdqn, rainbow, sac, td3, tqc}"
    assert err == f"rlstore: error: name an algorithm: rlstore train {names} --env ENV_ID\n"


@pytest.mark.slow
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


def test_the_missing_extra_is_named_even_where_it_is_installed(monkeypatch, logdir, capsys):
    """CI installs Box2D and MuJoCo: stand in for a machine without them."""
    import importlib

    import gymnasium as gym

    import rlstore.envs

    real = importlib.import_module

    def without_extras(name, *args):
        if name.startswith(("gymnasium.envs.box2d", "gymnasium.envs.mujoco")):
            raise gym.error.DependencyNotInstalled(f"{name} needs something")
        return real(name, *args)

    monkeypatch.setattr(rlstore.envs.importlib, "import_module", without_extras)
    for env_id, extra in [("LunarLander-v3", "box2d"), ("HalfCheetah-v5", "mujoco")]:
        code, err = run_main(["ppo", "--env", env_id], logdir, capsys)
        assert code == 2 and err.count("\n") == 1
        assert f'pip install "rlstore[{extra}]"' in err
    assert not Path(logdir).exists()


def test_unbounded_actions_are_sent_unclipped_and_said_so(logdir, capsys):
    import gymnasium as gym
    import numpy as np

    class Unbounded(gym.Env):
        observation_space = gym.spaces.Box(-1, 1, (2,), np.float32)
        action_space = gym.spaces.Box(-np.inf, np.inf, (1,), np.float32)

        def reset(self, *, seed=None, options=None):
            super().reset(seed=seed)
            return np.zeros(2, np.float32), {}

        def step(self, action):
            return np.zeros(2, np.float32), -float(np.square(action).sum()), False, False, {}

    gym.register("rlstore-test/Unbounded-v0", entry_point=Unbounded, max_episode_steps=20)
    args = [
        "train",
        "ppo",
        "--env",
        "rlstore-test/Unbounded-v0",
        "--num-steps",
        "32",
        "--total-timesteps",
        "128",
        "--logdir",
        logdir,
        "--no-progress",
    ]
    try:
        assert main(args) == 0
    finally:
        del gym.registry["rlstore-test/Unbounded-v0"]
    out = capsys.readouterr().out
    assert "has unbounded actions" in out and "go to the env unclipped" in out


def test_a_misspelled_flag_gets_a_suggestion(logdir, capsys):
    assert main(["train", "ppo", "--total-timestep", "5000", "--logdir", logdir]) == 2
    err = capsys.readouterr().err
    assert "unknown option --total-timestep (did you mean --total-timesteps?)" in err
    assert "5000" not in err and err.count("\n") == 1 and not Path(logdir).exists()
