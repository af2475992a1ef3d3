"""Callbacks: hooks into a training run, for code that trains from Python
(docs/guides/training.md, "From Python")."""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from rlstore.run import Run


class Callback:
    """Hooks into a training run, for code that trains from Python: subclass it and override
    what you need (docs/guides/training.md, "From Python"). Each hook gets the Run:
    `run.global_step`, `run.episode_returns`, `run.recent_mean_return`, and `run.state`, the
    algorithm's TrainingState (its policy, and its other parts by name: optimizer, storage
    or buffer, target network). A hook that returns False stops the run after this
    iteration: `train` then finishes it there (final checkpoint, model.pt, summary), and
    `rlstore resume` can continue it later."""

    def on_iteration(self, run: Run) -> bool | None:
        """After each iteration of the training loop (a rollout and its update for PPO and
        A2C, a vector step for DQN)."""

    def on_log(self, run: Run, scalars: dict[str, float]) -> bool | None:
        """When an update's scalars are logged (at most every Run.LOG_EVERY_STEPS env steps,
        and at the end), with those scalars as floats."""

    def on_checkpoint(self, run: Run, path: Path) -> bool | None:
        """After each checkpoint is written, with its path."""

    def on_evaluation(self, run: Run, result: dict[str, Any]) -> bool | None:
        """After each evaluation (--eval-every), with its result: global_step, mean_return,
        std_return, mean_length, the returns and lengths, and `best` (True when it made a
        new best_model.pt)."""


class StopAtEvalReturn(Callback):
    """Stop training once an evaluation's mean return reaches `threshold` (SB3's
    StopTrainingOnRewardThreshold); needs --eval-every."""

    def __init__(self, threshold: float) -> None:
        self.threshold = threshold

    def on_evaluation(self, run: Run, result: dict[str, Any]) -> bool:
        return result["mean_return"] < self.threshold
