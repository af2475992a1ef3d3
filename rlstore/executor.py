"""Many runs: one run as a spec that finishes itself, and the executors that run many.

A `RunSpec` names a run by what makes it (algorithm, env, seed, config overrides) and where
it lives (logdir, name). `complete()` finishes it whatever state it is in: a finished run
is read back, an interrupted one resumes from its newest checkpoint, and one that never
reached a checkpoint starts again. So a suite or a sweep that is stopped and started again
continues where it was, and its runs stay ordinary run directories.

Executors run specs as child processes, `python -m rlstore.executor SPEC_JSON`, each with
one torch thread (rlstore's default): `LocalExecutor` on this machine with a bounded number
of workers, needing no server; `RayExecutor` as Ray tasks on a cluster (`connect_ray`,
which sweeps share). SIGINT or SIGTERM to the executor reaches every running child, which
checkpoints and stops; the next start resumes them.
"""

from __future__ import annotations

import contextlib
import dataclasses
import json
import logging
import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Iterable, Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from rlstore import algos
from rlstore.config import CommonConfig, run_dir_prefix
from rlstore.errors import DiskFull, TrainingInterrupted, UsageError, quiet_disk_full_in_threads
from rlstore.locks import holder
from rlstore.machine import RUNS_AT_ONCE, available_cores
from rlstore.presets import resolve

if TYPE_CHECKING:
    from rlstore.callbacks import Callback

# Fields a run directory may differ in and still be the same run: where it runs, how it
# reports, how often it checkpoints (saving touches neither the RNG nor the learning: the
# resume tests) and its length (a shorter run is extended by resuming it).
NOT_IDENTITY = (
    "logdir",
    "progress",
    "config",
    "device",
    "torch_threads",
    "total_timesteps",
    "checkpoint_every",
    "keep_checkpoints",
)


def check_workers(workers: int | None) -> None:
    if workers is not None and workers < 1:
        raise UsageError(f"--workers must be at least 1 (got {workers})")


@dataclass
class RunSpec:
    """One run: `rlstore train {algo} --env {env_id} --seed {seed}` with `overrides` (config
    fields), in `logdir` under the name `name` (the run directory's middle part)."""

    algo: str
    env_id: str
    seed: int
    name: str
    logdir: str
    overrides: dict[str, Any] = field(default_factory=dict)
    log_file: str | None = None  # where the child process writes its output

    @property
    def label(self) -> str:
        return f"{self.name} {self.env_id} seed {self.seed}"

    def config(self) -> tuple[CommonConfig, Path | None]:
        """The run's config (preset < overrides) and the preset it used."""
        fixed = dict(seed=self.seed, logdir=self.logdir, exp_name=self.name, progress=False)
        return resolve(self.algo, self.env_id, {**self.overrides, **fixed})

    def directories(self) -> list[Path]:
        """Run directories of this run under logdir, newest first (normally one)."""
        stem = run_dir_prefix(self.env_id, self.name, self.seed)
        found = [p for p in Path(self.logdir).glob(stem + "*") if (p / "config.json").is_file()]
        return sorted(found, key=lambda p: p.stat().st_mtime, reverse=True)

    def state(self) -> tuple[str, Path | None]:
        """("done", dir), ("interrupted", dir), ("extend", dir) (finished with fewer steps
        than asked now: resuming continues it) or ("new", None). A directory with neither
        summary nor checkpoint (killed before its first checkpoint) is removed; one that
        finished short and kept no checkpoint is a UsageError, and is kept. A directory
        whose config differs from this spec's is a UsageError: the suite or sweep changed."""
        cfg, _ = self.config()
        for path in self.directories():
            check_same_config(path, self.algo, cfg)
            pid = holder(path)
            if pid is not None:  # resumed or removed, it would be damaged
                raise UsageError(
                    f"{path} is being trained by another process now (pid {pid}); wait for it "
                    "or stop it first"
                )
            done = finished_steps(path)
            if done is not None and done >= cfg.steps_run:
                return "done", path
            if any((path / "checkpoints").glob("step_*.pt")):
                return ("interrupted" if done is None else "extend"), path
            if done is not None:
                raise UsageError(
                    f"{path} finished at {done:,} steps and has no checkpoint left to continue "
                    f"it to {cfg.steps_run:,}; move it away to train this run anew"
                )
            shutil.rmtree(path)
        return "new", None

    def progress(self) -> tuple[str, dict | None, Path | None]:
        """Where the run stands, read as state() reads it but changing nothing (the run may
        be going on), and its directory: ("done", its summary, dir), ("begun", its newest
        checkpoint's numbers in a summary's keys, dir), ("started", None, dir) (no
        checkpoint yet: running, or killed before its first) or ("new", None, None)."""
        from rlstore.checkpoint import read_newest_checkpoint  # (torch: not at `--help`)

        cfg, _ = self.config()
        started = None
        for path in self.directories():
            check_same_config(path, self.algo, cfg)
            done = finished_steps(path)
            if done is not None and done >= cfg.steps_run:
                return "done", read_summary(path), path
            found = read_newest_checkpoint(path / "checkpoints")
            if found is not None:
                checkpoint = found[1]
                history = (checkpoint.get("evaluation") or {}).get("history")
                return (
                    "begun",
                    {
                        "seed": self.seed,
                        "run_dir": str(path),
                        "global_step": checkpoint["global_step"],
                        "wall_seconds": checkpoint.get("wall_seconds", 0.0),
                        "episodes": checkpoint["episodes"],
                        "evaluations": history,
                    },
                    path,
                )
            started = started or path
        return ("started" if started else "new"), None, started

    def complete(self, callbacks: Sequence[Callback] = ()) -> dict:
        """Finish the run in this process (start, resume or read it back); its summary."""
        status, path = self.state()
        if status != "done":
            cfg, preset = self.config()
            train = algos.get(self.algo).train
            path = train(cfg, preset, resume=path, callbacks=callbacks).run_dir
        return read_summary(path)


def check_same_config(path: Path, algo: str, cfg: CommonConfig) -> None:
    """The run in `path` was made by `algo` with `cfg` (up to NOT_IDENTITY), or a UsageError."""
    record = json.loads((path / "config.json").read_text())
    wanted = {"algo": algo, **dataclasses.asdict(cfg)}
    # A field newer than the record had, when the run was made, the default's behaviour.
    older = dataclasses.asdict(type(cfg)())
    differ = sorted(
        k
        for k, v in wanted.items()
        if k not in NOT_IDENTITY and _plain(record.get(k, older.get(k))) != _plain(v)
    )
    if record["total_timesteps"] > cfg.total_timesteps:
        raise UsageError(
            f"{path} was run to {record['total_timesteps']:,} steps, more than the "
            f"{cfg.total_timesteps:,} asked for now; move it away or use another output directory"
        )
    if differ:
        raise UsageError(
            f"{path} was made with other settings ({', '.join(differ[:4])}) than the run "
            "asked for now; move it away or use another output directory"
        )


def _plain(value: Any) -> Any:
    return list(value) if isinstance(value, tuple) else value


def finished_steps(run_dir: Path) -> int | None:
    """The env steps of a run that finished (its summary.json); None when it never finished,
    or when its final checkpoint was removed and earlier ones kept (a resume then continues
    from one of those). A finished run whose checkpoints were all removed (to save room: an
    off-policy run's hold its replay buffer) stays finished."""
    summary = Path(run_dir) / "summary.json"
    if not summary.is_file():
        return None
    steps = json.loads(summary.read_text())["global_step"]
    from rlstore.checkpoint import checkpoint_files, checkpoint_path  # (torch: not at --help)

    checkpoints = Path(run_dir) / "checkpoints"
    kept = checkpoint_files(checkpoints)
    return steps if not kept or checkpoint_path(checkpoints, steps).is_file() else None


def read_summary(run_dir: Path) -> dict:
    """summary.json of a finished run, plus its directory."""
    return json.loads((Path(run_dir) / "summary.json").read_text()) | {"run_dir": str(run_dir)}


def child_command(spec: RunSpec) -> list[str]:
    """The command line that completes `spec` in a child process."""
    return [sys.executable, "-m", "rlstore.executor", json.dumps(dataclasses.asdict(spec))]


# -- executors ----------------------------------------------------------------------------------

Done = Callable[[RunSpec, int], None]  # called with each spec and its child's exit status


class LocalExecutor:
    """Runs specs as child processes on this machine, at most `workers` at a time."""

    def __init__(self, workers: int | None = None) -> None:
        self.workers = workers or available_cores()

    def run(self, specs: Iterable[RunSpec], on_done: Done) -> int | None:
        """Run every spec; the signal that stopped it early, or None."""
        pending, running = list(specs), {}
        stopped: list[int] = []

        def forward(signum: int, frame: Any) -> None:
            stopped.append(signum)
            for child in running:  # each checkpoints and stops
                child.send_signal(signum)

        previous = {s: signal.signal(s, forward) for s in (signal.SIGINT, signal.SIGTERM)}
        try:
            while running or (pending and not stopped):  # (stopped: the rest never start)
                while pending and not stopped and len(running) < self.workers:
                    spec = pending.pop(0)
                    running[_start_child(spec, self.workers)] = spec
                for child in [c for c in running if c.poll() is not None]:
                    on_done(running.pop(child), child.returncode)
                time.sleep(0.05)
        finally:
            for signum, handler in previous.items():
                signal.signal(signum, handler)
        return stopped[0] if stopped else None


def _start_child(spec: RunSpec, runs_at_once: int) -> subprocess.Popen:
    """Start the child that completes `spec`, told how many runs share its machine (its
    `--torch-threads auto` divides the cores among them)."""
    env = {**os.environ, RUNS_AT_ONCE: str(runs_at_once)}
    # its own session: a Ctrl-C reaches it once, through the executor
    log = open(spec.log_file, "a") if spec.log_file else subprocess.DEVNULL  # noqa: SIM115
    try:
        return subprocess.Popen(
            child_command(spec),
            stdout=log,
            stderr=subprocess.STDOUT,
            start_new_session=True,
            env=env,
        )
    finally:
        if spec.log_file:
            log.close()


RAY_TOKEN_FILE = Path.home() / ".ray" / "auth_token"  # where `ray start --head` writes it


def connect_ray(address: str | None, num_cpus: int | None = None) -> Any:
    """Start Ray in this process (no address) or join the cluster at HOST:PORT; the ray module.
    A missing Ray or a cluster that does not answer is one clear UsageError. Without an
    address, a cluster that `ray start` left on this machine is not joined (Ray's bare
    init would, and then refuse num_cpus).

    A head started the default way (`ray start --head`, Ray 2.5x and later) asks its clients
    for the token it wrote to ~/.ray/auth_token; Ray's own client sends it only when told
    (RAY_AUTH_MODE=token), so rlstore tells it whenever this machine has a token. Ray's log
    lines while joining are kept out of rlstore's output, and say why a join failed."""
    host, _, port = (address or "").rpartition(":")
    if address is not None and (not host or not port.isdigit()):
        raise UsageError(f"--address '{address}' is not HOST:PORT (such as 127.0.0.1:6379)")
    if address is not None and "RAY_AUTH_MODE" not in os.environ and _ray_token_here():
        os.environ["RAY_AUTH_MODE"] = "token"  # before Ray reads its config, at import
    try:
        import ray
    except ImportError:
        raise UsageError(
            'this needs Ray, which is not installed: pip install "rlstore[sweep]" '
            '(in a clone: pip install -e ".[sweep]")'
        ) from None
    if ray.is_initialized():
        return ray
    if address is None:
        try:
            ray.init(num_cpus=num_cpus, include_dashboard=False, log_to_driver=False)
        except ValueError as e:  # ray.init() joined a cluster that `ray start` left running
            if "existing cluster" not in str(e):
                raise
            # Start a Ray of its own beside it: a local run asks for its own CPU count
            ray.init("local", num_cpus=num_cpus, include_dashboard=False, log_to_driver=False)
        return ray
    try:  # ray.init itself would retry for a minute or more
        socket.create_connection((host, int(port)), timeout=5).close()
    except OSError as e:
        raise UsageError(
            f"no Ray cluster answers at {address} ({e.strerror or e}); start one with "
            "`ray start --head` or leave out --address to run on this machine"
        ) from None
    print(f"rlstore: joining the Ray cluster at {address}", flush=True)
    with tempfile.TemporaryFile("w+") as ray_log:
        try:
            with _stderr_to(ray_log):
                ray.init(address=address, log_to_driver=False, logging_level=logging.WARNING)
        except Exception as e:  # a cluster that refuses us: authentication, versions
            ray_log.seek(0)
            raise UsageError(_join_failure(address, e, ray_log.read())) from None
    return ray


def _ray_token_here() -> bool:
    """Whether this machine has a Ray authentication token, where Ray looks for one."""
    return bool(os.environ.get("RAY_AUTH_TOKEN") or os.environ.get("RAY_AUTH_TOKEN_PATH")) or (
        RAY_TOKEN_FILE.is_file()
    )


def _join_failure(address: str, error: Exception, ray_log: str) -> str:
    """The one line that says why joining a Ray cluster failed, and what to do."""
    if "InvalidAuthToken" in ray_log or "Unauthenticated" in ray_log:
        have = "has another token" if _ray_token_here() else "has no token"
        return (
            f"could not join the Ray cluster at {address}: it asks for its authentication "
            f"token and this machine {have}; copy the head's ~/.ray/auth_token to "
            f"{RAY_TOKEN_FILE} (or set RAY_AUTH_TOKEN to its contents) and run the command again"
        )
    reason = str(error).strip().splitlines()[0] if str(error).strip() else type(error).__name__
    return (
        f"could not join the Ray cluster at {address}: {reason}; check that "
        f"`ray status --address {address}` works here (the same Ray and Python versions as the "
        "head)"
    )


@contextlib.contextmanager
def _stderr_to(file: Any) -> Iterator[None]:
    """Send this process's stderr (file descriptor 2: Python's and Ray's C++ logs) to file."""
    sys.stderr.flush()
    saved = os.dup(2)
    os.dup2(file.fileno(), 2)
    try:
        yield
    finally:
        sys.stderr.flush()
        os.dup2(saved, 2)
        os.close(saved)


def check_gpu_share(share: float) -> None:
    if not (share == 0 or 0 < share <= 1 or float(share).is_integer()):
        raise UsageError(
            f"a GPU share must be 0, a fraction in (0, 1] or a whole number (got {share})"
        )


class RayExecutor:
    """Runs specs as Ray tasks (one CPU each) on the cluster at `address`, or on a Ray
    started in this process. Run directories are written where each task runs: on a
    cluster of several machines, give a logdir on storage every node shares."""

    def __init__(
        self, address: str | None, workers: int | None = None, gpus_per_run: float = 0.0
    ) -> None:
        check_gpu_share(gpus_per_run)
        self.ray = connect_ray(address, workers)
        self.gpus_per_run = gpus_per_run

    def run(self, specs: Iterable[RunSpec], on_done: Done) -> int | None:
        ray = self.ray
        task = ray.remote(num_cpus=1, num_gpus=self.gpus_per_run, max_retries=0)(_complete_in_child)
        refs = {task.remote(spec): spec for spec in specs}
        stopped: list[int] = []

        def cancel(signum: int, frame: Any) -> None:
            stopped.append(signum)
            for ref in refs:  # KeyboardInterrupt in each task: its child checkpoints
                ray.cancel(ref)

        previous = {s: signal.signal(s, cancel) for s in (signal.SIGINT, signal.SIGTERM)}
        try:
            while refs:
                ready, _ = ray.wait(list(refs), num_returns=1, timeout=0.5)
                for ref in ready:
                    spec = refs.pop(ref)
                    try:
                        status = ray.get(ref)
                    except (ray.exceptions.TaskCancelledError, ray.exceptions.RayTaskError):
                        status = 128 + stopped[0] if stopped else 1  # cancelled, or failed
                    on_done(spec, status)
        finally:
            for signum, handler in previous.items():
                signal.signal(signum, handler)
        return stopped[0] if stopped else None


def _complete_in_child(spec: RunSpec) -> int:
    """A Ray task: complete `spec` in a child process; its exit status."""
    Path(spec.logdir).mkdir(parents=True, exist_ok=True)
    if spec.log_file:
        Path(spec.log_file).parent.mkdir(parents=True, exist_ok=True)
    child = _start_child(spec, available_cores())  # a task of one CPU: one thread
    try:
        return child.wait()
    except KeyboardInterrupt:  # ray.cancel: let the run checkpoint, then stop
        child.send_signal(signal.SIGINT)
        return child.wait()


def main(argv: list[str]) -> int:
    """The child process: complete the spec given as JSON; exit 0, 1 (a full disk), 2 (usage),
    130 or 143."""
    spec = RunSpec(**json.loads(argv[0]))
    quiet_disk_full_in_threads()
    try:
        spec.complete()
    except UsageError as e:
        print(f"rlstore: error: {e}", file=sys.stderr)
        return 2
    except DiskFull as e:
        print(f"rlstore: error: {e}", file=sys.stderr)
        return 1
    except TrainingInterrupted as e:
        return e.exit_code
    except KeyboardInterrupt:  # a Ctrl-C before the run's own handler: it was stopped
        return 130
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
