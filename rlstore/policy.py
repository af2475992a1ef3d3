"""A trained policy as a library call: `rlstore.load_policy(path)` gives a `Policy` that maps
observations (as the env gives them) to actions, and gives values or Q-values. `rlstore eval`
and evaluation during training (rlstore/evaluate.py) play it."""

from __future__ import annotations

import json
import warnings
from pathlib import Path
from typing import Any

import numpy as np
import torch

from rlstore import algos
from rlstore.action_heads import masked_q
from rlstore.checkpoint import read_policy
from rlstore.encoders import described_shape, description_of_spec
from rlstore.errors import UsageError
from rlstore.masks import MASK_SOURCES
from rlstore.normalize import ObsNormalizer
from rlstore.parts import as_tensors, first_part, is_shape, map_shapes, shape_leaves, take


class Policy:
    """A trained policy: maps observations (one, or a batch) to actions as numpy arrays.

    `value(obs)` gives the critic's V (actor-critics: PPO, A2C), `q_values(obs)` the
    Q-values of every action (Q-networks: DQN), and `q_values(obs, action)` the twin
    critics' Q1 and Q2 at an action (SAC, TD3; the policy's own action when none is given).
    Observations are given as the env returns them: a policy trained with normalized
    observations normalizes them with its saved statistics, which stay frozen here.

    Box actions come in the env's own shape (a Box of two or more dimensions, which the
    networks act in flat), in its dtype, clipped to its bounds.

    A policy trained under action masks (rlstore/masks.py) takes the env's mask of each
    observation as `action_mask` (one row per observation; `mask_source` says where the env
    gives it) and acts among the allowed actions only.

    A recurrent policy (ppo_lstm) is stateful: each call carries its LSTM state to the
    next, one row per observation of the batch; `reset()` starts new episodes (zero
    state), as does a call with another batch size; `reset(rows)` those of some rows.
    """

    def __init__(self, network: torch.nn.Module, info: dict[str, Any], record: dict[str, Any]):
        self.network = network.eval()
        self.device = next(network.parameters()).device  # a training run's may be a GPU
        self.info, self.algo, self.env_id = info, record["algo"], record["env_id"]
        self.config = record.get("config", {})
        self.global_step = record.get("global_step", 0)
        self.obs_shape = described_shape(description_of_spec(info))  # a tree for Dict, Tuple
        saved = record.get("obs_normalizer")
        self.obs_normalizer = ObsNormalizer.from_state_dict(saved) if saved else None
        self.state: torch.Tensor | None = None  # a recurrent policy's, per batch row
        self.mask_source: str | None = info.get("action_masks")  # "info", "method" or None
        self._said_unmasked = False  # (the warning of a masked policy called without masks)

    @property
    def recurrent(self) -> bool:
        return hasattr(self.network, "initial_state")

    def reset(self, rows: np.ndarray | None = None) -> None:
        """Forget the recurrent state: of every row (the next call starts episodes), or
        of the rows where `rows` is true (their next observations start episodes)."""
        if rows is None or self.state is None:
            self.state = None
            return
        keep = torch.as_tensor(~np.asarray(rows, dtype=bool), device=self.device)
        self.state = self.state * keep[:, None, None].to(self.state.dtype)

    def _recurrent_state(self, batch: int) -> torch.Tensor:
        if self.state is None or self.state.shape[0] != batch:
            self.state = self.network.initial_state(batch, self.device)
        return self.state

    @property
    def greedy(self) -> bool:
        """A Q-network (DQN's) acts greedily on its Q-values: there is no distribution to
        sample."""
        return hasattr(self.network, "greedy_action")

    @property
    def action_critic(self) -> bool:
        """Its critics value (observation, action) pairs in a continuous action space (SAC,
        TD3): Q-values, and no V."""
        return hasattr(self.network, "q_values") and not self.greedy

    def _batch(self, obs: Any) -> tuple[Any, bool]:
        if is_shape(self.obs_shape):
            obs = np.asarray(obs)
            single = obs.shape == self.obs_shape
        else:  # Dict, Tuple (read in the space's order): a batch when its parts have a batch axis
            obs = map_shapes(lambda _, part: np.asarray(part), self.obs_shape, obs)
            single = first_part(obs).shape == shape_leaves(self.obs_shape)[0]
        batch = take(obs, None) if single else obs
        if self.obs_normalizer is not None:
            batch = self.obs_normalizer(batch)  # frozen: update=False
        return as_tensors(batch, self.device), single

    @torch.inference_mode()
    def value(self, obs: np.ndarray) -> np.ndarray:
        """V(obs) of the actor-critic (PPO, A2C): a float, or one per row of a batch."""
        if self.greedy or self.action_critic:
            raise TypeError(f"a {self.algo} policy has Q-values, not a value: use q_values()")
        x, single = self._batch(obs)
        if self.recurrent:  # V at the current state, which it does not advance
            value = self.network.value(x, self._recurrent_state(len(first_part(x)))).cpu().numpy()
            return value[0] if single else value
        value = self.network.value(x).cpu().numpy()
        return value[0] if single else value

    @torch.inference_mode()
    def q_values(self, obs: np.ndarray, action: np.ndarray | None = None) -> np.ndarray:
        """DQN: Q(obs, a) for every action, shape (num_actions,), or (batch, num_actions).
        SAC, TD3: (Q1, Q2) at (obs, action), shape (2,), or (batch, 2); `action` defaults to
        the policy's deterministic action."""
        if not (self.greedy or self.action_critic):
            raise TypeError(f"a {self.algo} policy has a value, not Q-values: use value()")
        x, single = self._batch(obs)
        if self.greedy:
            q = self.network.q_values(x).cpu().numpy()
        else:
            if action is None:
                action = self.network.deterministic_action(x)
            action = torch.as_tensor(np.asarray(action, dtype=np.float32), device=self.device)
            q = self.network.q_values(x, action.reshape(len(first_part(x)), -1)).cpu().numpy()
        return q[0] if single else q

    @torch.inference_mode()
    def __call__(
        self, obs: Any, deterministic: bool = True, action_mask: np.ndarray | None = None
    ) -> np.ndarray:
        x, single = self._batch(obs)
        mask = () if action_mask is None else (self._mask(action_mask, single),)
        if action_mask is None and self.mask_source is not None and not self._said_unmasked:
            self._said_unmasked = True
            warnings.warn(
                f"this {self.algo} policy was trained under the env's action masks (from "
                f"{MASK_SOURCES[self.mask_source]}) and is called without action_mask=: it "
                "acts among all actions; pass the env's mask of each observation",
                UserWarning,
                stacklevel=2,
            )
        if self.greedy:
            action = masked_q(self.network.q_values(x), mask[0] if mask else None).argmax(-1)
        elif self.recurrent:
            state = self._recurrent_state(len(first_part(x)))
            if deterministic:
                action, self.state = self.network.deterministic_action(x, state, *mask)
            else:
                action, _, _, self.state = self.network.act(x, state, *mask)
        elif deterministic:
            action = self.network.deterministic_action(x, *mask)
        else:
            action = self.network.act(x, *mask)[0]
        action = action.cpu().numpy()
        if getattr(self.network, "head", None) is not None:  # MultiDiscrete, MultiBinary
            action = self.network.head.env_action(action)
        if "action_start" in self.info:  # Discrete(n, start=s): the env's own actions
            action = action + self.info["action_start"]
        if self.info.get("continuous"):  # in the action space's dtype (float32 mostly)
            dtype = np.dtype(self.info.get("action_dtype", "float32"))
            low, high = (np.asarray(self.info[k], dtype) for k in ("action_low", "action_high"))
            action = np.clip(action.astype(dtype, copy=False), low, high)
            shape = tuple(self.info.get("env_action_shape", action.shape[1:]))
            action = action.reshape(len(action), *shape)  # the env's own shape
        return action[0] if single else action

    def _mask(self, action_mask: np.ndarray, single: bool) -> torch.Tensor:
        mask = torch.as_tensor(np.asarray(action_mask, dtype=bool), device=self.device)
        return mask[None] if single else mask


def load_policy(path: str | Path, best: bool = False) -> Policy:
    """The policy in a model file, a run directory (its model.pt; with `best`, its
    best_model.pt from evaluation during training) or a checkpoint file."""
    path = Path(path)
    if path.is_dir():
        path = find_best_model(path) if best else path / "model.pt"
    if not path.is_file():
        raise UsageError(f"{path} does not exist")
    try:
        record = read_policy(path)
    except ValueError as e:
        raise UsageError(str(e)) from None
    try:
        network = algos.get(record["algo"]).build_policy(record["policy"])
    except ValueError as e:
        raise UsageError(f"{path}: {e}") from None
    network.load_state_dict(record["state_dict"])
    return Policy(network, record["policy"], record)


def find_best_model(run_dir: Path) -> Path:
    """The run's best_model.pt, or one clear UsageError saying why there is none."""
    source = run_dir / BEST_MODEL
    if source.is_file():
        return source
    config = json.loads((run_dir / "config.json").read_text())
    if not config.get("eval_every"):
        raise UsageError(
            f"{run_dir} has no {BEST_MODEL}: it was trained without evaluation; train with "
            "--eval-every STEPS to keep the best model"
        )
    raise UsageError(f"{run_dir} has no {BEST_MODEL} yet: its first evaluation has not run")


BEST_MODEL = "best_model.pt"
