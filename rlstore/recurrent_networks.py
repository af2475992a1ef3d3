"""The LSTM actor-critics of recurrent PPO (ppo_lstm): on an observation encoder, or on the
Nature CNN for frame stacks; each keeps its state between calls as the caller passes it.
Same spec protocol as rlstore/networks.py's networks."""

from __future__ import annotations

from typing import Any

import torch
from torch import nn

from rlstore.action_heads import head_for, head_from_spec
from rlstore.encoders import (
    DEFAULT_IMAGES,
    FlatEncoder,
    ImageOptions,
    description_of_spec,
    encoder_for,
    encoder_from_description,
    layer_init,
    nature_cnn,
)
from rlstore.networks import action_log_prob_and_entropy, action_mode, mlp, sample_action
from rlstore.parts import Tree, first_part, map_parts, take
from rlstore.storage.arrays import to_device


class RecurrentActorCriticBase(nn.Module):
    """What the recurrent actor-critics share: acting one step from a state, and replaying
    sequences. A subclass gives `state_shape`, `encode` (observations (L, B, ...) to the
    cores' inputs) and `_cores` (inputs and a state to actor features, critic features and
    the next state), the heads `actor` and `critic`, and `continuous`.

    The recurrent state of a batch of envs is one tensor (batch, *state_shape). The caller
    zeroes it where an episode starts (RolloutStorage.current_episode_starts);
    `evaluate_sequences` does so inside a sequence, running the cores over the spans
    between episode starts in one call each (several times faster than a step at a time,
    and equal to it up to float rounding)."""

    act_on_host = None  # no numpy twin: acting runs in torch
    state_shape: tuple[int, int]

    def initial_state(self, batch: int, device: torch.device | str = "cpu") -> torch.Tensor:
        return torch.zeros((batch, *self.state_shape), device=device)

    def _step(self, obs: torch.Tensor, state: torch.Tensor) -> tuple[torch.Tensor, ...]:
        """One step of the cores: (actor features, critic features, next state)."""
        actor_out, critic_out, state = self._cores(self.encode(take(obs, None)), state)
        return actor_out[0], critic_out[0], state

    head: Any = None  # MultiDiscrete and MultiBinary actions: their head

    @property
    def _log_std(self) -> torch.Tensor | None:
        return self.actor_logstd if self.continuous else None

    def act(
        self, obs: torch.Tensor, state: torch.Tensor, action_mask: torch.Tensor | None = None
    ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
        """Sample actions from `state` (zeroed at episode starts by the caller); returns
        (action, log_prob, value, next state)."""
        actor_features, critic_features, state = self._step(obs, state)
        out = self.actor(actor_features)
        action, log_prob = sample_action(out, self.head, self._log_std, action_mask)
        return action, log_prob, self.critic(critic_features).squeeze(-1), state

    def value(self, obs: torch.Tensor, state: torch.Tensor) -> torch.Tensor:
        """V(obs) from `state`, shape (batch,)."""
        return self.critic(self._step(obs, state)[1]).squeeze(-1)

    def deterministic_action(
        self, obs: torch.Tensor, state: torch.Tensor, action_mask: torch.Tensor | None = None
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """The policy's mode (argmax logits, or the Gaussian mean), and the next state."""
        actor_features, _, state = self._step(obs, state)
        out = self.actor(actor_features)
        return action_mode(out, self.head, self.continuous, action_mask), state

    def evaluate_sequences(
        self,
        obs: torch.Tensor,
        actions: torch.Tensor,
        initial_state: torch.Tensor,
        episode_starts: torch.Tensor,
        action_masks: torch.Tensor | None = None,
    ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """(log_prob, entropy, value), each (L, B), of `actions` along sequences of L steps
        of B envs (time-major) from `initial_state`, the state zeroed before each step t > 0
        where `episode_starts[t]`: the recurrence as collection ran it. (`episode_starts`
        on the host, as the storage gives it, finds the cuts without a device read.)"""
        L, B = first_part(obs).shape[:2]
        x = self.encode(obs)
        cuts = [t for t in range(1, L) if episode_starts[t].any()]  # where a state is zeroed
        state, actor_features, critic_features = initial_state, [], []
        for start, end in zip([0, *cuts], [*cuts, L], strict=True):
            if start > 0:
                keep = to_device((~episode_starts[start]).to(state.dtype), state.device)
                state = state * keep[:, None, None]
            actor_out, critic_out, state = self._cores(x[start:end], state)
            actor_features.append(actor_out.reshape(-1, actor_out.shape[-1]))
            critic_features.append(critic_out.reshape(-1, critic_out.shape[-1]))
        flat_actions = actions.reshape(L * B, *actions.shape[2:])
        masks = None if action_masks is None else action_masks.reshape(L * B, -1)
        out = self.actor(torch.cat(actor_features))
        log_prob, entropy = action_log_prob_and_entropy(
            out, flat_actions, self.head, self._log_std, masks
        )
        value = self.critic(torch.cat(critic_features)).squeeze(-1)
        return log_prob.view(L, B), entropy.view(L, B), value.view(L, B)


class RecurrentActorCritic(RecurrentActorCriticBase):
    """An LSTM actor-critic for partially observable tasks, laid out as sb3-contrib's
    MlpLstmPolicy (RecurrentPPO's default, with which RL Zoo's ppo_lstm scores were made):
    an LSTM for the actor and another for the critic, each followed by a Tanh MLP head
    (64-64, orthogonal init as ActorCritic's). Separate cores keep the value loss from
    shaping the actor's memory, as in the feed-forward ActorCritic. The state of one env
    is (4, H): h and c of the actor's LSTM, then of the critic's."""

    SPEC_NAME = "recurrent_actor_critic"

    def __init__(
        self,
        obs_dim: int,
        action_dim: int,
        continuous: bool = False,
        lstm_hidden: int = 256,
        hidden: tuple[int, ...] = (64, 64),
        encoder: nn.Module | None = None,
        head: Any = None,
    ) -> None:
        super().__init__()
        self.head = head
        action_dim = action_dim if head is None else head.out_dim
        self.action_dim, self.continuous, self.lstm_hidden = action_dim, continuous, lstm_hidden
        self.hidden = tuple(hidden)
        self.state_shape = (4, lstm_hidden)
        self.encoder = FlatEncoder((obs_dim,)) if encoder is None else encoder
        self.actor_lstm = nn.LSTM(self.encoder.out_dim, lstm_hidden)
        self.critic_lstm = nn.LSTM(self.encoder.out_dim, lstm_hidden)
        self.actor = mlp(lstm_hidden, hidden, action_dim, out_std=0.01)
        self.critic = mlp(lstm_hidden, hidden, 1, out_std=1.0)
        if continuous:
            self.actor_logstd = nn.Parameter(torch.zeros(1, action_dim))

    def spec_args(self) -> dict:
        head = {"action_head": self.head.spec()} if self.head is not None else {}
        return {
            "action_dim": self.action_dim,
            "continuous": self.continuous,
            "lstm_hidden": self.lstm_hidden,
            "hidden": list(self.hidden),
            **head,
        }

    @classmethod
    def from_spec(cls, spec: dict) -> RecurrentActorCritic:
        encoder = encoder_from_description(description_of_spec(spec))
        hidden = tuple(spec.get("hidden", (64, 64)))  # (older model files: the default)
        return cls(
            0,
            spec["action_dim"],
            spec["continuous"],
            spec["lstm_hidden"],
            hidden,
            encoder,
            head_from_spec(spec.get("action_head")),
        )

    def encode(self, obs: Tree) -> torch.Tensor:
        """The encoder's features of observations (L, B, ...): (L, B, features)."""
        L, B = first_part(obs).shape[:2]
        flat = map_parts(lambda part: part.reshape(L * B, *part.shape[2:]), obs)
        return self.encoder(flat).view(L, B, -1)

    def _cores(self, x: torch.Tensor, state: torch.Tensor) -> tuple[torch.Tensor, ...]:
        """Both LSTMs over x (L, B, obs_dim) from `state`: (actor features (L, B, H),
        critic features, the state after the last step)."""
        h_a, c_a, h_c, c_c = (state[:, k][None].contiguous() for k in range(4))
        actor_out, (h_a, c_a) = self.actor_lstm(x, (h_a, c_a))
        critic_out, (h_c, c_c) = self.critic_lstm(x, (h_c, c_c))
        return actor_out, critic_out, torch.stack((h_a[0], c_a[0], h_c[0], c_c[0]), dim=1)


class CnnRecurrentActorCritic(RecurrentActorCriticBase):
    """The LSTM actor-critic for image stacks, as CleanRL's ppo_atari_lstm.py: the Nature
    CNN, then one LSTM (orthogonal weights, zero biases) shared by a Categorical head
    (gain 0.01) and a value head (gain 1). One core, as CleanRL's: a second Nature CNN and
    LSTM would double the cost of every step. The state of one env is (2, H): h and c."""

    SPEC_NAME = "cnn_recurrent_actor_critic"
    continuous = False

    def __init__(self, obs_shape: tuple[int, ...], action_dim: int, lstm_hidden: int = 128):
        super().__init__()
        self.action_dim, self.lstm_hidden = action_dim, lstm_hidden
        self.state_shape = (2, lstm_hidden)
        self.trunk = nature_cnn(obs_shape[0], tuple(obs_shape[1:]))
        self.lstm = nn.LSTM(512, lstm_hidden)
        for name, param in self.lstm.named_parameters():
            if name.startswith("bias"):
                nn.init.constant_(param, 0)
            else:
                nn.init.orthogonal_(param, 1.0)
        self.actor = layer_init(nn.Linear(lstm_hidden, action_dim), std=0.01)
        self.critic = layer_init(nn.Linear(lstm_hidden, 1), std=1.0)

    def spec_args(self) -> dict:
        return {"action_dim": self.action_dim, "continuous": False, "lstm_hidden": self.lstm_hidden}

    @classmethod
    def from_spec(cls, spec: dict) -> CnnRecurrentActorCritic:
        return cls(tuple(spec["obs_shape"]), spec["action_dim"], spec["lstm_hidden"])

    def encode(self, obs: torch.Tensor) -> torch.Tensor:
        """The CNN's features of frames (L, B, C, H, W), all in one batch: (L, B, 512)."""
        L, B = obs.shape[:2]
        return self.trunk(obs.reshape(L * B, *obs.shape[2:])).view(L, B, -1)

    def _cores(self, x: torch.Tensor, state: torch.Tensor) -> tuple[torch.Tensor, ...]:
        h, c = (state[:, k][None].contiguous() for k in range(2))
        out, (h, c) = self.lstm(x, (h, c))
        return out, out, torch.stack((h[0], c[0]), dim=1)


def recurrent_actor_critic_for(
    obs_space,
    action_space,
    lstm_hidden: int,
    hidden: tuple[int, ...] = (64, 64),
    images: ImageOptions = DEFAULT_IMAGES,
) -> nn.Module:
    """A recurrent actor-critic shaped for a single env's spaces (gymnasium spaces):
    CnnRecurrentActorCritic for frame stacks, else RecurrentActorCritic on the observation
    space's encoder."""
    from gymnasium import spaces

    from rlstore.envs import is_frame_stack

    if is_frame_stack(obs_space) and isinstance(action_space, spaces.Discrete):
        return CnnRecurrentActorCritic(obs_space.shape, int(action_space.n), lstm_hidden)
    continuous, head = isinstance(action_space, spaces.Box), head_for(action_space)
    action_dim = 0 if head else action_space.shape[0] if continuous else int(action_space.n)
    return RecurrentActorCritic(
        0, action_dim, continuous, lstm_hidden, hidden, encoder_for(obs_space, images), head
    )
