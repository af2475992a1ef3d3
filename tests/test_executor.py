"""The executors (rlstore/executor.py): what a run's child process is told, and which run
directory is the same run."""


def test_executor_children_know_how_many_runs_share_the_machine(monkeypatch, tmp_path):
    """A suite's runs divide the cores among them (--torch-threads auto, for CNNs)."""
    import rlstore.executor as executor

    seen = []

    class Finished:
        returncode = 0

        def __init__(self, command, env, **kwargs):
            seen.append(env["RLSTORE_RUNS_AT_ONCE"])

        def poll(self):
            return 0

    monkeypatch.setattr(executor.subprocess, "Popen", Finished)
    spec = executor.RunSpec("ppo", "CartPole-v1", 1, "ppo", str(tmp_path))
    executor.LocalExecutor(workers=3).run([spec], lambda spec, status: None)
    assert seen == ["3"]


def test_a_record_older_than_a_field_is_the_same_run_at_its_default(tmp_path):
    """A run directory whose config.json predates a field (fast_paths) is the run asked for
    when the field is at its default, and another run when it is not."""
    import dataclasses
    import json

    import pytest

    from rlstore.errors import UsageError
    from rlstore.executor import RunSpec, check_same_config

    spec = RunSpec("ppo", "CartPole-v1", 1, "ppo", str(tmp_path))
    cfg, _ = spec.config()
    record = {"algo": "ppo", **dataclasses.asdict(cfg)}
    del record["fast_paths"]
    (tmp_path / "config.json").write_text(json.dumps(record))
    check_same_config(tmp_path, "ppo", cfg)
    with pytest.raises(UsageError, match="other settings \\(fast_paths\\)"):
        check_same_config(tmp_path, "ppo", dataclasses.replace(cfg, fast_paths="off"))


def test_checkpoint_cadence_is_not_part_of_a_runs_identity(tmp_path):
    """A run checkpointed every 100k steps and resumed with checkpoints every 25k (a suite
    made finer) is the same run; a changed learning setting is not."""
    import dataclasses
    import json

    import pytest

    from rlstore.errors import UsageError
    from rlstore.executor import RunSpec, check_same_config

    spec = RunSpec("sac", "Pendulum-v1", 1, "sac", str(tmp_path))
    cfg, _ = spec.config()
    record = {"algo": "sac", **dataclasses.asdict(cfg), "checkpoint_every": 100_000}
    (tmp_path / "config.json").write_text(json.dumps(record))
    check_same_config(
        tmp_path, "sac", dataclasses.replace(cfg, checkpoint_every=25_000, keep_checkpoints=5)
    )
    with pytest.raises(UsageError, match="other settings \\(tau\\)"):
        check_same_config(tmp_path, "sac", dataclasses.replace(cfg, tau=0.01))


def test_a_signal_with_runs_still_waiting_stops_the_executor(monkeypatch, tmp_path):
    """SIGINT while some runs wait for a worker: the running ones get it, the waiting ones
    never start, and run() returns the signal (it once waited for them forever)."""
    import signal

    import rlstore.executor as executor

    started, signalled = [], []

    class Running:
        returncode = None

        def __init__(self, command, env, **kwargs):
            started.append(command)

        def send_signal(self, signum):
            signalled.append(signum)
            self.returncode = 130  # it checkpoints and stops

        def poll(self):
            if not signalled:  # Ctrl-C arrives while the first run runs
                signal.raise_signal(signal.SIGINT)
            return self.returncode

    def waiting(*args):  # the executor loops over sleeps: fail instead of hanging
        polls.append(1)
        if len(polls) > 100:
            raise RuntimeError("the executor kept waiting after the signal")

    polls = []
    monkeypatch.setattr(executor.time, "sleep", waiting)

    monkeypatch.setattr(executor.subprocess, "Popen", Running)
    specs = [executor.RunSpec("ppo", "CartPole-v1", seed, "ppo", str(tmp_path)) for seed in (1, 2)]
    done = []
    stopped = executor.LocalExecutor(workers=1).run(specs, lambda s, status: done.append(status))
    assert stopped == signal.SIGINT
    assert len(started) == 1 and signalled == [signal.SIGINT] and done == [130]


def test_a_child_stopped_before_its_run_began_exits_as_interrupted(monkeypatch, tmp_path):
    """A Ctrl-C that reaches a run's child while it still imports (before the run's own
    handler) is an interruption, exit 130, not a failure with a traceback."""
    import dataclasses
    import json

    import rlstore.executor as executor

    def still_importing(self):
        raise KeyboardInterrupt

    monkeypatch.setattr(executor.RunSpec, "complete", still_importing)
    spec = executor.RunSpec("ppo", "CartPole-v1", 1, "ppo", str(tmp_path))
    assert executor.main([json.dumps(dataclasses.asdict(spec))]) == 130
