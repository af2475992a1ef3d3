"""Action heads for the action spaces beyond Discrete and 1-d Box: the distribution an
actor's outputs define, its samples, log-probs, entropies and mode.

    MultiDiscrete(nvec)   independent Categoricals, one per entry; log-probs and entropies
                          summed                                    MultiCategoricalHead
    MultiBinary(n)        independent Bernoullis                    BernoulliHead

Discrete (a Categorical) and Box (a Gaussian) keep their functions in rlstore/networks.py.
Actions are sampled and stored as int64 arrays of the space's shape, zero-based; `env_action`
shifts them by the space's start for the env.

Action masks (rlstore/masks.py) set the logits of masked actions to MASKED_LOGIT before
any of these: a probability of exactly 0 in float32, and entropy terms of 0 (no -inf * 0).
"""

from __future__ import annotations

from typing import Any

import numpy as np
import torch
from gymnasium import spaces
from torch.nn import functional as F

MASKED_LOGIT = -1e8  # (sb3-contrib's MaskablePPO uses the same)


def masked_logits(logits: torch.Tensor, mask: torch.Tensor | None) -> torch.Tensor:
    """`logits` with the masked-out actions' (mask False) set to MASKED_LOGIT."""
    return logits if mask is None else logits.masked_fill(~mask, MASKED_LOGIT)


def masked_q(q: torch.Tensor, allowed: torch.Tensor | None) -> torch.Tensor:
    """Q-values with the actions a mask does not allow at -inf, for an argmax or a max over
    the allowed ones (no mask: as they are)."""
    return q if allowed is None else q.masked_fill(~allowed, -torch.inf)


def inverse_cdf(log_probs: torch.Tensor, mask: torch.Tensor | None = None) -> torch.Tensor:
    """One sample per row of Categorical(log_probs), (B, 1): the first action whose
    cumulative probability exceeds a uniform draw. A draw above a total rounded below 1
    takes the last action, or with a mask the last allowed one (never a masked one)."""
    u = torch.rand(log_probs.shape[0], 1, device=log_probs.device)
    below = (log_probs.exp().cumsum(-1) < u).sum(-1, keepdim=True)
    if mask is None:
        return below.clamp_(max=log_probs.shape[-1] - 1)
    last_allowed = log_probs.shape[-1] - 1 - mask.flip(-1).long().argmax(-1, keepdim=True)
    return torch.minimum(below, last_allowed)


class MultiCategoricalHead:
    """Independent Categoricals over the entries of `nvec`, from concatenated logits."""

    kind = "multi_discrete"

    def __init__(
        self, nvec: list[int], start: list[int] | None = None, shape: list[int] | None = None
    ) -> None:
        self.nvec = [int(n) for n in nvec]
        self.start = [0] * len(self.nvec) if start is None else [int(s) for s in start]
        self.shape = [len(self.nvec)] if shape is None else [int(n) for n in shape]
        self.out_dim = sum(self.nvec)
        self.stored_shape = (len(self.nvec),)

    def _log_probs(self, logits: torch.Tensor) -> list[torch.Tensor]:
        return [part.log_softmax(-1) for part in logits.split(self.nvec, -1)]

    def sample(
        self, logits: torch.Tensor, mask: torch.Tensor | None = None
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """(actions (B, k), their summed log-prob), one inverse-CDF draw per entry; `mask`
        (B, sum(nvec)): the allowed values of each entry in turn."""
        actions, log_prob = [], torch.zeros(logits.shape[0], device=logits.device)
        masks = [None] * len(self.nvec) if mask is None else mask.split(self.nvec, -1)
        for log_probs, part_mask in zip(
            self._log_probs(masked_logits(logits, mask)), masks, strict=True
        ):
            action = inverse_cdf(log_probs, part_mask)
            actions.append(action.squeeze(-1))
            log_prob = log_prob + log_probs.gather(-1, action).squeeze(-1)
        return torch.stack(actions, -1), log_prob

    def log_prob_and_entropy(
        self, logits: torch.Tensor, action: torch.Tensor
    ) -> tuple[torch.Tensor, torch.Tensor]:
        log_prob = entropy = torch.zeros(logits.shape[0], device=logits.device)
        for i, log_probs in enumerate(self._log_probs(logits)):
            taken = action[:, i].long().unsqueeze(-1)
            log_prob = log_prob + log_probs.gather(-1, taken).squeeze(-1)
            entropy = entropy - (log_probs.exp() * log_probs).sum(-1)
        return log_prob, entropy

    def mode(self, logits: torch.Tensor, mask: torch.Tensor | None = None) -> torch.Tensor:
        parts = masked_logits(logits, mask).split(self.nvec, -1)
        return torch.stack([part.argmax(-1) for part in parts], -1)

    def env_action(self, action: np.ndarray) -> np.ndarray:
        """Stored actions (B, k) as the env takes them: shifted by start, in its shape."""
        return (action + np.asarray(self.start)).reshape(len(action), *self.shape)

    def env_action_tensor(self, action: torch.Tensor) -> torch.Tensor:
        """env_action in torch (an exported policy's last step, rlstore/export.py)."""
        start = torch.tensor(self.start, dtype=action.dtype, device=action.device)
        return (action + start).reshape(action.shape[0], *self.shape)

    def spec(self) -> dict[str, Any]:
        return {"kind": self.kind, "nvec": self.nvec, "start": self.start, "shape": self.shape}


class BernoulliHead:
    """Independent Bernoullis, one logit per bit (MultiBinary of any shape, flattened)."""

    kind = "multi_binary"

    def __init__(self, shape: list[int]) -> None:
        self.shape = [int(n) for n in shape]
        self.out_dim = int(np.prod(self.shape))
        self.stored_shape = (self.out_dim,)

    def sample(
        self, logits: torch.Tensor, mask: torch.Tensor | None = None
    ) -> tuple[torch.Tensor, torch.Tensor]:
        assert mask is None, "MultiBinary actions take no masks (rlstore/masks.py)"
        action = (torch.rand_like(logits) < torch.sigmoid(logits)).long()
        return action, self.log_prob_and_entropy(logits, action)[0]

    def log_prob_and_entropy(
        self, logits: torch.Tensor, action: torch.Tensor
    ) -> tuple[torch.Tensor, torch.Tensor]:
        bits = action.reshape(logits.shape).to(logits.dtype)
        log_one, log_zero = F.logsigmoid(logits), F.logsigmoid(-logits)
        log_prob = (bits * log_one + (1 - bits) * log_zero).sum(-1)
        p = torch.sigmoid(logits)
        return log_prob, -(p * log_one + (1 - p) * log_zero).sum(-1)

    def mode(self, logits: torch.Tensor, mask: torch.Tensor | None = None) -> torch.Tensor:
        return (logits > 0).long()

    def env_action(self, action: np.ndarray) -> np.ndarray:
        return action.reshape(len(action), *self.shape).astype(np.int8)

    def env_action_tensor(self, action: torch.Tensor) -> torch.Tensor:
        """env_action in torch (an exported policy's last step, rlstore/export.py)."""
        return action.reshape(action.shape[0], *self.shape).to(torch.int8)

    def spec(self) -> dict[str, Any]:
        return {"kind": self.kind, "shape": self.shape}


def head_for(action_space: spaces.Space) -> MultiCategoricalHead | BernoulliHead | None:
    """The head of a MultiDiscrete or MultiBinary action space (None: another space)."""
    if isinstance(action_space, spaces.MultiDiscrete):
        start = np.broadcast_to(action_space.start, action_space.nvec.shape)
        return MultiCategoricalHead(
            action_space.nvec.reshape(-1).tolist(),
            start.reshape(-1).tolist(),
            list(action_space.shape),
        )
    if isinstance(action_space, spaces.MultiBinary):
        return BernoulliHead(list(action_space.shape))
    return None


def head_from_spec(spec: dict[str, Any] | None) -> MultiCategoricalHead | BernoulliHead | None:
    """The head a model file's spec describes (None: a Discrete or Box action space)."""
    if not spec:
        return None
    if spec["kind"] == "multi_discrete":
        return MultiCategoricalHead(spec["nvec"], spec["start"], spec["shape"])
    return BernoulliHead(spec["shape"])
