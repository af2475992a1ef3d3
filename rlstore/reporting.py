"""What a run reports as it goes: the progress bar, what it says of its budget at its start,
and W&B tracking beside TensorBoard (--track)."""

from __future__ import annotations

import re
import sys
import time
from pathlib import Path
from typing import Any

from rlstore.config import CommonConfig
from rlstore.presets import shipped_budget

LONG_BUDGET = 1_000_000  # a run of the shipped budget this long says so at its start


def budget_notes(algo: str, cfg: CommonConfig, preset: Path | None) -> list[str]:
    """What a run says of its budget at its start: that a budget the user gave is rounded
    to whole iterations, or that a long one is the published budget and can be shortened."""
    shipped = shipped_budget(algo, cfg)
    if cfg.total_timesteps != shipped:  # the user's own
        if cfg.steps_run == cfg.total_timesteps:
            return []
        return [
            f"--total-timesteps {cfg.total_timesteps:,} is not a whole number of iterations "
            f"of {cfg.iteration_steps:,} env steps; the run takes {cfg.steps_run:,}"
        ]
    if shipped < LONG_BUDGET:
        return []
    source = preset.name if preset else "the defaults"
    return [
        f"{shipped:,} env steps, the published budget ({source}); for a shorter run give "
        "--total-timesteps N"
    ]


def start_tracking(cfg: CommonConfig, run_dir: Path, record: dict[str, Any]) -> Any:
    """--track: a Weights & Biases run, as CleanRL's: the config, and every TensorBoard
    scalar (TrackingWriter logs each as it is written). Its id is the run directory's
    name, so that a resumed run continues the same W&B run; its files go to run_dir/wandb.
    WANDB_MODE=offline keeps them there, for `wandb sync` later."""
    import wandb

    tracker = wandb.init(
        project=cfg.wandb_project,
        entity=cfg.wandb_entity,
        name=run_dir.name,
        id=re.sub(r"[^A-Za-z0-9_-]", "-", run_dir.name),
        resume="allow",
        config=record,
        dir=str(run_dir),
    )
    tracker.define_metric("global_step")
    tracker.define_metric("*", step_metric="global_step")  # W&B's x axis: the env step
    return tracker


class TrackingWriter:
    """A SummaryWriter that also sends each scalar to a W&B run, at its global step.
    (W&B's own TensorBoard sync tails the event files from a thread, and can miss the last
    steps of a run that ends.)"""

    def __init__(self, writer: Any, tracker: Any) -> None:
        self.writer, self.tracker = writer, tracker

    def add_scalar(self, tag: str, value: float, global_step: int) -> None:
        self.writer.add_scalar(tag, value, global_step)
        self.tracker.log({tag: value, "global_step": global_step})

    def __getattr__(self, name: str) -> Any:  # everything else is the SummaryWriter's
        return getattr(self.writer, name)


def duration(seconds: float) -> str:
    """'42s', '12m05s', '3h07m': a time left, as a progress bar shows it."""
    seconds = int(round(seconds))
    if seconds < 60:
        return f"{seconds}s"
    if seconds < 3600:
        return f"{seconds // 60}m{seconds % 60:02d}s"
    return f"{seconds // 3600}h{seconds % 3600 // 60:02d}m"


class Progress:
    """A one-line progress bar on stderr; on a non-terminal, a plain line every 10 seconds."""

    def __init__(self, total: int, label: str, enabled: bool = True, start_step: int = 0) -> None:
        self.total, self.label, self.enabled = total, label, enabled
        self.start_step = start_step  # steps done before this process (a resumed run)
        # (some stderr replacements, such as Ray's, have no isatty)
        self.tty = getattr(sys.stderr, "isatty", lambda: False)()
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
        sps = (step - self.start_step) / elapsed
        frac = min(step / self.total, 1.0)
        ret = "-" if recent_return is None else f"{recent_return:.1f}"
        eta = duration((self.total - step) / sps) if sps > 0 else "-"
        bar = "#" * int(frac * 20)
        line = (
            f"{self.label} [{bar:<20}] {step:,}/{self.total:,} {frac:4.0%} "
            f"{sps:,.0f} steps/s  return {ret}  eta {eta}"
        )
        if self.tty:
            sys.stderr.write("\r" + line + "\x1b[K")
        else:
            sys.stderr.write(line + "\n")
        sys.stderr.flush()

    def message(self, text: str) -> None:
        """A line of its own on stderr (on a terminal, over the bar, which redraws below)."""
        sys.stderr.write(("\r\x1b[K" if self.enabled and self.tty else "") + text + "\n")
        sys.stderr.flush()
        self.last_draw = 0.0

    def close(self) -> None:
        if self.enabled and self.tty:
            sys.stderr.write("\n")
            sys.stderr.flush()
