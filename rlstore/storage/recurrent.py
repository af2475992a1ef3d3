"""RecurrentRolloutStorage: a RolloutStorage that also keeps the state each step's action
was taken from, and hands out minibatches of whole sequences (time-major, with the state
at each sequence's start), so that a recurrent policy (ppo_lstm) replays its recurrence
exactly."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any, NamedTuple

import torch

from rlstore.parts import Tree, map_parts, take
from rlstore.storage.arrays import to_device
from rlstore.storage.rollout import RolloutStorage


class RecurrentBatch(NamedTuple):
    """A minibatch of sequences, time-major: (L, B, ...) for L steps of B sequences.

    `initial_state` (B, *state) is the state the first step of each sequence was taken
    from; before each later step t the state is zeroed where `episode_starts[t]`. `valid`
    marks real transitions (pseudo-steps are False): losses average over those only.
    `valid` and `episode_starts` are host tensors, as the storage keeps its flags: a policy
    on a GPU finds its cuts and indexes its valid steps without reading the device back."""

    obs: Tree
    actions: torch.Tensor
    log_probs: torch.Tensor
    values: torch.Tensor
    advantages: torch.Tensor
    returns: torch.Tensor
    valid: torch.Tensor
    episode_starts: torch.Tensor
    initial_state: torch.Tensor
    action_masks: torch.Tensor | None = None


class RecurrentRolloutStorage(RolloutStorage):
    """RolloutStorage whose `insert` takes the `recurrent_state` (of `recurrent_state_shape`)
    each action was taken from, and whose epochs are `sequences`."""

    def __init__(self, *args: Any, recurrent_state_shape: tuple[int, ...], **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.recurrent_state_shape = tuple(recurrent_state_shape)
        shape = (self.num_steps, self.num_envs, *self.recurrent_state_shape)
        self.recurrent_states = torch.zeros(shape, device=self.device)
        self._add_target("recurrent_states")

    def sequences(
        self,
        num_minibatches: int,
        sequence_length: int | None = None,
        generator: torch.Generator | None = None,
    ) -> Iterator[RecurrentBatch]:
        """One epoch of a recurrent policy's minibatches: each env's rollout cut into
        sequences of `sequence_length` steps (default: the whole rollout, CleanRL's way),
        every sequence exactly once, in a fresh random order, `num_minibatches` groups of
        them. Each sequence starts from the state stored at its first step. Pseudo-steps
        are in the sequences (the recurrence steps through them), marked not `valid`."""
        if not self._returns_ready:
            raise RuntimeError("call compute_returns() before sequences()")
        T, N = self.num_steps, self.num_envs
        L = T if sequence_length is None else sequence_length
        if L < 1 or T % L:
            raise ValueError(f"sequence_length must divide num_steps ({T}), got {L}")
        count = N * (T // L)  # sequences, numbered (chunk, env)
        if num_minibatches < 1 or num_minibatches > count:
            raise ValueError(f"num_minibatches must lie in [1, {count}], got {num_minibatches}")

        def chunked(x: torch.Tensor) -> torch.Tensor:  # (T, N, ...) -> (L, count, ...)
            return (
                x[:T]
                .reshape(T // L, L, N, *x.shape[2:])
                .transpose(0, 1)
                .reshape(L, count, *x.shape[2:])
            )

        obs = map_parts(chunked, self.obs)
        masks = None if self.action_masks is None else chunked(self.action_masks)
        fields = [
            chunked(x)
            for x in (self.actions, self.log_probs, self.values, self.advantages, self.returns)
        ]
        flags = [chunked(x) for x in (self.valid, self.episode_starts)]  # (host tensors)
        starts = self.recurrent_states[::L].reshape(count, *self.recurrent_state_shape)
        for host_index in torch.randperm(count, generator=generator).tensor_split(num_minibatches):
            index = to_device(host_index, self.device)
            yield RecurrentBatch(
                take(obs, (slice(None), index)),
                *(x[:, index] for x in fields),
                *(x[:, host_index] for x in flags),
                starts[index],
                None if masks is None else masks[:, index],
            )
