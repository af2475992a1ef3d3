"""A training run: checks, device, seeding, run directory, TensorBoard, progress bar,
checkpoints, resume and signals. An algorithm builds its parts, hands them to the Run as a
TrainingState, and drives the loop:

    run = Run(cfg, "ppo", preset, resume_dir)    # checks the config, seeds; builds nothing
    ... build envs, networks, storage, optimizer on run.device ...
    with run.start(TrainingState(envs, policy, ...)):   # new run dir, or resumed state
        for iteration in run.iterations():       # checkpoints and stops on a signal
            ... act, envs.step, run.record_step(reward, terminated, truncated) ...
            ... update; if run.log_due(): run.log_scalars({...}) ...
        return run.finish()                       # final checkpoint, model.pt, summary
"""

from __future__ import annotations

import contextlib
import dataclasses
import importlib
import importlib.metadata
import importlib.util
import json
import math
import random
import signal
import sys
import threading
import time
from collections import deque
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path
from typing import Any

import gymnasium as gym
import numpy as np
import torch
from threadpoolctl import threadpool_limits

from rlstore import algos
from rlstore.atari import is_atari
from rlstore.callbacks import Callback
from rlstore.checkpoint import (
    checkpoint_files,
    checkpoint_path,
    read_newest_checkpoint,
    remove_stale_temporaries,
    rng_state,
    set_rng_state,
    write_checkpoint,
    write_policy,
    write_summary,
)
from rlstore.config import CommonConfig, check_writable_dir, run_dir_prefix, validate
from rlstore.custom_envs import PICKLED, save_pickled_env
from rlstore.env_checks import EnvContractError
from rlstore.env_snapshots import env_state, env_state_loads, load_env_state
from rlstore.envs import check_env_id
from rlstore.episode_stats import EpisodeStats
from rlstore.errors import DiskFull, Diverged, TrainingInterrupted, UsageError, is_disk_full
from rlstore.evaluate import Evaluator, check_video_support
from rlstore.goals import ended_successes
from rlstore.locks import DirectoryLock
from rlstore.machine import (
    auto_threads,
    cpu_model,
    flush_denormals,
    package_versions,
    resolve_device,
    skip_dynamo_import,
)
from rlstore.masks import MASK_SOURCES, masks_of
from rlstore.normalize import ObsNormalizer
from rlstore.parts import map_parts
from rlstore.reporting import Progress, TrackingWriter, budget_notes, start_tracking
from rlstore.storage.replay import ReplayBuffer
from rlstore.text import plural


def seed_everything(seed: int) -> None:
    random.seed(seed)
    np.random.seed(seed)
    torch.manual_seed(seed)


def new_run_dir(logdir: str, env_id: str, name: str, seed: int) -> Path:
    """runs/{env}__{name}__{seed}__{unix time}, never an existing directory: mkdir decides,
    so two runs started in the same second, even in two processes, get two directories."""
    base = Path(logdir) / f"{run_dir_prefix(env_id, name, seed)}{int(time.time())}"
    path, n = base, 1
    while True:
        try:
            path.mkdir(parents=True)
            return path
        except FileExistsError:
            path, n = Path(f"{base}_{n}"), n + 1


@dataclasses.dataclass
class TrainResult:
    run_dir: Path
    global_step: int
    seconds: float
    episode_returns: list[float]
    episode_lengths: list[int]
    episode_steps: list[int]  # global step at which each episode ended
    episode_times: list[float]  # unix time at which each episode ended (this process only)
    model: torch.nn.Module  # the policy network

    start_step: int = 0  # > 0 when the run was resumed

    @property
    def sps(self) -> float:
        return (self.global_step - self.start_step) / max(self.seconds, 1e-9)


class TrainingState:
    """An algorithm's whole state, as a Run checkpoints and restores it.

    envs: the vector env; policy: the network that model.pt keeps, described by
    policy_spec (rlstore.networks.policy_spec); obs: the host observation the next action
    is taken at, for loops that keep it here (DQN's; PPO and A2C keep theirs in the
    RolloutStorage, and `on_fresh_envs` starts it from freshly reset envs);
    obs_normalizer: the policy's observation statistics, if any (model.pt keeps them too);
    parts: everything else with state_dict() / load_state_dict() (optimizer, storage,
    target network, reward scaler), by name.
    """

    def __init__(
        self,
        envs: gym.vector.VectorEnv,
        policy: torch.nn.Module,
        policy_spec: dict[str, Any],
        obs: np.ndarray | None = None,
        on_fresh_envs: Callable[[np.ndarray], None] | None = None,
        obs_normalizer: ObsNormalizer | None = None,
        **parts: Any,
    ) -> None:
        self.envs, self.policy, self.policy_spec = envs, policy, policy_spec
        self.obs, self.on_fresh_envs, self.obs_normalizer = obs, on_fresh_envs, obs_normalizer
        self.parts = parts | ({"obs_normalizer": obs_normalizer} if obs_normalizer else {})

    def state_dict(self) -> dict[str, Any]:
        state = {"model": self.policy.state_dict(), "envs": env_state(self.envs)}
        if self.obs is not None:
            state["obs"] = map_parts(lambda part: torch.from_numpy(np.array(part)), self.obs)
        return state | {name: part.state_dict() for name, part in self.parts.items()}

    def widest_matrix(self) -> int:
        """The most weights in one weight matrix of the policy or of what the optimizers
        train (a separate critic's, say)."""
        params = list(self.policy.parameters())
        for part in self.parts.values():
            if isinstance(part, torch.optim.Optimizer):
                params += [p for group in part.param_groups for p in group["params"]]
        return max((p.numel() for p in params if p.dim() == 2), default=0)

    def load_state_dict(self, state: dict[str, Any], seed: int) -> bool:
        """Restore; False when the envs could not be saved and were reset instead."""
        self.policy.load_state_dict(state["model"])
        for name, part in self.parts.items():
            part.load_state_dict(state[name])
        name = self.envs.spec.id if self.envs.spec else "this env"
        if state["envs"] is not None and env_state_loads(state["envs"]):
            load_env_state(self.envs, state["envs"])
            if "obs" in state:
                self.obs = map_parts(torch.Tensor.numpy, state["obs"])
            return True
        why = "cannot be saved" if state["envs"] is None else "was saved by another MuJoCo version"
        print(f"rlstore: {name} {why}; resuming with freshly reset envs", file=sys.stderr)
        obs, _ = self.envs.reset(seed=seed)
        for part in self.parts.values():  # the episodes in the replay ended here
            if isinstance(part, ReplayBuffer):
                part.end_episodes()
        if self.obs is not None:
            self.obs = obs
        if self.on_fresh_envs is not None:
            self.on_fresh_envs(obs)
        return False


class Run:
    """Counters, logging, progress, checkpoints, resume and signals of one training run.

    The x axis of every scalar is `global_step`, the number of env steps taken so far.
    Episode returns are logged as episodes end; update scalars at most once per
    LOG_EVERY_STEPS env steps (A2C updates every 20 steps: logging each would cost more
    than the update).

    With `resume_dir`, `start` continues the run in that directory from its newest valid
    checkpoint: the TrainingState, the counters, the episodes and the RNGs come back, and
    TensorBoard events after the checkpoint's step are purged, so curves neither split nor
    repeat.
    """

    LOG_EVERY_STEPS = 1000

    def __init__(
        self,
        cfg: CommonConfig,
        algo: str,
        preset: Path | None = None,
        resume_dir: Path | None = None,
        callbacks: Sequence[Callback] = (),
    ) -> None:
        """Check everything that can be checked before anything is built, set torch's
        threads, seed the RNGs and pick the device (`self.device`). `callbacks` see the
        run as it goes (Callback; sweeps watch a run's episodes through one)."""
        validate(cfg)
        spec = check_env_id(cfg.env_id)
        if cfg.capture_video:
            check_video_support(cfg.env_id, "--capture-video")
        if cfg.track and importlib.util.find_spec("wandb") is None:
            raise UsageError(
                '--track needs wandb: pip install "rlstore[wandb]" (in a clone: '
                'pip install -e ".[wandb]")'
            )
        self.device = resolve_device(cfg.device)
        check_writable_dir(Path(cfg.logdir) if resume_dir is None else Path(resume_dir))
        if cfg.use_fast_paths:
            skip_dynamo_import()  # before any optimizer exists
        self._cnn = is_atari(spec)
        threads = auto_threads(self._cnn) if cfg.torch_threads == "auto" else cfg.torch_threads
        torch.set_num_threads(threads)
        # numpy's BLAS too (the numpy fast paths): its threads would spin on shared cores
        # just as torch's do; given back in close()
        self._blas_threads = threadpool_limits(threads, user_api="blas")
        seed_everything(cfg.seed)
        self.cfg, self.algo, self.preset, self.resume_dir = cfg, algo, preset, resume_dir
        self.callbacks = list(callbacks)
        self.stopped_by: Callback | None = None  # the callback that asked to stop
        self.global_step = 0
        self.seconds_before = 0.0  # wall time of the processes that ran before a resume
        self.last_log_step = 0
        self.episode_returns: list[float] = []
        self.episode_lengths: list[int] = []
        self.episode_steps: list[int] = []
        self.episode_times: list[float] = []
        self.recent_returns: deque[float] = deque(maxlen=20)
        self.stats = EpisodeStats(cfg.num_envs)
        self.state: TrainingState | None = None
        self.writer = None
        self.evaluator: Evaluator | None = None
        self.tracker: Any = None  # the W&B run, with --track
        self.stop_signal: int | None = None
        self._previous_handlers: dict[int, Any] = {}
        self._lock: DirectoryLock | None = None  # the run directory's, from start()

    # -- the start ----------------------------------------------------------------------------

    def start(self, state: TrainingState) -> Run:
        """Make the run directory, or restore `state` and the run from the newest checkpoint
        of the one being resumed; open TensorBoard, catch SIGINT/SIGTERM. Use as `with`.
        The directory is locked until close(): another process cannot resume it meanwhile."""
        if self.resume_dir is None:
            cfg = self.cfg
            self.dir = new_run_dir(cfg.logdir, cfg.env_id, cfg.exp_name or self.algo, cfg.seed)
        else:
            self.dir = Path(self.resume_dir)
        self._lock = DirectoryLock(self.dir)
        pid = self._lock.acquire()
        if pid is not None:
            raise UsageError(
                f"{self.dir} is being trained by another process now (pid {pid}); wait for "
                "it to end, or stop it (Ctrl-C checkpoints it), then resume"
            )
        try:
            return self._start(state)
        except BaseException:
            self._lock.release()
            raise

    def _start(self, state: TrainingState) -> Run:
        cfg, self.state = self.cfg, state
        if cfg.torch_threads == "auto":  # the networks are built now: how wide they are
            torch.set_num_threads(auto_threads(self._cnn, state.widest_matrix()))
        if cfg.eval_every:
            self.evaluator = Evaluator(self.algo, dataclasses.asdict(cfg), self.dir, None)
        if self.resume_dir is not None:
            self._resume()
        record = {"algo": self.algo, "preset": str(self.preset) if self.preset else None}
        record.update(dataclasses.asdict(cfg))
        # What "auto" became on this machine (read back by nobody: a resume resolves again),
        # and what the run ran on: a score depends on the env's physics, which its id does
        # not pin (Hopper-v4 steps otherwise from MuJoCo 3.5.0 on). A resume records its own.
        record["resolved"] = {
            "device": str(self.device),
            "torch_threads": torch.get_num_threads(),
            "cpu": cpu_model(),
            "versions": package_versions(),
        }
        (self.dir / "config.json").write_text(json.dumps(record, indent=2) + "\n")
        if cfg.env_id.startswith(PICKLED) and self.resume_dir is None:
            save_pickled_env(cfg.env_id, self.dir)  # (env.pkl: rlstore.train's pickle_env)
        if cfg.track:
            self.tracker = start_tracking(cfg, self.dir, record)
        if cfg.track_tensorboard:
            from torch.utils.tensorboard import SummaryWriter

            # Everything at the checkpoint's own step was logged before it was written.
            purge = self.global_step + 1 if self.resume_dir is not None else None
            self.writer = SummaryWriter(str(self.dir), purge_step=purge)
            if self.tracker is not None:
                self.writer = TrackingWriter(self.writer, self.tracker)
            if self.evaluator is not None:
                self.evaluator.writer = self.writer
            if self.resume_dir is None:
                rows = "\n".join(f"|{k}|{v}|" for k, v in record.items())
                self.writer.add_text("hyperparameters", f"|param|value|\n|-|-|\n{rows}")
        if self.resume_dir is None:
            source = algos.get(self.algo).defaults if self.preset is None else ""
            defaults = f" (defaults: {source})" if source else ""
            print(
                f"rlstore: {self.algo} on {cfg.env_id}, preset: {self.preset or 'none'}"
                f"{defaults}, config file: {cfg.config or 'none'}; run directory {self.dir}"
            )
            for note in budget_notes(self.algo, cfg, self.preset):
                print(f"rlstore: {note}")
            masks = masks_of(state.envs)
            if masks is not None:
                print(
                    f"rlstore: acting under the env's action masks, from "
                    f"{MASK_SOURCES[masks.source]} (--action-masks off ignores them)"
                )
        label = f"{self.algo} {cfg.env_id}"
        self.progress = Progress(cfg.steps_run, label, cfg.progress, self.global_step)
        self.start_time = time.perf_counter()
        self.start_step = self.global_step
        if threading.current_thread() is threading.main_thread():
            for signum in (signal.SIGINT, signal.SIGTERM):
                self._previous_handlers[signum] = signal.signal(signum, self._on_signal)
        flush_denormals(cfg.use_fast_paths)  # until close()
        return self

    def __enter__(self) -> Run:
        return self

    def __exit__(self, exc_type: type | None, exc: BaseException | None, tb: object) -> None:
        full = is_disk_full(exc)
        with contextlib.suppress(OSError) if full else contextlib.nullcontext():
            self.close()  # (on a full disk the event file's last flush fails too)
        if self.state is not None:
            self.state.envs.close()
        if isinstance(exc, (EnvContractError, Diverged)):  # the run stops here, in one line
            raise type(exc)(f"{exc}; {self._where_it_stopped()}") from None
        if full:
            kept = checkpoint_files(self.dir / "checkpoints")
            last = (
                f"its newest checkpoint, {kept[0].name}, is whole; free space, then continue "
                f"with: rlstore resume {self.dir}"
                if kept
                else "it has no checkpoint yet; free space, then train again"
            )
            raise DiskFull(f"the disk is full ({exc.filename or self.dir}); {last}") from exc

    def _where_it_stopped(self) -> str:
        kept = checkpoint_files(self.dir / "checkpoints")
        last = (
            f"its newest checkpoint, {kept[0].name}, is kept (rlstore resume {self.dir})"
            if kept
            else "it has no checkpoint"
        )
        return f"the run stopped at step {self.global_step:,}: {last}"

    def _resume(self) -> None:
        for directory in (self.dir, self.dir / "checkpoints"):  # a killed run's partial files
            remove_stale_temporaries(directory)
        found = read_newest_checkpoint(self.dir / "checkpoints")
        if found is None:
            raise UsageError(f"{self.dir} has no valid checkpoint to resume from")
        path, checkpoint = found
        if checkpoint["algo"] != self.algo or checkpoint["env_id"] != self.cfg.env_id:
            raise UsageError(
                f"{path} is a checkpoint of {checkpoint['algo']} on {checkpoint['env_id']}, "
                f"not of {self.algo} on {self.cfg.env_id}; resume it with its own run directory"
            )
        if checkpoint["global_step"] > self.cfg.total_timesteps:
            raise UsageError(
                f"--total-timesteps {self.cfg.total_timesteps} is smaller than the "
                f"{checkpoint['global_step']} steps already done; give a larger value"
            )
        self.global_step = checkpoint["global_step"]
        self.last_log_step = checkpoint["last_log_step"]
        self.seconds_before = checkpoint.get("wall_seconds", 0.0)
        episodes = checkpoint["episodes"]
        self.episode_returns = list(episodes["returns"])
        self.episode_lengths = list(episodes["lengths"])
        self.episode_steps = list(episodes["steps"])
        self.recent_returns.extend(self.episode_returns[-20:])
        print(f"rlstore: resuming from {path} at step {self.global_step:,}")
        if self.state.load_state_dict(checkpoint["algorithm"], self.cfg.seed):
            self.stats.load_state_dict(checkpoint["episode_stats"])
        if self.evaluator is not None and checkpoint.get("evaluation") is not None:
            self.evaluator.load_state_dict(checkpoint["evaluation"])
        # Last: building the parts drew random numbers of its own.
        set_rng_state(checkpoint["rng"])

    # -- the loop -----------------------------------------------------------------------------

    def iterations(self) -> Iterator[int]:
        """The loop's iterations (index = env steps done // steps per iteration), until the
        run's steps are done. After each: a checkpoint when one is due, and on a pending
        SIGINT/SIGTERM a checkpoint and TrainingInterrupted."""
        while self.global_step < self.cfg.steps_run:
            before = self.global_step
            yield self.global_step // self.cfg.iteration_steps
            if self.evaluator is not None and self.evaluator.due(before, self.global_step):
                self.evaluate()
            if self.callbacks:  # (DQN iterates once per env step: nothing to do without any)
                self._call("on_iteration")
            if self.stopped_by is not None:
                print(
                    f"rlstore: stopped by {type(self.stopped_by).__name__} at step "
                    f"{self.global_step:,}; continue with: rlstore resume {self.dir}",
                    file=sys.stderr,
                )
                return
            every = self.cfg.checkpoint_every
            if every > 0 and self.global_step // every > before // every:
                self.save_checkpoint()
            if self.stop_signal is not None:
                path = self.save_checkpoint()
                print(
                    f"rlstore: checkpoint {path}; continue with: rlstore resume {self.dir}",
                    file=sys.stderr,
                )
                raise TrainingInterrupted(self.stop_signal)

    def record_step(
        self,
        rewards: np.ndarray,
        terminated: np.ndarray,
        truncated: np.ndarray,
        info: dict[str, Any] | None = None,
    ) -> None:
        """Count one vector step of env steps; log the episodes that ended at it, and
        whether they succeeded where the step's `info` says (goal envs' is_success)."""
        self.count_steps(self.cfg.num_envs)
        returns, lengths = self.stats.update(rewards, terminated, truncated)
        if len(returns):
            self.record_episodes(returns.tolist(), lengths.tolist())
            if info and self.writer is not None:
                for success in ended_successes(info, terminated | truncated):
                    self.writer.add_scalar("charts/success_rate", success, self.global_step)

    def count_steps(self, env_steps: int) -> None:
        """Count env steps taken (record_step does, for loops that keep the episode
        statistics themselves and call record_episodes)."""
        self.global_step += env_steps

    def record_episodes(self, returns: list[float], lengths: list[int]) -> None:
        """Log episodes that ended at the current step (record_step calls this)."""
        now = time.time()
        for ret, length in zip(returns, lengths, strict=True):
            self.episode_returns.append(ret)
            self.episode_lengths.append(length)
            self.episode_steps.append(self.global_step)
            self.episode_times.append(now)
            self.recent_returns.append(ret)
            if self.writer is not None:
                self.writer.add_scalar("charts/episodic_return", ret, self.global_step)
                self.writer.add_scalar("charts/episodic_length", length, self.global_step)

    @property
    def recent_mean_return(self) -> float | None:
        return float(np.mean(self.recent_returns)) if self.recent_returns else None

    def log_due(self) -> bool:
        """Whether the update just done should log its scalars (always the last one)."""
        return (
            self.global_step - self.last_log_step >= self.LOG_EVERY_STEPS
            or self.global_step >= self.cfg.steps_run
        )

    def log_scalars(self, scalars: dict[str, Any]) -> None:
        """Log one update's scalars (tensors are read here, not in the collect loop). A loss
        (losses/*_loss) that is NaN or inf stops the run (Diverged), unless --check-finite
        off."""
        self.last_log_step = self.global_step
        if self.cfg.check_finite == "on":
            for name, value in scalars.items():
                if name.endswith("_loss") and not math.isfinite(float(value)):
                    raise Diverged(
                        f"{name} became {float(value)} by step {self.global_step:,}: the "
                        "update diverged (a learning rate too high, or NaN or inf in what "
                        "it learnt from); --check-finite off trains on anyway"
                    )
        elapsed = max(time.perf_counter() - self.start_time, 1e-9)
        sps = (self.global_step - self.start_step) / elapsed
        if self.writer is not None:
            for name, value in scalars.items():
                self.writer.add_scalar(name, float(value), self.global_step)
            self.writer.add_scalar("charts/SPS", sps, self.global_step)
        self.progress.update(self.global_step, self.recent_mean_return)
        self._call("on_log", {name: float(value) for name, value in scalars.items()})

    def evaluate(self) -> dict[str, Any]:
        """Evaluate the policy now (--eval-every; Evaluator), say so, call on_evaluation."""
        state = self.state
        result = self.evaluator.evaluate(
            state.policy, state.policy_spec, state.obs_normalizer, self.global_step
        )
        self.progress.message(
            f"rlstore: eval at step {self.global_step:,}: return {result['mean_return']:.1f} "
            f"+- {result['std_return']:.1f} over {plural(len(result['returns']), 'episode')}"
            + (f", success rate {result['success_rate']:.2f}" if "success_rate" in result else "")
            + (" (best so far: best_model.pt)" if result["best"] else "")
        )
        self._call("on_evaluation", result)
        return result

    # -- signals and checkpoints --------------------------------------------------------------

    def _on_signal(self, signum: int, frame: Any) -> None:
        """First signal: finish the current iteration, checkpoint, stop. A second: stop now."""
        if self.stop_signal is not None:
            raise KeyboardInterrupt
        self.stop_signal = signum
        print(f"\nrlstore: signal {signum}: writing a checkpoint, then stopping", file=sys.stderr)

    def save_checkpoint(self) -> Path:
        """Write the run's and the algorithm's state atomically; keep the newest K."""
        if self.cfg.check_finite == "on":  # never a checkpoint or model of NaN weights
            self._check_parameters()
        directory = self.dir / "checkpoints"
        directory.mkdir(exist_ok=True)
        remove_stale_temporaries(directory)  # a killed writer's (this run holds the lock)
        path = checkpoint_path(directory, self.global_step)
        write_checkpoint(
            path,
            algo=self.algo,
            env_id=self.cfg.env_id,
            global_step=self.global_step,
            last_log_step=self.last_log_step,
            episodes=self.finished_episodes(),
            episode_stats=self.stats.state_dict(),
            wall_seconds=self.wall_seconds(),
            rng=rng_state(),
            policy=self.state.policy_spec,
            algorithm=self.state.state_dict(),
            evaluation=self.evaluator.state_dict() if self.evaluator is not None else None,
        )
        for old in checkpoint_files(directory)[self.cfg.keep_checkpoints :]:
            old.unlink()
        self._call("on_checkpoint", path)
        return path

    def _check_parameters(self) -> None:
        for name, parameter in self.state.policy.named_parameters():
            if not torch.isfinite(parameter).all():
                raise Diverged(
                    f"the network's {name} holds NaN or inf at step {self.global_step:,}: "
                    "the update diverged (a learning rate too high, or NaN or inf in what it "
                    "learnt from); --check-finite off trains on anyway"
                )

    def _call(self, hook: str, *args: Any) -> None:
        """Call `hook` of every callback; the first that returns False stops the run."""
        for callback in self.callbacks:
            if getattr(callback, hook)(self, *args) is False and self.stopped_by is None:
                self.stopped_by = callback

    def finished_episodes(self) -> dict[str, list]:
        """Returns, lengths and global steps of every finished episode (checkpoints and
        summary.json hold them)."""
        return {
            "returns": self.episode_returns,
            "lengths": self.episode_lengths,
            "steps": self.episode_steps,
        }

    def wall_seconds(self) -> float:
        """Wall time of the whole run so far, the processes before a resume included."""
        return self.seconds_before + time.perf_counter() - self.start_time

    # -- the end ------------------------------------------------------------------------------

    def close(self) -> None:
        """Flush and close the event file, give the signals back, stop flushing denormals
        (back to the default); safe to call again."""
        flush_denormals(False)
        self._blas_threads.restore_original_limits()
        try:  # (writes that can fail, on a full disk: the signals and lock go back anyway)
            if self.evaluator is not None:
                self.evaluator.close()
            if self.writer is not None:
                writer, self.writer = self.writer, None
                writer.close()
            if self.tracker is not None:
                tracker, self.tracker = self.tracker, None
                tracker.finish()
        finally:
            for signum, handler in self._previous_handlers.items():
                signal.signal(signum, handler)
            self._previous_handlers = {}
            if self._lock is not None:
                self._lock.release()

    def finish(self) -> TrainResult:
        """Evaluate the final policy (with --eval-every, when the run is complete and its
        last step was not evaluated), write the final checkpoint and model file, close, and
        print the one-line summary."""
        evaluator = self.evaluator
        if (
            evaluator is not None
            and self.global_step >= self.cfg.steps_run
            and not (evaluator.history and evaluator.history[-1]["global_step"] == self.global_step)
        ):
            self.evaluate()
        self.save_checkpoint()
        normalizer = self.state.obs_normalizer
        write_policy(
            self.dir / "model.pt",
            algo=self.algo,
            env_id=self.cfg.env_id,
            global_step=self.global_step,
            config=dataclasses.asdict(self.cfg),
            state_dict=self.state.policy.state_dict(),
            policy=self.state.policy_spec,
            obs_normalizer=normalizer.state_dict() if normalizer else None,
        )
        seconds = time.perf_counter() - self.start_time
        write_summary(
            self.dir / "summary.json",
            algo=self.algo,
            env_id=self.cfg.env_id,
            seed=self.cfg.seed,
            global_step=self.global_step,
            wall_seconds=self.wall_seconds(),
            episodes=self.finished_episodes(),
            evaluations=evaluator.history if evaluator is not None else None,
        )
        self.close()
        self.progress.update(self.global_step, self.recent_mean_return, force=True)
        self.progress.close()
        mean = self.recent_mean_return
        steps = self.global_step - self.start_step
        done = (
            f"{steps:,} steps"
            if not self.start_step
            else (f"steps {self.start_step:,} -> {self.global_step:,} ({steps:,} steps)")
        )
        print(
            f"{self.algo} {self.cfg.env_id}: {done} in {seconds:.1f} s "
            f"({steps / max(seconds, 1e-9):,.0f} steps/s), "
            f"{plural(len(self.episode_returns), 'episode')} in all, "
            f"mean return of the last {len(self.recent_returns)}: "
            f"{'-' if mean is None else f'{mean:.1f}'}; run dir {self.dir}"
        )
        return TrainResult(
            self.dir,
            self.global_step,
            seconds,
            self.episode_returns,
            self.episode_lengths,
            self.episode_steps,
            self.episode_times,
            self.state.policy,
            self.start_step,
        )
