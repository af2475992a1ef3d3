"""`rlstore sweep`: Ray Tune + Optuna on a local Ray and on a Ray head started here; the
best trial's config reproduces its runs exactly."""

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
from extras import needs

from rlstore.cli import main

SPEC = """
algo = "ppo"
env = "CartPole-v1"
steps = 4096
seeds = [1, 2]
trials = 3
reports = 2
[base]
num_steps = 64
[space]
learning_rate = { log_uniform = [1e-4, 1e-2] }
ent_coef = { uniform = [0.0, 0.02] }
update_epochs = { int = [2, 6] }
clip_vloss = { choice = [true, false] }
"""


def sweep(spec: Path, out: Path, *extra: str, env=None) -> subprocess.CompletedProcess:
    """A sweep in its own process, as users run it (Ray then stops with the process)."""
    return subprocess.run(
        [sys.executable, "-m", "rlstore", "sweep", str(spec), "--out", str(out), *extra],
        capture_output=True,
        text=True,
        env=env,
    )


def check_best_reproduces(out: Path, tmp_path: Path) -> None:
    """`rlstore train ppo --config best.toml --seed 1` is the best trial's seed-1 run."""
    trials = json.loads((out / "trials.json").read_text())
    best = max((t for t in trials if t["finished"]), key=lambda t: t["score"])
    text = (out / "best.toml").read_text()
    assert f"best trial {best['trial']}" in text
    logdir = tmp_path / f"again_{out.name}"
    assert (
        main(
            [
                "train",
                "ppo",
                "--config",
                str(out / "best.toml"),
                "--seed",
                "1",
                "--logdir",
                str(logdir),
                "--no-progress",
            ]
        )
        == 0
    )
    (again,) = logdir.glob("*/summary.json")
    (trial_run,) = (out / "trials" / best["trial"]).glob(f"*__{best['trial']}__1__*/summary.json")
    episodes = json.loads(trial_run.read_text())["episodes"]
    assert json.loads(again.read_text())["episodes"] == episodes


@pytest.mark.slow
@needs("sweep", "ray", "optuna")
def test_local_sweep_exports_a_best_config_that_reproduces_and_continues(tmp_path):
    spec = tmp_path / "spec.toml"
    spec.write_text(SPEC)
    out = tmp_path / "local"
    first = sweep(spec, out, "--workers", "2")
    assert first.returncode == 0, first.stdout[-2000:] + first.stderr[-2000:]
    trials = json.loads((out / "trials.json").read_text())
    assert len(trials) == 3
    for t in trials:  # every trial's runs are ordinary run directories
        runs = list((out / "trials" / t["trial"]).glob(f"CartPole-v1__{t['trial']}__*"))
        assert runs and all((r / "config.json").is_file() for r in runs)
        if t["finished"]:
            assert len(runs) == 2 and len(t["seed_scores"]) == 2
    check_best_reproduces(out, tmp_path)
    csv = str(tmp_path / "c.csv")
    assert main(["plot", str(out / "trials"), "--no-png", "--csv", csv]) == 0

    best = (out / "best.toml").read_text()
    again = sweep(spec, out, "--workers", "2")  # continues: the sweep is already complete
    assert again.returncode == 0 and "continuing the sweep" in again.stdout
    assert len(json.loads((out / "trials.json").read_text())) == 3
    assert (out / "best.toml").read_text() == best


@pytest.mark.slow
@needs("sweep", "ray", "optuna")
def test_an_interrupted_sweep_continues(tmp_path):
    """Ctrl-C once a trial has finished a run: exit 130, nothing exported; the same command
    then continues the search (the finished runs are read back, not run again)."""
    spec = tmp_path / "spec.toml"
    spec.write_text(
        SPEC.replace("steps = 4096", "steps = 16000").replace("trials = 3", "trials = 4")
    )
    out = tmp_path / "out"
    command = [sys.executable, "-m", "rlstore", "sweep", str(spec), "--out", str(out)]
    process = subprocess.Popen(
        command, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True
    )
    while not list(out.glob("trials/*/*/summary.json")):  # polls; no time limit
        assert process.poll() is None, "the sweep ended before a run finished"
        time.sleep(0.05)
    finished = {p: p.read_text() for p in out.glob("trials/*/*/summary.json")}
    process.send_signal(signal.SIGINT)
    assert process.wait() == 130 and "interrupted" in process.stdout.read()
    assert not (out / "best.toml").exists()

    again = sweep(spec, out)
    assert again.returncode == 0, again.stdout[-2000:] + again.stderr[-2000:]
    assert "continuing the sweep" in again.stdout
    assert len(json.loads((out / "trials.json").read_text())) == 4
    assert all(p.read_text() == text for p, text in finished.items())  # not run again
    check_best_reproduces(out, tmp_path)


@pytest.mark.slow
@needs("sweep", "ray", "optuna")
def test_sweep_and_benchmark_on_a_ray_head_started_here(tmp_path):
    """The documented commands as typed, against a head started the default way, in a home
    of its own: `ray start --head` turns on token authentication when the machine has a
    token (~/.ray/auth_token, which any local Ray >= 2.5x writes: here `ray get-auth-token
    --generate`). Without the token, one line that says what to do. A local sweep beside
    the head runs on its own."""
    ray_cli = [sys.executable, "-m", "ray.scripts.scripts"]  # `ray`, whatever is on PATH
    from test_benchmark import free_port

    port = free_port()
    (tmp_path / "home").mkdir()
    env = {k: v for k, v in os.environ.items() if not k.startswith("RAY_AUTH")}
    env["HOME"] = str(tmp_path / "home")
    subprocess.run([*ray_cli, "get-auth-token", "--generate"], capture_output=True, env=env)
    started = subprocess.run(
        [
            *ray_cli,
            "start",
            "--head",
            "--node-ip-address=127.0.0.1",
            f"--port={port}",
            "--num-cpus=2",
            "--include-dashboard=false",
            "--disable-usage-stats",
        ],
        capture_output=True,
        text=True,
        env=env,
    )
    try:
        assert started.returncode == 0, started.stderr[-2000:]
        assert "Token authentication is enabled" in started.stderr + started.stdout
        address = f"127.0.0.1:{port}"
        spec = tmp_path / "spec.toml"
        spec.write_text(SPEC.replace("trials = 3", "trials = 2"))
        out = tmp_path / "cluster"
        result = sweep(spec, out, "--address", address, env=env)
        assert result.returncode == 0, result.stdout[-2000:] + result.stderr[-2000:]
        assert "gcs_client" not in result.stdout + result.stderr  # no Ray log lines
        check_best_reproduces(out, tmp_path)

        suite = tmp_path / "s.toml"
        suite.write_text(
            'seeds = [1, 2]\n[[row]]\nalgo = "ppo"\nenv = "CartPole-v1"\nsteps = 2048\n'
            "overrides = { num_steps = 64 }\n"
        )
        command = [
            sys.executable,
            "-m",
            "rlstore",
            "benchmark",
            str(suite),
            "--out",
            str(tmp_path / "b"),
            "--address",
            address,
            "--no-plot",
        ]
        on_ray = subprocess.run(command, capture_output=True, text=True, env=env)
        assert on_ray.returncode == 0, on_ray.stdout[-2000:] + on_ray.stderr[-2000:]
        assert on_ray.stderr == ""
        assert main(["benchmark", str(suite), "--out", str(tmp_path / "l"), "--no-plot"]) == 0
        ray_rows = json.loads((tmp_path / "b" / "results.json").read_text())["rows"]
        local_rows = json.loads((tmp_path / "l" / "results.json").read_text())["rows"]
        assert [r["score"] for r in ray_rows[0]["runs"]] == [
            r["score"] for r in local_rows[0]["runs"]
        ]
        (tmp_path / "elsewhere").mkdir()  # a machine without the head's token
        refused = subprocess.run(
            command,
            capture_output=True,
            text=True,
            env={**env, "HOME": str(tmp_path / "elsewhere")},
        )
        assert refused.returncode == 2
        assert refused.stderr.count("\n") == 1, refused.stderr[-2000:]
        assert "asks for its authentication token and this machine has no token" in refused.stderr
        assert "~/.ray/auth_token" in refused.stderr
        # Without --address, a sweep beside the head runs on a Ray of its own: Ray's bare
        # init joins the head and refuses the sweep's CPU count (it crashed here once)
        beside = sweep(spec, tmp_path / "beside", env=env)
        assert beside.returncode == 0, beside.stdout[-2000:] + beside.stderr[-2000:]
        assert "joining the Ray cluster" not in beside.stdout
        check_best_reproduces(tmp_path / "beside", tmp_path)
    finally:
        subprocess.run([*ray_cli, "stop", "--force"], capture_output=True, env=env)


@pytest.mark.parametrize(
    "edit, message",
    [
        (lambda s: "budget = 3\n" + s, "unknown key 'budget'"),
        (lambda s: s.split("[space]")[0], "the search space is empty"),
        (
            lambda s: s.replace("[space]", "[space]\nlr = { uniform = [0.1, 0.2] }"),
            "unknown key 'lr'",
        ),
        (
            lambda s: s.replace("uniform = [0.0, 0.02]", "uniform = [0.02, 0.0]"),
            "takes [low, high] with low < high",
        ),
        (lambda s: s.replace("{ int = [2, 6] }", "{ normal = [2, 6] }"), "must be one of"),
        (lambda s: "early_stop = 1\n" + s, "early_stop must be true or false"),
        (
            lambda s: (
                s.replace('algo = "ppo"', 'algo = "dqn"')
                .replace("num_steps = 64", "")
                .replace("update_epochs = { int = [2, 6] }", "")
                .replace("clip_vloss", "double_dqn")
                .replace("ent_coef = { uniform = [0.0, 0.02] }", "")
                .replace("CartPole-v1", "Pendulum-v1")
                .replace("4096", "50000")
            ),
            "DQN needs a Discrete action space",
        ),
    ],
)
def test_bad_specs_are_one_line(tmp_path, capsys, edit, message):
    spec = tmp_path / "spec.toml"
    spec.write_text(edit(SPEC))
    out = tmp_path / "out"
    assert main(["sweep", str(spec), "--out", str(out)]) == 2
    err = capsys.readouterr().err
    assert message in err and len(err.strip().splitlines()) == 1
    assert not out.exists()


def test_a_spec_path_that_is_no_file_is_one_line(tmp_path, capsys):
    for path, problem in [(tmp_path / "none.toml", "does not exist"), (tmp_path, "is a directory")]:
        assert main(["sweep", str(path)]) == 2
        err = capsys.readouterr().err
        assert f"sweep spec '{path}' {problem}; give the path of a TOML file" in err


@needs("sweep", "ray")
def test_address_with_no_ray_cluster_is_one_line(tmp_path, capsys):
    from test_benchmark import free_port

    spec = tmp_path / "spec.toml"
    spec.write_text(SPEC)
    assert main(["sweep", str(spec), "--address", f"127.0.0.1:{free_port()}"]) == 2
    err = capsys.readouterr().err
    assert "no Ray cluster answers" in err and len(err.strip().splitlines()) == 1


def test_missing_ray_names_the_extra(tmp_path, capsys, monkeypatch):
    monkeypatch.setitem(sys.modules, "ray", None)
    spec = tmp_path / "spec.toml"
    spec.write_text(SPEC)
    assert main(["sweep", str(spec), "--out", str(tmp_path / "o")]) == 2
    assert 'pip install "rlstore[sweep]"' in capsys.readouterr().err
    assert not (tmp_path / "o").exists()
