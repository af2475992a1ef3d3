"""The command line: smoke runs, TensorBoard scalars, presets and their precedence."""

import json
import re
import subprocess
import sys
from pathlib import Path

import pytest
from tensorboard.backend.event_processing.event_accumulator import EventAccumulator
from tiny_runs import only_run_dir

from rlstore import presets
from rlstore.cli import main, parse_train

TINY = ["--total-timesteps", "1024", "--no-progress"]


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


@pytest.mark.slow
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
    # one space for each run of spaces, line breaks and box lines: tyro wraps to the terminal
    text = " ".join(capsys.readouterr().out.replace("\u2502", " ").split())
    for flag, doc in [
        ("--env-id", "Gymnasium environment id"),
        ("--clip-coef", "clipping"),
        ("--target-kl", "approximate KL"),
        ("--device", "auto"),
    ]:
        assert flag in text and doc in text
    assert main(["--help"]) == 0


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


@pytest.mark.parametrize(
    "args, says",
    [
        (["train", "ppo", "--progress", "False"], "--progress is a switch and takes no value"),
        (["train", "ppo", "--progress=false"], "(got false): write --progress or --no-progress"),
        (["train", "dqn", "--double-dqn", "True"], "write --double-dqn or --no-double-dqn"),
        (["train", "ppo", "--no-norm-obs", "0"], "--norm-obs is a switch and takes no value"),
        (["eval", "runs/x", "--stochastic", "yes"], "write --stochastic or --no-stochastic"),
        (["resume", "runs/x", "--progress", "off"], "write --progress or --no-progress"),
    ],
)
def test_a_switch_given_a_value_names_both_forms(args, says, logdir, capsys):
    assert main([*args, "--logdir", logdir] if args[0] == "train" else args) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and says in err


def test_a_replay_buffer_that_does_not_fit_is_refused_before_anything_is_made(
    monkeypatch, logdir, capsys
):
    from rlstore import machine

    monkeypatch.setattr(machine, "available_memory", lambda device: 10 * 2**20)
    args = ["train", "dqn", "--buffer-size", "1000000", "--logdir", logdir]
    assert main(args) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "--buffer-size 1,000,000 (" in err
    assert "bytes per transition) needs 30.5 MiB of host memory, but only 10.0 MiB" in err
    assert not Path(logdir).exists()


def test_presets_lists_every_shipped_preset(capsys):
    assert main(["presets"]) == 0
    out = capsys.readouterr().out
    files = sorted(p for p in presets.PRESET_DIR.glob("*/*.toml") if p.parent.name != "suites")
    for path in files:
        assert f": configs/{path.parent.name}/{path.name}\n" in out
    assert "ppo on every MuJoCo id (automatic)" in out
    assert "ppo on CartPole-v1, with --config fast (not automatic)" in out

    assert main(["presets", "sac"]) == 0
    only = capsys.readouterr().out
    sac = sorted(p.name for p in (presets.PRESET_DIR / "sac").glob("*.toml"))
    assert sac and all(f": configs/sac/{name}\n" in only for name in sac)
    assert only.count("\n    sets ") == len(sac)
    assert main(["presets", "sca"]) == 2
    assert "unknown algorithm 'sca'; did you mean 'sac'?" in capsys.readouterr().err


def test_print_config_says_where_each_value_came_from(tmp_path, capsys):
    own = tmp_path / "mine.toml"
    own.write_text("gamma = 0.9\nnum_envs = 2\n")
    logdir = tmp_path / "runs"
    args = [
        "train",
        "a2c",
        "--env",
        "Acrobot-v1",
        "--config",
        str(own),
        "--num-envs",
        "3",
        "--no-anneal-lr",
        "--logdir",
        str(logdir),
        "--print-config",
    ]
    with pytest.raises(SystemExit) as exit_:
        main(args)
    assert exit_.value.code == 0 and not logdir.exists()
    lines = {line.split()[0]: line for line in capsys.readouterr().out.splitlines()}
    preset = presets.PRESET_DIR / "a2c" / "Acrobot-v1.toml"
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
