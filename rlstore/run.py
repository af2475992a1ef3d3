"""A training run's surroundings: device, seeding, run directory, TensorBoard, progress bar."""

from __future__ import annotations

import dataclasses
import json
import random
import sys
import time
from collections import deque
from pathlib import Path
from typing import Any

import numpy as np
import torch

from rlstore.config import CommonConfig, UsageError, validate
from rlstore.envs import check_env_id


def resolve_device(spec: str) -> torch.device:
    """'auto' -> CUDA when available, else CPU; 'cuda' without a GPU is a UsageError."""
    if spec == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    try:
        device = torch.device(spec)
    except RuntimeError:
        raise UsageError(f"unknown --device '{spec}'; use auto, cpu, cuda or cuda:N") from None
    if device.type not in ("cpu", "cuda"):
        raise UsageError(f"unknown --device '{spec}'; use auto, cpu, cuda or cuda:N")
    if device.type == "cuda":
        if not torch.cuda.is_available():
            raise UsageError(
                f"--device {spec} was asked for but no CUDA GPU is available; "
                "use --device cpu (or auto)"
            )
        if device.index is not None and device.index >= torch.cuda.device_count():
            raise UsageError(
                f"--device {spec}: only {torch.cuda.device_count()} CUDA device(s) present"
            )
    return device


def prepare(cfg: CommonConfig) -> torch.device:
    """Check everything that can be checked before building anything; seed; return the device."""
    validate(cfg)
    check_env_id(cfg.env_id)
    device = resolve_device(cfg.device)
    seed_everything(cfg.seed)
    return device


def seed_everything(seed: int) -> None:
    random.seed(seed)
    np.random.seed(seed)
    torch.manual_seed(seed)


def new_run_dir(logdir: str, env_id: str, name: str, seed: int) -> Path:
    """runs/{env}__{name}__{seed}__{unix time}, never an existing directory."""
    base = (
        Path(logdir)
        / f"{env_id.replace('/', '_').replace(':', '_')}__{name}__{seed}__{int(time.time())}"
    )
    path, n = base, 1
    while path.exists():
        path, n = Path(f"{base}_{n}"), n + 1
    path.mkdir(parents=True)
    return path


class Progress:
    """A one-line progress bar on stderr; on a non-terminal, a plain line every 10 seconds."""

    def __init__(self, total: int, label: str, enabled: bool = True) -> None:
        self.total, self.label, self.enabled = total, label, enabled
        self.tty = sys.stderr.isatty()
        self.start = time.perf_counter()
        self.last_draw = 0.0

    def update(self, step: int, recent_return: float | None, force: bool = False) -> None:
        if not self.enabled:
            return
        now = time.perf_counter()
        if not force and now - self.last_draw < (0.25 if self.tty else 10.0):
            return
        self.last_draw = now
        elapsed = max(now - self.start, 1e-9)
        sps = step / elapsed
        frac = min(step / self.total, 1.0)
        ret = "-" if recent_return is None else f"{recent_return:.1f}"
        eta = (self.total - step) / sps if sps > 0 else 0.0
        bar = "#" * int(frac * 20)
        line = (
            f"{self.label} [{bar:<20}] {step:,}/{self.total:,} {frac:4.0%} "
            f"{sps:,.0f} steps/s  return {ret}  eta {eta:.0f}s"
        )
        if self.tty:
            sys.stderr.write("\r" + line + "\x1b[K")
        else:
            sys.stderr.write(line + "\n")
        sys.stderr.flush()

    def close(self) -> None:
        if self.enabled and self.tty:
            sys.stderr.write("\n")
            sys.stderr.flush()


@dataclasses.dataclass
class TrainResult:
    run_dir: Path
    global_step: int
    seconds: float
    episode_returns: list[float]
    episode_lengths: list[int]
    episode_steps: list[int]  # global step at which each episode ended
    model: torch.nn.Module

    @property
    def sps(self) -> float:
        return self.global_step / max(self.seconds, 1e-9)


class Run:
    """Counters, logging and progress of one training run.

    The x axis of every scalar is `global_step`, the number of env steps taken so far.
    Episode returns are logged as episodes end; update scalars at most once per
    LOG_EVERY_STEPS env steps (A2C updates every 20 steps: logging each would cost more
    than the update).
    """

    LOG_EVERY_STEPS = 1000

    def __init__(
        self, cfg: CommonConfig, algo: str, device: torch.device, preset: Path | None = None
    ) -> None:
        self.cfg, self.algo, self.device = cfg, algo, device
        self.dir = new_run_dir(cfg.logdir, cfg.env_id, cfg.exp_name or algo, cfg.seed)
        record = {"algo": algo, "preset": str(preset) if preset else None}
        record.update(dataclasses.asdict(cfg))
        (self.dir / "config.json").write_text(json.dumps(record, indent=2) + "\n")
        self.writer = None
        if cfg.track_tensorboard:
            from torch.utils.tensorboard import SummaryWriter

            self.writer = SummaryWriter(str(self.dir))
            rows = "\n".join(f"|{k}|{v}|" for k, v in record.items())
            self.writer.add_text("hyperparameters", f"|param|value|\n|-|-|\n{rows}")
        self.global_step = 0
        self.last_log_step = 0
        self.episode_returns: list[float] = []
        self.episode_lengths: list[int] = []
        self.episode_steps: list[int] = []
        self.recent_returns: deque[float] = deque(maxlen=20)
        self.progress = Progress(cfg.total_timesteps, f"{algo} {cfg.env_id}", cfg.progress)
        self.start = time.perf_counter()

    def log_episodes(self, returns: np.ndarray, lengths: np.ndarray) -> None:
        for ret, length in zip(returns.tolist(), lengths.tolist(), strict=True):
            self.episode_returns.append(ret)
            self.episode_lengths.append(length)
            self.episode_steps.append(self.global_step)
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
            or self.global_step + self.cfg.num_envs * getattr(self.cfg, "num_steps", 1)
            > self.cfg.total_timesteps
        )

    def log_scalars(self, scalars: dict[str, Any]) -> None:
        """Log one update's scalars (tensors are read here, not in the collect loop)."""
        self.last_log_step = self.global_step
        sps = self.global_step / max(time.perf_counter() - self.start, 1e-9)
        if self.writer is not None:
            for name, value in scalars.items():
                self.writer.add_scalar(name, float(value), self.global_step)
            self.writer.add_scalar("charts/SPS", sps, self.global_step)
        self.progress.update(self.global_step, self.recent_mean_return)

    def close(self) -> None:
        """Flush and close the event file; safe to call more than once."""
        if self.writer is not None:
            self.writer.close()
            self.writer = None

    def finish(self, model: torch.nn.Module) -> TrainResult:
        """Close the run and print its one-line summary."""
        seconds = time.perf_counter() - self.start
        self.close()
        self.progress.update(self.global_step, self.recent_mean_return, force=True)
        self.progress.close()
        result = TrainResult(
            self.dir,
            self.global_step,
            seconds,
            self.episode_returns,
            self.episode_lengths,
            self.episode_steps,
            model,
        )
        mean = self.recent_mean_return
        print(
            f"{self.algo} {self.cfg.env_id}: {self.global_step:,} steps in {seconds:.1f} s "
            f"({result.sps:,.0f} steps/s), {len(self.episode_returns)} episodes, "
            f"mean return of the last {len(self.recent_returns)}: "
            f"{'-' if mean is None else f'{mean:.1f}'}; run dir {self.dir}"
        )
        return result
