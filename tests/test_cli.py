"""The command line: smoke runs, TensorBoard scalars, presets and their precedence."""

import json
import re
import subprocess
import sys
from pathlib import Path

import gymnasium as gym
import pytest
from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

from rlstore import algos, config
from rlstore.cli import main, parse_train

TINY = ["--total-timesteps", "1024", "--no-progress"]


def only_run_dir(logdir) -> Path:
    dirs = list(Path(logdir).iterdir())
    assert len(dirs) == 1
    return dirs[0]


@pytest.mark.parametrize("algo", ["ppo", "a2c"])
def test_train_smoke_writes_config_and_named_scalars(algo, logdir, capsys):
    assert main(["train", algo, "--env", "CartPole-v1", "--logdir", logdir, *TINY]) == 0
    run_dir = only_run_dir(logdir)
    assert run_dir.name.startswith(f"CartPole-v1__{algo}__1__")
    record = json.loads((run_dir / "config.json").read_text())
    assert record["algo"] == algo and record["total_timesteps"] == 1024
    events = EventAccumulator(str(run_dir))
    events.Reload()
    tags = set(events.Tags()["scalars"])
    expected = {
        "charts/episodic_return",
        "charts/episodic_length",
        "charts/SPS",
        "charts/learning_rate",
        "losses/value_loss",
        "losses/policy_loss",
        "losses/entropy",
        "losses/explained_variance",
    }
    if algo == "ppo":
        expected |= {"losses/old_approx_kl", "losses/approx_kl", "losses/clipfrac"}
    assert expected <= tags
    steps = [e.step for e in events.Scalars("charts/SPS")]
    batch = record["num_envs"] * record["num_steps"]
    assert steps == sorted(steps) and steps[-1] == 1024 - 1024 % batch
    assert "hyperparameters" in "".join(events.Tags()["tensors"])
    out = capsys.readouterr().out
    assert f"{algo} CartPole-v1: " in out and "steps/s" in out  # the one-line summary


def test_continuous_actions_smoke(logdir):
    """Pendulum: the Gaussian head, with actions clipped only on their way to the env."""
    args = ["train", "ppo", "--env", "Pendulum-v1", "--num-steps", "64", "--logdir", logdir]
    assert main([*args, *TINY]) == 0
    assert only_run_dir(logdir).name.startswith("Pendulum-v1__ppo__")


@pytest.mark.slow
def test_module_entry_point_and_env_id_alias(logdir):
    proc = subprocess.run(
        [
            sys.executable,
            "-m",
            "rlstore",
            "train",
            "ppo",
            "--env-id",
            "Acrobot-v1",
            "--num-envs",
            "2",
            "--num-steps",
            "64",
            "--logdir",
            logdir,
            *TINY,
        ],
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert proc.returncode == 0, proc.stderr
    assert only_run_dir(logdir).name.startswith("Acrobot-v1__ppo__")


def test_help_lists_every_hyperparameter_with_its_docstring(capsys):
    with pytest.raises(SystemExit) as exit_info:
        parse_train(["ppo", "--help"])
    assert exit_info.value.code == 0
    text = capsys.readouterr().out
    for flag, doc in [
        ("--env-id", "Gymnasium environment id"),
        ("--clip-coef", "clipping"),
        ("--target-kl", "approximate KL"),
        ("--device", "auto"),
    ]:
        assert flag in text and doc in text
    assert main(["--help"]) == 0


def test_precedence_defaults_preset_config_flags(tmp_path, monkeypatch):
    presets = tmp_path / "configs"
    (presets / "ppo").mkdir(parents=True)
    (presets / "ppo" / "Acrobot-v1.toml").write_text(
        "num_envs = 8\nlearning_rate = 1e-3\nseed = 5\n"
    )
    monkeypatch.setattr(config, "PRESET_DIR", presets)
    user = tmp_path / "mine.toml"
    user.write_text("learning_rate = 3e-4\nnum_steps = 64\nseed = 6\n")

    _, cfg, preset = parse_train(["ppo"])
    assert preset is None and cfg.num_envs == 4  # no preset for CartPole-v1 here
    _, cfg, preset = parse_train(["ppo", "--env", "Acrobot-v1"])
    assert preset == presets / "ppo" / "Acrobot-v1.toml"
    assert (cfg.num_envs, cfg.learning_rate, cfg.seed) == (8, 1e-3, 5)  # preset over defaults
    _, cfg, _ = parse_train(["ppo", "--env", "Acrobot-v1", "--config", str(user)])
    assert (cfg.num_envs, cfg.learning_rate, cfg.num_steps, cfg.seed) == (8, 3e-4, 64, 6)
    _, cfg, _ = parse_train(["ppo", "--env=Acrobot-v1", f"--config={user}", "--seed", "9"])
    assert (cfg.learning_rate, cfg.seed) == (3e-4, 9)  # flags over everything


def test_shipped_presets_are_valid():
    found = sorted(p for p in config.PRESET_DIR.glob("*/*.toml") if p.parent.name != "suites")
    names = {f"{p.parent.name}/{p.name}" for p in found}
    assert {"ppo/CartPole-v1.fast.toml", "dqn/CartPole-v1.fast.toml"} <= names
    for path in found:
        algo = path.parent.name
        cfg = config.apply_overrides(
            algos.get(algo).config(), config.read_config(path, "preset"), str(path)
        )
        config.validate(cfg)  # raises UsageError for an invalid preset
        env_id = re.match(r"^(.*?-v\d+)", path.name)  # Env-vN.toml or Env-vN.NAME.toml
        assert path.stem in config.FAMILIES or env_id.group(1) in gym.registry, path


def test_run_start_names_preset_config_run_dir_and_rounding(tmp_path, monkeypatch, capsys):
    """`--config fast` is the packaged preset from any directory; the first line names it
    and the run directory; a total that is not whole rollouts is said to be rounded."""
    monkeypatch.chdir(tmp_path)  # not the repository: the name must resolve to the package
    logdir = str(tmp_path / "runs")
    args = ["train", "ppo", "--config", "fast", "--total-timesteps", "1000", "--logdir", logdir]
    assert main([*args, "--no-progress"]) == 0
    out = capsys.readouterr().out.splitlines()
    run_dir = only_run_dir(logdir)
    fast = config.PRESET_DIR / "ppo" / "CartPole-v1.fast.toml"
    assert out[0] == (
        f"rlstore: ppo on CartPole-v1, preset: none, config file: {fast}; run directory {run_dir}"
    )
    record = json.loads((run_dir / "config.json").read_text())
    rollout = record["num_envs"] * record["num_steps"]
    assert out[1] == (
        f"rlstore: --total-timesteps 1,000 is not a whole number of iterations of {rollout:,} "
        f"env steps; the run takes {1000 - 1000 % rollout:,}"
    )
    assert record["config"] == str(fast) and record["resolved"] == {
        "device": "cpu",
        "torch_threads": 1,
    }


def test_torch_threads_auto_is_one_and_a_number_is_used(logdir):
    import torch
    from threadpoolctl import threadpool_info

    from rlstore.algos import dqn

    def blas_threads():
        return {pool["num_threads"] for pool in threadpool_info() if pool["user_api"] == "blas"}

    seen, seen_blas, before = [], [], blas_threads()
    for threads in ("auto", 2):
        torch.set_num_threads(3)
        cfg = dqn.DQNConfig(total_timesteps=200, learning_starts=100, torch_threads=threads,
                               logdir=logdir, progress=False, track_tensorboard=False)  # fmt: skip
        dqn.train(cfg, on_step=lambda _: (seen.append(torch.get_num_threads()),
                                          seen_blas.append(blas_threads())))  # fmt: skip
        want = 1 if threads == "auto" else 2
        assert set(seen) == {want}
        assert all(pools == {want} for pools in seen_blas)  # numpy's BLAS follows torch
        assert blas_threads() == before  # and is given back when the run ends
        seen.clear()
        seen_blas.clear()
    torch.set_num_threads(1)
    _, cfg, _ = parse_train(["ppo", "--torch-threads", "4"])
    assert cfg.torch_threads == 4
    _, cfg, _ = parse_train(["ppo"])
    assert cfg.torch_threads == "auto"


def test_version_and_help(capsys):
    import rlstore

    assert main(["--version"]) == 0
    assert capsys.readouterr().out == f"rlstore {rlstore.__version__}\n"
    with pytest.raises(SystemExit) as exit_info:  # as tyro does for `train ppo --help`
        main(["train", "--help"])
    assert exit_info.value.code == 0 and "train ppo" in capsys.readouterr().out


def test_tyro_errors_are_one_line_naming_the_subcommand_help(logdir, capsys):
    assert main(["train", "dqn", "--n-step", "three", "--logdir", logdir]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "Error parsing --n-step" in err
    assert err.rstrip().endswith("see `rlstore train dqn --help`")


def test_progress_counts_only_this_process_steps(monkeypatch, capsys):
    from rlstore import run

    clock = iter([100.0, 110.0])
    monkeypatch.setattr(run.time, "perf_counter", lambda: next(clock))
    progress = run.Progress(200_000, "ppo CartPole-v1", start_step=100_000)
    progress.update(150_000, 500.0, force=True)  # 50,000 steps in 10 s of this process
    assert " 5,000 steps/s" in capsys.readouterr().err


@pytest.mark.parametrize("env_id", ["HalfCheetah-v4", "Hopper-v5", "Walker2d-v4", "Ant-v5"])
def test_mujoco_ids_get_the_published_continuous_control_defaults(env_id):
    cfg, preset = config.resolve("ppo", env_id)
    assert preset == config.PRESET_DIR / "ppo" / "mujoco.toml"
    expected = dict(num_envs=1, num_steps=2048, learning_rate=3e-4, anneal_lr=True,
                    update_epochs=10, num_minibatches=32, gamma=0.99, gae_lambda=0.95,
                    clip_coef=0.2, clip_vloss=True, ent_coef=0.0, vf_coef=0.5,
                    max_grad_norm=0.5, norm_adv=True, norm_obs=True, norm_reward=True,
                    total_timesteps=1_000_000)  # fmt: skip
    assert {k: getattr(cfg, k) for k in expected} == expected
    cfg, preset = config.resolve("ppo", env_id, {"norm_reward": False})  # flags still win
    assert not cfg.norm_reward and cfg.norm_obs
    assert config.resolve("a2c", env_id)[1] is None  # the family preset is PPO's


def test_box2d_presets_name_their_source():
    for name in ("ppo/LunarLander-v3", "dqn/LunarLander-v3", "ppo/BipedalWalker-v3",
                 "ppo/Pendulum-v1"):  # fmt: skip
        text = (config.PRESET_DIR / f"{name}.toml").read_text()
        assert "RL Baselines3 Zoo" in text and "hyperparams/" in text
    # A2C's zoo values did not learn LunarLander-v3: the preset says so and whose it is
    text = (config.PRESET_DIR / "a2c/LunarLander-v3.toml").read_text()
    assert "RL Baselines3 Zoo" in text and "rlstore's own values" in text
    cfg, _ = config.resolve("dqn", "LunarLander-v3")
    assert cfg.q_hidden == (256, 256) and cfg.loss == "huber"


def test_budget_notes_say_only_what_the_user_asked_for(monkeypatch):
    from rlstore import run

    def notes(algo, env_id, **flags):
        cfg, preset = config.resolve(algo, env_id, flags)
        return run.budget_notes(algo, cfg, preset)

    assert notes("ppo", "CartPole-v1") == []  # 500,000 is not whole rollouts, but the default
    assert notes("ppo", "CartPole-v1", config="fast") == []  # nor the shipped fast preset
    [rounded] = notes("ppo", "CartPole-v1", total_timesteps=3000)
    assert rounded == (
        "--total-timesteps 3,000 is not a whole number of iterations of 512 env steps; "
        "the run takes 2,560"
    )
    [long] = notes("ppo", "HalfCheetah-v4")
    assert long.startswith("1,000,000 env steps, the published budget (mujoco.toml)")
    assert "--total-timesteps N" in long
    assert notes("ppo", "HalfCheetah-v4", total_timesteps=102_400) == []
    monkeypatch.setattr(run, "LONG_BUDGET", 100_000)
    assert "the published budget (the defaults)" in notes("ppo", "CartPole-v1")[0]


def test_progress_shows_the_time_left(monkeypatch, capsys):
    from rlstore import run

    assert [run.duration(s) for s in (4.4, 59.6, 725, 11_220)] == ["4s", "1m00s", "12m05s", "3h07m"]
    clock = iter([0.0, 10.0])
    monkeypatch.setattr(run.time, "perf_counter", lambda: next(clock))
    progress = run.Progress(10_000_000, "ppo ALE/Pong-v5")
    progress.update(10_000, None, force=True)  # 1,000 steps/s: 9,990,000 steps to go
    assert "eta 2h46m" in capsys.readouterr().err


def test_a_replay_buffer_that_does_not_fit_is_refused_before_anything_is_made(
    monkeypatch, logdir, capsys
):
    from rlstore import run

    monkeypatch.setattr(run, "available_memory", lambda device: 10 * 2**20)
    args = ["train", "dqn", "--buffer-size", "1000000", "--logdir", logdir]
    assert main(args) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "--buffer-size 1,000,000 (" in err
    assert "bytes per transition) needs 30.5 MiB of host memory, but only 10.0 MiB" in err
    assert not Path(logdir).exists()


def test_presets_lists_every_shipped_preset(capsys):
    assert main(["presets"]) == 0
    out = capsys.readouterr().out
    files = sorted(p for p in config.PRESET_DIR.glob("*/*.toml") if p.parent.name != "suites")
    for path in files:
        assert f": configs/{path.parent.name}/{path.name}\n" in out
    assert "ppo on every MuJoCo id (automatic)" in out
    assert "ppo on CartPole-v1, with --config fast (not automatic)" in out


def test_print_config_says_where_each_value_came_from(tmp_path, capsys):
    own = tmp_path / "mine.toml"
    own.write_text("gamma = 0.9\nnum_envs = 2\n")
    logdir = tmp_path / "runs"
    args = ["train", "a2c", "--env", "Acrobot-v1", "--config", str(own), "--num-envs", "3",
            "--no-anneal-lr", "--logdir", str(logdir), "--print-config"]  # fmt: skip
    with pytest.raises(SystemExit) as exit_:
        main(args)
    assert exit_.value.code == 0 and not logdir.exists()
    lines = {line.split()[0]: line for line in capsys.readouterr().out.splitlines()}
    preset = config.PRESET_DIR / "a2c" / "Acrobot-v1.toml"
    assert lines["num_envs"].split("#")[1].strip() == "flag"  # flag over file over preset
    assert "= 3 " in lines["num_envs"] and lines["anneal_lr"].endswith("# flag")
    assert lines["gamma"].endswith(f"# file {own}") and "= 0.9 " in lines["gamma"]
    assert lines["ent_coef"].endswith(f"# preset {preset}")
    assert lines["learning_rate"].endswith("# default") and "= 0.0007 " in lines["learning_rate"]
    assert lines["env_id"].endswith("# flag")


def test_train_help_shows_the_plain_defaults_and_names_the_presets(capsys):
    with pytest.raises(SystemExit):
        main(["train", "a2c", "--help"])
    out = re.sub(r"\s+", " ", re.sub(r"[│╭╮╰╯─]", " ", capsys.readouterr().out))
    assert "--num-envs INT Number of parallel environments. (default: 4)" in out
    assert "CartPole-v1 (automatic): num_envs, ent_coef" in out and "--print-config" in out


def test_auto_threads_one_for_mlps_the_cores_for_cnns_which_wait_passively(monkeypatch):
    import os

    from rlstore.run import auto_threads

    cores = len(os.sched_getaffinity(0))
    monkeypatch.delenv("RLSTORE_RUNS_AT_ONCE", raising=False)
    assert auto_threads(cnn=False) == 1
    assert auto_threads(cnn=True) == cores  # a run started by hand: every core
    monkeypatch.setenv("RLSTORE_RUNS_AT_ONCE", str(cores))  # an executor's worker
    assert auto_threads(cnn=True) == 1 and auto_threads(cnn=False) == 1
    env = {k: v for k, v in os.environ.items() if k != "OMP_WAIT_POLICY"}
    probe = "import os, rlstore, torch; print(os.environ['OMP_WAIT_POLICY'])"
    said = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, env=env)
    assert said.stdout.strip() == "PASSIVE"  # set before torch loads, unless the user chose
    said = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True,
                          env={**env, "OMP_WAIT_POLICY": "ACTIVE"})  # fmt: skip
    assert said.stdout.strip() == "ACTIVE"
