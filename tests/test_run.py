"""A Run (rlstore/run.py): its first lines, config.json, threads, progress and ETA, budget
notes, and the denormals it flushes while it runs."""

import importlib.util
import json
import platform
import subprocess
import sys
from pathlib import Path

import gymnasium as gym
import numpy as np
import pytest
import torch
from tiny_runs import Watch, only_run_dir

from rlstore import presets
from rlstore.algos import dqn
from rlstore.algos.dqn import DQNConfig
from rlstore.cli import main, parse_train


def test_run_start_names_preset_config_run_dir_and_rounding(tmp_path, monkeypatch, capsys):
    """`--config fast` is the packaged preset from any directory; the first line names it
    and the run directory; a total that is not whole rollouts is said to be rounded;
    config.json records the preset and what the run ran on."""
    monkeypatch.chdir(tmp_path)  # not the repository: the name must resolve to the package
    logdir = str(tmp_path / "runs")
    args = ["train", "ppo", "--config", "fast", "--total-timesteps", "1000", "--logdir", logdir]
    assert main([*args, "--no-progress"]) == 0
    out = capsys.readouterr().out.splitlines()
    run_dir = only_run_dir(logdir)
    fast = presets.PRESET_DIR / "ppo" / "CartPole-v1.fast.toml"
    assert out[0] == (
        f"rlstore: ppo on CartPole-v1, preset: none, config file: {fast}; run directory {run_dir}"
    )
    record = json.loads((run_dir / "config.json").read_text())
    rollout = record["num_envs"] * record["num_steps"]
    assert out[1] == (
        f"rlstore: --total-timesteps 1,000 is not a whole number of iterations of {rollout:,} "
        f"env steps; the run takes {1000 - 1000 % rollout:,}"
    )
    assert record["config"] == str(fast)
    versions = record["resolved"].pop("versions")
    cpu = record["resolved"].pop("cpu")
    assert record["resolved"] == {"device": "cpu", "torch_threads": 1}
    # the CPU, as Linux names it
    cpuinfo = Path("/proc/cpuinfo")
    if cpuinfo.exists():
        assert f"model name\t: {cpu}\n" in cpuinfo.read_text()
    else:
        assert cpu
    # what the run ran on, as the packages themselves say
    assert versions["torch"] == torch.__version__ and versions["gymnasium"] == gym.__version__
    assert versions["numpy"] == np.__version__ and versions["python"] == platform.python_version()
    assert ("mujoco" in versions) == (importlib.util.find_spec("mujoco") is not None)


@pytest.mark.slow
def test_torch_threads_auto_is_one_and_a_number_is_used(logdir):
    from threadpoolctl import threadpool_info

    from rlstore.algos import dqn

    def blas_threads():
        return {pool["num_threads"] for pool in threadpool_info() if pool["user_api"] == "blas"}

    seen, seen_blas, before = [], [], blas_threads()
    for threads in ("auto", 2):
        torch.set_num_threads(3)
        cfg = dqn.DQNConfig(
            total_timesteps=200,
            learning_starts=100,
            torch_threads=threads,
            logdir=logdir,
            progress=False,
            track_tensorboard=False,
        )
        dqn.train(
            cfg,
            callbacks=[
                Watch(
                    lambda _: (
                        seen.append(torch.get_num_threads()),
                        seen_blas.append(blas_threads()),
                    )
                )
            ],
        )
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


def test_progress_counts_only_this_process_steps(monkeypatch, capsys):
    from rlstore import run

    clock = iter([100.0, 110.0])
    monkeypatch.setattr(run.time, "perf_counter", lambda: next(clock))
    progress = run.Progress(200_000, "ppo CartPole-v1", start_step=100_000)
    progress.update(150_000, 500.0, force=True)  # 50,000 steps in 10 s of this process
    assert " 5,000 steps/s" in capsys.readouterr().err


def test_budget_notes_say_only_what_the_user_asked_for(monkeypatch):
    from rlstore import reporting

    def notes(algo, env_id, **flags):
        cfg, preset = presets.resolve(algo, env_id, flags)
        return reporting.budget_notes(algo, cfg, preset)

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
    monkeypatch.setattr(reporting, "LONG_BUDGET", 100_000)
    assert "the published budget (the defaults)" in notes("ppo", "CartPole-v1")[0]


def test_progress_shows_the_time_left(monkeypatch, capsys):
    from rlstore import reporting

    assert [reporting.duration(s) for s in (4.4, 59.6, 725, 11_220)] == [
        "4s",
        "1m00s",
        "12m05s",
        "3h07m",
    ]
    clock = iter([0.0, 10.0])
    monkeypatch.setattr(reporting.time, "perf_counter", lambda: next(clock))
    progress = reporting.Progress(10_000_000, "ppo ALE/Pong-v5")
    progress.update(10_000, None, force=True)  # 1,000 steps/s: 9,990,000 steps to go
    assert "eta 2h46m" in capsys.readouterr().err


@pytest.mark.slow
def test_auto_threads_one_for_mlps_the_cores_for_cnns_which_wait_passively(monkeypatch):
    import os

    from rlstore.machine import WIDE_MATRIX, auto_threads

    cores = len(os.sched_getaffinity(0))
    monkeypatch.delenv("RLSTORE_RUNS_AT_ONCE", raising=False)
    assert auto_threads(cnn=False) == 1
    assert auto_threads(cnn=True) == cores  # a run started by hand: every core
    assert auto_threads(cnn=False, widest_matrix=WIDE_MATRIX) == cores  # CrossQ's critics
    assert auto_threads(cnn=False, widest_matrix=WIDE_MATRIX - 1) == 1
    monkeypatch.setenv("RLSTORE_RUNS_AT_ONCE", str(cores))  # an executor's worker
    assert auto_threads(cnn=True) == 1 and auto_threads(cnn=False) == 1
    assert auto_threads(cnn=False, widest_matrix=WIDE_MATRIX) == 1
    env = {k: v for k, v in os.environ.items() if k != "OMP_WAIT_POLICY"}
    probe = "import os, rlstore, torch; print(os.environ['OMP_WAIT_POLICY'])"
    said = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, env=env)
    assert said.stdout.strip() == "PASSIVE"  # set before torch loads, unless the user chose
    said = subprocess.run(
        [sys.executable, "-c", probe],
        capture_output=True,
        text=True,
        env={**env, "OMP_WAIT_POLICY": "ACTIVE"},
    )
    assert said.stdout.strip() == "ACTIVE"


@pytest.mark.parametrize("fast_paths", ["auto", "off"])
def test_training_flushes_denormals_and_stops_after(fast_paths, logdir):
    """Flushed during the run (speed: DQN's Adam moments decay into denormals; not in the
    reference mode), and the process gets IEEE behaviour back afterwards, also for numpy in
    the same thread."""
    seen = []
    cfg = DQNConfig(
        total_timesteps=300,
        learning_starts=100,
        logdir=logdir,
        progress=False,
        track_tensorboard=False,
        fast_paths=fast_paths,
    )
    assert not denormals_flushed()
    dqn.train(cfg, callbacks=[Watch(lambda _: seen.append(denormals_flushed()))])
    assert seen and all(flushed == (fast_paths == "auto") for flushed in seen)
    assert not denormals_flushed()
    assert np.float64(5e-324) > 0


def denormals_flushed() -> bool:
    return (torch.tensor([1e-30]) * 1e-10).item() == 0.0  # 1e-40 is a denormal float32


def test_callbacks_see_iterations_logs_and_checkpoints_and_can_stop_a_run(tmp_path, capsys):
    """A callback returning False stops the run after that iteration; the run is finished
    there (model.pt, summary, final checkpoint) and resumes to its total later."""
    import json

    from rlstore.algos import ppo
    from rlstore.callbacks import Callback
    from rlstore.presets import resolve

    class Seen(Callback):
        def __init__(self):
            self.steps, self.logged, self.checkpoints = [], [], []

        def on_iteration(self, run):
            self.steps.append(run.global_step)
            return run.global_step < 1536  # stop after the iteration that reaches 1536

        def on_log(self, run, scalars):
            self.logged.append((run.global_step, scalars["losses/value_loss"]))

        def on_checkpoint(self, run, path):
            self.checkpoints.append((run.global_step, path.is_file()))

    cfg, preset = resolve(
        "ppo",
        "CartPole-v1",
        dict(
            total_timesteps=4096,
            num_steps=128,
            checkpoint_every=1024,
            logdir=str(tmp_path),
            progress=False,
            track_tensorboard=False,
        ),
    )
    seen = Seen()
    result = ppo.train(cfg, preset, callbacks=[seen])
    assert seen.steps == [512, 1024, 1536] and result.global_step == 1536
    assert "rlstore: stopped by Seen at step 1,536" in capsys.readouterr().err
    assert seen.checkpoints == [(1024, True), (1536, True)]  # the due one, the final one
    assert seen.logged and all(isinstance(value, float) for _, value in seen.logged)
    assert json.loads((result.run_dir / "summary.json").read_text())["global_step"] == 1536
    assert (result.run_dir / "model.pt").is_file()
    assert main(["resume", str(result.run_dir), "--no-progress"]) == 0
    assert json.loads((result.run_dir / "summary.json").read_text())["global_step"] == 4096


def test_runs_started_in_the_same_second_get_their_own_directories(tmp_path, monkeypatch):
    """The directory is claimed by mkdir itself: another process that made the name a moment
    earlier (here: already there) moves this run on to the next free suffix."""
    from rlstore.run import new_run_dir

    monkeypatch.setattr("time.time", lambda: 1700000000.0)
    taken = [
        tmp_path / "CartPole-v1__ppo__1__1700000000",
        tmp_path / "CartPole-v1__ppo__1__1700000000_1",
    ]
    for path in taken:
        path.mkdir()
        (path / "config.json").write_text("{}")
    # as if each name were made by another process between a look and a mkdir
    monkeypatch.setattr("pathlib.Path.exists", lambda self: False)
    made = [new_run_dir(str(tmp_path), "CartPole-v1", "ppo", 1) for _ in range(2)]
    assert [p.name for p in made] == [
        "CartPole-v1__ppo__1__1700000000_2",
        "CartPole-v1__ppo__1__1700000000_3",
    ]
    assert all((p / "config.json").read_text() == "{}" for p in taken)  # untouched


@pytest.mark.parametrize("critic_width, wide", [(32, False), (1024, True)])
def test_auto_threads_count_the_widest_matrix_a_run_trains(
    critic_width, wide, tmp_path, monkeypatch
):
    """A run resolves --torch-threads auto again once its networks exist: CrossQ's default
    1024-1024 critics (in the critic optimizer, beside a 256-wide actor) take the cores of a
    run started by hand, narrow ones one thread; config.json records it."""
    import os

    from rlstore.algos import crossq

    monkeypatch.delenv("RLSTORE_RUNS_AT_ONCE", raising=False)
    cfg = crossq.CrossQConfig(
        env_id="Pendulum-v1",
        total_timesteps=40,
        learning_starts=30,
        batch_size=8,
        critic_hidden=(critic_width, critic_width),
        logdir=str(tmp_path),
    )
    before = torch.get_num_threads()
    try:
        result = crossq.train(cfg)
        config = json.loads((Path(result.run_dir) / "config.json").read_text())
    finally:
        torch.set_num_threads(before)
    cores = len(os.sched_getaffinity(0))
    assert config["resolved"]["torch_threads"] == (cores if wide else 1)
