"""The user's own environments: --env-kwargs, --wrapper, envs made by a function and
rlstore.train from Python; what the run records rebuilds the same env for rlstore eval and
resume; each mistake is one line."""

import json
import os
import subprocess
import sys
from pathlib import Path

import gymnasium as gym
import pytest
import space_envs  # noqa: F401 (registers the test envs)
from tiny_runs import only_run_dir

import rlstore
from rlstore.cli import main
from rlstore.custom_envs import parse_env_kwargs
from rlstore.errors import UsageError
from rlstore.evaluate import evaluate

TINY = dict(total_timesteps=512, num_steps=64, progress=False)


def test_env_kwargs_are_python_literals_or_strings():
    assert parse_env_kwargs(
        [
            "is_slippery=False",
            "n=3",
            "p=0.5",
            "map_name=8x8",
            "name='4x4'",
            "shape=[1, 2]",
            "empty=",
        ]
    ) == {
        "is_slippery": False,
        "n": 3,
        "p": 0.5,
        "map_name": "8x8",
        "name": "4x4",
        "shape": [1, 2],
        "empty": "",
    }
    for bad in ("is_slippery", "=3", "not a name=1"):
        with pytest.raises(UsageError, match="--env-kwargs takes KEY=VALUE items"):
            parse_env_kwargs([bad])


def test_kwargs_and_wrappers_are_recorded_and_eval_rebuilds_the_env(tmp_path, capsys):
    """An 8x8 lake (64 states, from the kwargs) whose every step pays 1 (the wrapper):
    config.json keeps both, and `rlstore eval` plays the same env, so each episode's return
    is its length."""
    logdir = str(tmp_path / "runs")
    code = main(
        [
            "train",
            "ppo",
            "--env",
            "FrozenLake-v1",
            "--env-kwargs",
            "map_name=8x8",
            "is_slippery=True",
            "--wrapper",
            "space_envs:reward_per_step",
            "--total-timesteps",
            "512",
            "--num-steps",
            "64",
            "--logdir",
            logdir,
            "--no-progress",
        ]
    )
    assert code == 0
    run_dir = only_run_dir(logdir)
    config = json.loads((run_dir / "config.json").read_text())
    assert config["env_kwargs"] == ["map_name=8x8", "is_slippery=True"]
    assert config["wrapper"] == ["space_envs:reward_per_step"]
    policy = rlstore.load_policy(run_dir)
    assert policy.info["observation"] == {"type": "discrete", "n": 64, "start": 0}
    result = evaluate(run_dir, episodes=4)
    assert result["returns"] == [float(n) for n in result["lengths"]]
    capsys.readouterr()
    assert main(["eval", str(run_dir), "--episodes", "2"]) == 0


def test_wrappers_apply_in_order_with_every_vectorization(tmp_path):
    for vectorization in ("sync", "async"):
        result = rlstore.train(
            "a2c",
            env="space_envs:BitParity-v0",
            vectorization=vectorization,
            wrapper=("space_envs:reward_per_step",),
            num_envs=2,
            total_timesteps=100,
            logdir=str(tmp_path),
            progress=False,
        )
        assert set(result.episode_returns) == {5.0}  # five steps, 1 each


def test_an_env_made_by_a_function_trains_from_python_and_evaluates_from_the_cli(tmp_path, capsys):
    result = rlstore.train("ppo", env=space_envs.make_bit_parity, logdir=str(tmp_path), **TINY)
    config = json.loads((result.run_dir / "config.json").read_text())
    assert config["env_id"] == "space_envs:make_bit_parity"
    capsys.readouterr()
    assert main(["eval", str(result.run_dir), "--episodes", "3"]) == 0
    assert "eval ppo space_envs:make_bit_parity (3 episodes" in capsys.readouterr().out
    cfg = rlstore.resolve("ppo", config["env_id"], {"logdir": str(tmp_path), **TINY})[0]
    assert rlstore.train_ppo(cfg, resume=result.run_dir).global_step == result.global_step


def test_an_id_registered_by_a_module_of_the_user_records_the_module(tmp_path):
    """space_envs registers BitParity-v0 on import: the run records space_envs:BitParity-v0,
    which a process that never imported space_envs finds (rlstore eval)."""
    result = rlstore.train("ppo", env="BitParity-v0", logdir=str(tmp_path), **TINY)
    config = json.loads((result.run_dir / "config.json").read_text())
    assert config["env_id"] == "space_envs:BitParity-v0"
    eval_code = (
        f"from rlstore.cli import main; raise SystemExit(main(['eval', '{result.run_dir}']))"
    )
    import subprocess
    import sys

    done = subprocess.run(
        [sys.executable, "-c", eval_code], capture_output=True, text=True, cwd=Path(__file__).parent
    )
    assert done.returncode == 0, done.stderr
    assert "eval ppo space_envs:BitParity-v0" in done.stdout


def test_learns_the_slippery_free_lake(tmp_path):
    """PPO on FrozenLake-v1 with is_slippery=False: every evaluation episode reaches the
    goal in the 6 steps of a shortest path."""
    result = rlstore.train(
        "ppo",
        env="FrozenLake-v1",
        env_kwargs=("is_slippery=False",),
        total_timesteps=10_000,
        logdir=str(tmp_path),
        progress=False,
    )
    scores = evaluate(result.run_dir, episodes=5)
    assert scores["returns"] == [1.0] * 5 and scores["lengths"] == [6] * 5


def make_in_a_function():
    return gym.make("CartPole-v1")


@pytest.mark.parametrize(
    "env, message",
    [
        (gym.make("CartPole-v1"), "not an env object: pass e.g. env=make_env, not make_env()"),
        (lambda: gym.make("CartPole-v1"), "is a lambda, a closure or a partial, which rlstore"),
        (3, "env= takes an env id or a function, not a int"),
    ],
)
def test_train_from_python_refuses_what_it_cannot_record(env, message, tmp_path):
    with pytest.raises(UsageError, match=message):
        rlstore.train("ppo", env=env, logdir=str(tmp_path))
    assert not list(tmp_path.iterdir())


@pytest.mark.parametrize(
    "args, message",
    [
        (["--env-kwargs", "slippery=False"], "FrozenLake-v1 does not take --env-kwargs slippery"),
        (["--env-kwargs", "slippery"], "--env-kwargs takes KEY=VALUE items, got 'slippery'"),
        (["--wrapper", "nowhere_module:wrap"], "--wrapper nowhere_module:wrap: cannot import"),
        (["--wrapper", "space_envs:missing"], "module 'space_envs' has no 'missing'"),
        (["--wrapper", "space_envs"], "--wrapper takes module:Callable, got 'space_envs'"),
        (["--wrapper", "space_envs:not_a_wrapper"], "returned str, not a gymnasium Env"),
        (["--wrapper", "space_envs:BitParity.metadata"], "'BitParity.metadata' is a dict"),
        (
            ["--vectorization", "native", "--wrapper", "space_envs:reward_per_step"],
            "--vectorization native cannot build FrozenLake-v1",
        ),
    ],
)
def test_custom_env_mistakes_are_one_line(args, message, tmp_path, capsys):
    logdir = tmp_path / "runs"
    code = main(
        ["train", "ppo", "--env", "FrozenLake-v1", *args, "--logdir", str(logdir), "--no-progress"]
    )
    err = capsys.readouterr().err
    assert code == 2 and err.count("\n") == 1, err
    assert message in err
    assert not Path(logdir).exists()


def test_an_unknown_id_names_the_custom_env_forms(tmp_path, capsys):
    code = main(["train", "ppo", "--env", "MyOwnEnv-v0", "--logdir", str(tmp_path)])
    assert code == 2
    assert "an env of your own: --env module:EnvId" in capsys.readouterr().err


def test_the_console_command_finds_a_module_in_the_working_directory(tmp_path):
    """`rlstore train --env shelf:...` from the directory that holds shelf.py, as the guide
    says: the console script's own path lacks the working directory."""
    rlstore_command = Path(sys.executable).parent / "rlstore"
    if not rlstore_command.exists():
        pytest.skip("rlstore's console command is not installed beside this Python")
    (tmp_path / "bits_here.py").write_text(
        "import gymnasium as gym\n"
        "gym.register('BitsHere-v0', entry_point='space_envs:BitParity', max_episode_steps=5)\n"
    )
    tests_dir = str(Path(__file__).parent)  # (space_envs, which the module's entry point names)
    done = subprocess.run(
        [
            str(rlstore_command),
            "train",
            "ppo",
            "--env",
            "bits_here:BitsHere-v0",
            "--total-timesteps",
            "512",
            "--no-progress",
            "--logdir",
            "runs",
        ],
        cwd=tmp_path,
        capture_output=True,
        text=True,
        env={**os.environ, "PYTHONPATH": tests_dir},
    )
    assert done.returncode == 0, done.stderr


SCRIPT = """
import functools, sys
import gymnasium as gym
import rlstore
from rlstore.errors import UsageError
from space_envs import BitParity

def make():
    return gym.wrappers.TimeLimit(BitParity(), max_episode_steps=5)

class Tiny(BitParity):
    pass

gym.register("MyTiny-v0", entry_point=Tiny, max_episode_steps=5)
gym.register("ScriptBits-v0", entry_point="space_envs:BitParity", max_episode_steps=5)
TINY = dict(total_timesteps=1024, num_steps=64, progress=False, logdir=sys.argv[1])
for env in (make, lambda: make(), functools.partial(make), "MyTiny-v0", "ScriptBits-v0"):
    try:
        rlstore.train("ppo", env=env, **TINY)
    except UsageError as e:
        print("refused:", e)
    print("run:", rlstore.train("ppo", env=env, pickle_env=True, **TINY).run_dir)
"""


def test_envs_of_the_training_script_are_refused_or_saved_with_the_run(tmp_path, capsys):
    """A function of the script (__main__), a lambda, a partial, an id the script registers
    (entry point in the script, or in a module that does not register the id): refused
    before training, or with pickle_env saved as env.pkl, which eval and resume load only
    with --trust-env-code."""
    (tmp_path / "script.py").write_text(SCRIPT)
    done = subprocess.run(
        [sys.executable, str(tmp_path / "script.py"), str(tmp_path / "runs")],
        capture_output=True,
        text=True,
        cwd=Path(__file__).parent,
        env={**os.environ, "PYTHONPATH": str(Path(__file__).parent)},
    )
    assert done.returncode == 0, done.stderr
    lines = done.stdout.splitlines()
    refused = [line for line in lines if line.startswith("refused:")]
    runs = [Path(line.split(": ", 1)[1]) for line in lines if line.startswith("run:")]
    assert "env=make is defined in the script you run (__main__)" in refused[0]
    assert "env=<lambda> is a lambda, a closure or a partial" in refused[1]
    assert "env=make is a lambda, a closure or a partial" in refused[2]
    for line in refused[3:]:
        assert "is registered by the script you run, not by a module" in line
    assert len(refused) == 5 and len(runs) == 5
    assert len(list((tmp_path / "runs").iterdir())) == 5  # the refusals made no run
    for run_dir in runs:
        assert (run_dir / "env.pkl").is_file()
        env_id = json.loads((run_dir / "config.json").read_text())["env_id"]
        assert env_id.startswith("pickled/"), env_id
        gym.registry.pop(env_id, None)  # (as in a new process)
        capsys.readouterr()
        assert main(["eval", str(run_dir), "--episodes", "2"]) == 2
        assert "loading it runs that code: if you trust the run" in capsys.readouterr().err
        assert main(["eval", str(run_dir), "--episodes", "2", "--trust-env-code"]) == 0
        assert "length 5.0 +- 0.0" in capsys.readouterr().out  # BitParity: five steps
    gym.registry.pop(env_id)
    args = ["resume", str(runs[-1]), "--total-timesteps", "2048", "--no-progress"]
    assert main(args) == 2 and main([*args, "--trust-env-code"]) == 0
