"""The registry of algorithms: an algorithm defined in one file outside rlstore trains,
evaluates, resumes and benchmarks through the command line, and nothing in rlstore outside
rlstore/algos names an algorithm."""

import json
import os
import re
import sys
from pathlib import Path

import pytest
import torch

from rlstore import algos
from rlstore.cli import main

ROOT = Path(__file__).resolve().parent.parent
TESTS = Path(__file__).resolve().parent


@pytest.fixture
def plugin(monkeypatch):
    """RLSTORE_ALGORITHMS names tests/reinforce_plugin.py, for this process and its children;
    the registry is as it was after the test."""
    monkeypatch.setattr(algos, "_registered", dict(algos._registered))
    monkeypatch.delitem(sys.modules, "reinforce_plugin", raising=False)  # imported afresh
    monkeypatch.setenv(algos.PLUGINS, "reinforce_plugin")
    path = os.pathsep.join(filter(None, [str(TESTS), os.environ.get("PYTHONPATH")]))
    monkeypatch.setenv("PYTHONPATH", path)
    monkeypatch.syspath_prepend(str(TESTS))


def run_dir(logdir: Path) -> Path:
    (found,) = [p for p in logdir.iterdir() if (p / "config.json").is_file()]
    return found


def final_params(run: Path) -> list[torch.Tensor]:
    return list(torch.load(run / "model.pt", weights_only=False)["state_dict"].values())


@pytest.mark.slow
def test_an_algorithm_from_outside_trains_evaluates_resumes_and_benchmarks(plugin, tmp_path):
    flags = ["--env", "CartPole-v1", "--no-progress", "--checkpoint-every", "512"]
    assert (
        main(
            [
                "train",
                "reinforce",
                *flags,
                "--total-timesteps",
                "2048",
                "--logdir",
                str(tmp_path / "whole"),
            ]
        )
        == 0
    )
    whole = run_dir(tmp_path / "whole")
    assert json.loads((whole / "config.json").read_text())["algo"] == "reinforce"

    # half the steps, then resumed to the whole: the same run, bit for bit
    assert (
        main(
            [
                "train",
                "reinforce",
                *flags,
                "--total-timesteps",
                "1024",
                "--logdir",
                str(tmp_path / "halves"),
            ]
        )
        == 0
    )
    halves = run_dir(tmp_path / "halves")
    assert main(["resume", str(halves), "--total-timesteps", "2048", "--no-progress"]) == 0
    for a, b in zip(final_params(whole), final_params(halves), strict=True):
        assert torch.equal(a, b)

    assert main(["eval", str(whole), "--episodes", "2"]) == 0
    (entry,) = json.loads((whole / "eval.json").read_text())["evaluations"]
    assert entry["episodes"] == 2 and entry["mode"] == "deterministic"

    suite = tmp_path / "suite.toml"
    suite.write_text(
        'name = "plugin"\nseeds = [1]\n[[row]]\nalgo = "reinforce"\nenv = "CartPole-v1"\n'
        'steps = 1024\nband = [0, 500]\nsource = "a test"\n'
    )
    out = tmp_path / "bench"
    assert main(["benchmark", str(suite), "--out", str(out), "--workers", "1", "--no-plot"]) == 0
    (row,) = json.loads((out / "results.json").read_text())["rows"]
    assert row["algo"] == "reinforce" and len(row["seeds"]) == 1


def test_train_help_lists_a_registered_algorithm(plugin, capsys):
    with pytest.raises(SystemExit):
        main(["train", "--help"])
    assert "train reinforce" in capsys.readouterr().out
    assert algos.get("reinforce").config().learning_rate == 1e-2


def test_an_unknown_algorithm_offers_the_close_name(capsys):
    assert main(["train", "pp0"]) == 2
    assert "unknown algorithm 'pp0'; did you mean 'ppo'?" in capsys.readouterr().err


def test_an_unknown_algorithm_without_a_close_name_points_to_the_plugin_variable(capsys):
    assert main(["train", "reinforce"]) == 2
    err = capsys.readouterr().err
    assert "unknown algorithm 'reinforce'; choose one of a2c, c51, crossq, ddpg, dqn, ppo" in err
    assert "name its module in RLSTORE_ALGORITHMS" in err


def test_a_plugin_module_that_does_not_import_is_one_line(monkeypatch, capsys):
    monkeypatch.setenv(algos.PLUGINS, "no_such_module_here")
    assert main(["train", "nope"]) == 2
    err = capsys.readouterr().err
    assert "RLSTORE_ALGORITHMS names module 'no_such_module_here'" in err
    assert err.count("\n") == 1


def test_nothing_outside_algos_names_an_algorithm():
    """No `algo == "ppo"` branch and no table keyed by algorithm names in rlstore/ outside
    rlstore/algos/: everything reads the registry."""
    names = "|".join(algos.builtin_names())
    branch = re.compile(rf"""==\s*["']({names})["']|["']({names})["']\s*:|\bin\s*\(["']({names})""")
    config_class = re.compile(r"\b(PPO|A2C|DQN)Config\b")
    offenders = []
    for path in (ROOT / "rlstore").rglob("*.py"):
        if "algos" in path.relative_to(ROOT / "rlstore").parts or path.name == "__init__.py":
            continue
        for number, line in enumerate(path.read_text().splitlines(), 1):
            if branch.search(line) or config_class.search(line):
                offenders.append(f"{path.relative_to(ROOT)}:{number}: {line.strip()}")
    assert not offenders, "\n".join(offenders)


def test_each_builtin_declares_itself_under_its_file_name():
    for name in algos.builtin_names():
        algorithm = algos.get(name)
        assert algorithm.name == name
        assert algorithm.config.__module__ == f"rlstore.algos.{name}"
        assert callable(algorithm.train) and algorithm.networks and algorithm.action_spaces
