"""Networks: the actor-critic of PPO and A2C and the Q-network of DQN, and the policy spec
that rebuilds a network from model.pt (ppo_lstm's networks are in recurrent_networks.py,
SAC's, TD3's and DDPG's in continuous_networks.py). They know nothing about storage; of
envs, only which network an observation space gets (frame stacks: the Nature CNN).

Each network that model.pt may hold has a SPEC_NAME, `spec_args()` (what its constructor
needs beyond the spaces) and `from_spec(spec)`; an algorithm lists its networks in its
registry entry (rlstore/algos/__init__.py), which rebuilds them for `rlstore eval`.

`fast=False` builds the reference: the layers called as modules, and no numpy actor
(--fast-paths off); the parameters, and so model.pt, are the same either way."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np
import torch
from torch import nn

from rlstore.action_heads import head_for, head_from_spec, inverse_cdf, masked_logits, masked_q
from rlstore.encoders import (  # noqa: F401 (nature_cnn: tests import it here)
    DEFAULT_IMAGES,
    FlatEncoder,
    ImageOptions,
    describe_space,
    description_of_spec,
    encoder_for,
    encoder_from_description,
    layer_init,
    nature_cnn,
)
from rlstore.host_networks import LOG_SQRT_2PI, GreedyActor, HostActorCritic, SequentialRunner
from rlstore.parts import as_tensors


def sample_categorical(
    logits: torch.Tensor, mask: torch.Tensor | None = None
) -> tuple[torch.Tensor, torch.Tensor]:
    """(action, log-prob) of one sample per row of Categorical(logits=logits), by inverse
    CDF: the first action whose cumulative probability exceeds a uniform draw; only actions
    that `mask` allows, where one is given."""
    log_probs = masked_logits(logits, mask).log_softmax(-1)
    action = inverse_cdf(log_probs, mask)
    return action.squeeze(-1), log_probs.gather(-1, action).squeeze(-1)


def sample_gaussian(mean: torch.Tensor, log_std: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """(action, log-prob) of one sample of Normal(mean, exp(log_std)), summed over the
    action dimensions; the sample is not clipped."""
    noise = torch.randn_like(mean)
    action = mean + log_std.exp() * noise
    return action, (-0.5 * noise.square() - log_std - LOG_SQRT_2PI).sum(-1)


def log_prob_and_entropy(
    out: torch.Tensor, action: torch.Tensor, log_std: torch.Tensor | None
) -> tuple[torch.Tensor, torch.Tensor]:
    """log-prob of `action` and entropy under the actor's output `out`: a Gaussian of mean
    `out` and state-independent `log_std` (continuous), or a Categorical of logits `out`."""
    if log_std is not None:
        logstd = log_std.expand_as(out)
        z = (action - out) / logstd.exp()
        log_prob = (-0.5 * z.square() - logstd - LOG_SQRT_2PI).sum(-1)
        return log_prob, (0.5 + LOG_SQRT_2PI + logstd).sum(-1)
    log_probs = out.log_softmax(-1)
    log_prob = log_probs.gather(-1, action.long().unsqueeze(-1)).squeeze(-1)
    return log_prob, -(log_probs.exp() * log_probs).sum(-1)


def sample_action(
    out: torch.Tensor, head: Any, log_std: torch.Tensor | None, mask: torch.Tensor | None
) -> tuple[torch.Tensor, torch.Tensor]:
    """(action, log-prob) sampled from an actor's output: its action head's distribution
    (MultiDiscrete, MultiBinary), a Gaussian (log_std given) or a Categorical."""
    if head is not None:
        return head.sample(out, mask)
    if log_std is not None:
        return sample_gaussian(out, log_std)
    return sample_categorical(out, mask)


def action_log_prob_and_entropy(
    out: torch.Tensor,
    action: torch.Tensor,
    head: Any,
    log_std: torch.Tensor | None,
    mask: torch.Tensor | None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """log-prob of `action` and entropy under an actor's output, as sample_action draws."""
    if head is not None:
        return head.log_prob_and_entropy(masked_logits(out, mask), action)
    return log_prob_and_entropy(masked_logits(out, mask), action, log_std)


def action_mode(
    out: torch.Tensor, head: Any, continuous: bool, mask: torch.Tensor | None
) -> torch.Tensor:
    """The most likely action under an actor's output (the Gaussian's mean)."""
    if head is not None:
        return head.mode(out, mask)
    return out if continuous else masked_logits(out, mask).argmax(-1)


def mlp(in_dim: int, hidden: tuple[int, ...], out_dim: int, out_std: float) -> nn.Sequential:
    """Tanh MLP with orthogonal init; the output layer's gain is `out_std`."""
    layers: list[nn.Module] = []
    for width in hidden:
        layers += [layer_init(nn.Linear(in_dim, width)), nn.Tanh()]
        in_dim = width
    layers.append(layer_init(nn.Linear(in_dim, out_dim), std=out_std))
    return nn.Sequential(*layers)


class ModuleCalls:
    """The layers called in order as modules, as nn.Sequential calls them: the reference
    that SequentialRunner is tested against. Held outside the module tree (a plain object),
    so that the state dict is the same with either."""

    def __init__(self, layers: Sequence[nn.Module]) -> None:
        self.layers = list(layers)

    def __call__(self, x: torch.Tensor) -> torch.Tensor:
        for layer in self.layers:
            x = layer(x)
        return x


class ActorCritic(nn.Module):
    """Separate actor and critic MLPs for vector observations.

    Discrete actions: a Categorical head over `action_dim` logits. Continuous actions: a
    Gaussian head with a state-independent log-std; samples are returned unclipped (the
    caller clips what it sends to the env, never what it stores). With `fast`, the MLPs run
    through SequentialRunner (the same layers, called without module dispatch) and
    `act_on_host` acts in numpy while the parameters are in host memory.
    """

    SPEC_NAME = "actor_critic"

    def __init__(
        self,
        obs_dim: int,
        action_dim: int,
        continuous: bool = False,
        hidden: tuple[int, ...] = (64, 64),
        fast: bool = True,
        encoder: nn.Module | None = None,
        head: Any = None,
    ) -> None:
        super().__init__()
        # MultiDiscrete and MultiBinary actions: their head (rlstore/action_heads.py)
        self.head = head
        action_dim = action_dim if head is None else head.out_dim
        self.action_dim, self.continuous, self.hidden = action_dim, continuous, tuple(hidden)
        # the observation's encoder (rlstore/encoders.py), shared by actor and critic
        self.encoder = FlatEncoder((obs_dim,)) if encoder is None else encoder
        self.critic = mlp(self.encoder.out_dim, hidden, 1, out_std=1.0)
        self.actor = mlp(self.encoder.out_dim, hidden, action_dim, out_std=0.01)
        if continuous:
            self.actor_logstd = nn.Parameter(torch.zeros(1, action_dim))
        path = SequentialRunner if fast else ModuleCalls
        self.actor_path, self.critic_path = path(self.actor), path(self.critic)
        self.act_on_host: HostActorCritic | None = None
        if fast and hasattr(self.encoder, "host"):  # act() in numpy
            self.act_on_host = HostActorCritic(
                self.actor_path,
                self.critic_path,
                self.actor_logstd if continuous else None,
                self.encoder,
                head,
            )

    def spec_args(self) -> dict:
        head = {"action_head": self.head.spec()} if self.head is not None else {}
        return {
            "action_dim": self.action_dim,
            "continuous": self.continuous,
            "hidden": list(self.hidden),
            **head,
        }

    @classmethod
    def from_spec(cls, spec: dict) -> ActorCritic:
        encoder = encoder_from_description(description_of_spec(spec))
        hidden = tuple(spec.get("hidden", (64, 64)))  # (older model files: the default)
        return cls(
            0,
            spec["action_dim"],
            spec["continuous"],
            hidden,
            encoder=encoder,
            head=head_from_spec(spec.get("action_head")),
        )

    def _features(self, obs: torch.Tensor) -> torch.Tensor:
        return self.encoder(obs)

    def value(self, obs: torch.Tensor) -> torch.Tensor:
        """V(obs), shape (batch,)."""
        return self.critic_path(self._features(obs)).squeeze(-1)

    @property
    def _log_std(self) -> torch.Tensor | None:
        return self.actor_logstd if self.continuous else None

    def act(
        self, obs: torch.Tensor, action_mask: torch.Tensor | None = None
    ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """Sample actions (only allowed ones, with `action_mask`); returns (action,
        log_prob, value)."""
        x = self._features(obs)
        action, log_prob = sample_action(self.actor_path(x), self.head, self._log_std, action_mask)
        return action, log_prob, self.critic_path(x).squeeze(-1)

    def evaluate(
        self, obs: torch.Tensor, action: torch.Tensor, action_mask: torch.Tensor | None = None
    ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """(log_prob of `action`, entropy, value) under the current parameters (and the
        mask the action was taken under)."""
        x = self._features(obs)
        log_prob, entropy = action_log_prob_and_entropy(
            self.actor_path(x), action, self.head, self._log_std, action_mask
        )
        return log_prob, entropy, self.critic_path(x).squeeze(-1)

    def deterministic_action(
        self, obs: torch.Tensor, action_mask: torch.Tensor | None = None
    ) -> torch.Tensor:
        """The mode of the policy: argmax logits (of allowed actions), or the Gaussian mean."""
        out = self.actor_path(self._features(obs))
        return action_mode(out, self.head, self.continuous, action_mask)


def actor_critic_for(
    obs_space,
    action_space,
    fast: bool = True,
    hidden: tuple[int, ...] = (64, 64),
    images: ImageOptions = DEFAULT_IMAGES,
) -> nn.Module:
    """An ActorCritic (CnnActorCritic for frame stacks) shaped for a single env's
    observation and action spaces: the observation space's encoder, then the MLPs."""
    from gymnasium import spaces

    from rlstore.envs import is_frame_stack

    if is_frame_stack(obs_space) and isinstance(action_space, spaces.Discrete):
        return CnnActorCritic(obs_space.shape, int(action_space.n))
    head = head_for(action_space)  # MultiDiscrete, MultiBinary
    continuous = isinstance(action_space, spaces.Box) and len(action_space.shape) == 1
    if not (head or continuous or isinstance(action_space, spaces.Discrete)):
        raise ValueError(
            f"unsupported action space {action_space}: use Discrete, a 1-d Box, MultiDiscrete "
            "or MultiBinary"
        )
    action_dim = 0 if head else action_space.shape[0] if continuous else int(action_space.n)
    encoder = encoder_for(obs_space, images)
    return ActorCritic(0, action_dim, continuous, hidden, fast, encoder, head)


class CnnActorCritic(nn.Module):
    """Actor-critic for image stacks: a shared Nature CNN trunk, a Categorical head (gain
    0.01) and a value head (gain 1), as in the PPO Atari reference. Same interface as
    ActorCritic."""

    SPEC_NAME = "cnn_actor_critic"
    continuous = False
    head = None  # (Discrete actions only)
    act_on_host = None  # (no numpy twin: the convolutions are torch's)

    def __init__(self, obs_shape: tuple[int, ...], action_dim: int) -> None:
        super().__init__()
        self.action_dim = action_dim
        self.trunk = nature_cnn(obs_shape[0], tuple(obs_shape[1:]))
        self.actor = layer_init(nn.Linear(512, action_dim), std=0.01)
        self.critic = layer_init(nn.Linear(512, 1), std=1.0)

    def value(self, obs: torch.Tensor) -> torch.Tensor:
        return self.critic(self.trunk(obs)).squeeze(-1)

    def act(
        self, obs: torch.Tensor, action_mask: torch.Tensor | None = None
    ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        hidden = self.trunk(obs)
        action, log_prob = sample_categorical(self.actor(hidden), action_mask)
        return action, log_prob, self.critic(hidden).squeeze(-1)

    def evaluate(
        self, obs: torch.Tensor, action: torch.Tensor, action_mask: torch.Tensor | None = None
    ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        hidden = self.trunk(obs)
        out = masked_logits(self.actor(hidden), action_mask)
        log_prob, entropy = log_prob_and_entropy(out, action, None)
        return log_prob, entropy, self.critic(hidden).squeeze(-1)

    def deterministic_action(
        self, obs: torch.Tensor, action_mask: torch.Tensor | None = None
    ) -> torch.Tensor:
        return masked_logits(self.actor(self.trunk(obs)), action_mask).argmax(-1)

    def spec_args(self) -> dict:
        return {"action_dim": self.action_dim, "continuous": False}

    @classmethod
    def from_spec(cls, spec: dict) -> CnnActorCritic:
        return cls(tuple(spec["obs_shape"]), spec["action_dim"])


class CnnQNetwork(nn.Module):
    """Q-network for image stacks: the Nature CNN trunk and a linear Q head, or a dueling
    head (value and advantage streams on the trunk's 512 features)."""

    SPEC_NAME = "cnn_q_network"

    def __init__(self, obs_shape: tuple[int, ...], num_actions: int, dueling: bool = False):
        super().__init__()
        self.num_actions, self.dueling = num_actions, dueling
        self.trunk = nature_cnn(obs_shape[0], tuple(obs_shape[1:]))
        self.advantage = nn.Linear(512, num_actions)
        if dueling:
            self.value = nn.Linear(512, 1)

    def forward(self, obs: torch.Tensor) -> torch.Tensor:
        x = self.trunk(obs)
        advantage = self.advantage(x)
        if not self.dueling:
            return advantage
        return self.value(x) + advantage - advantage.mean(-1, keepdim=True)

    def q_values(self, obs: torch.Tensor) -> torch.Tensor:
        """Q(obs, a) for every action, shape (batch, num_actions)."""
        return self(obs)

    def spec_args(self) -> dict:
        return {"action_dim": self.num_actions, "dueling": self.dueling}

    @classmethod
    def from_spec(cls, spec: dict) -> CnnQNetwork:
        return cls(tuple(spec["obs_shape"]), spec["action_dim"], spec["dueling"])

    def greedy_action(self, obs: np.ndarray) -> np.ndarray:
        """argmax Q for a batch of host observations (as GreedyActor for the MLPs)."""
        device = self.advantage.weight.device
        with torch.inference_mode():
            return (
                self.advantage(self.trunk(torch.as_tensor(obs, device=device)))
                .argmax(-1)
                .cpu()
                .numpy()
            )


class QNetwork(nn.Module):
    """ReLU MLP Q-network (120-84 like the classic DQN reference), optionally dueling.

    `advantage_path` runs body and advantage head (through SequentialRunner with `fast`):
    without a dueling head that is Q itself, and its argmax is Q's argmax either way
    (GreedyActor)."""

    SPEC_NAME = "q_network"

    def __init__(
        self,
        obs_dim: int,
        num_actions: int,
        hidden: tuple[int, ...] = (120, 84),
        dueling: bool = False,
        fast: bool = True,
        encoder: nn.Module | None = None,
    ) -> None:
        super().__init__()
        self.encoder = FlatEncoder((obs_dim,)) if encoder is None else encoder
        layers: list[nn.Module] = []
        in_dim = self.encoder.out_dim
        for width in hidden:
            layers += [nn.Linear(in_dim, width), nn.ReLU()]
            in_dim = width
        self.body = nn.Sequential(*layers)
        self.num_actions, self.hidden, self.dueling = num_actions, tuple(hidden), dueling
        self.advantage = nn.Linear(in_dim, num_actions)
        if dueling:
            self.value = nn.Linear(in_dim, 1)
        path = SequentialRunner if fast else ModuleCalls
        self.advantage_path = path([*self.body, self.advantage])

    def forward(self, obs: torch.Tensor) -> torch.Tensor:
        """Q-values, shape (batch, num_actions)."""
        x = self.encoder(obs)
        if not self.dueling:
            return self.advantage_path(x)
        x = self.body(x)
        advantage = self.advantage(x)
        return self.value(x) + advantage - advantage.mean(-1, keepdim=True)

    def q_values(self, obs: torch.Tensor) -> torch.Tensor:
        """Q(obs, a) for every action, shape (batch, num_actions)."""
        return self(obs)

    def greedy_action(self, obs: np.ndarray, masks: np.ndarray | None = None) -> np.ndarray:
        """argmax Q (over the actions `masks` allows, where given) for a batch of host
        observations (GreedyActor's reference)."""
        device = self.advantage.weight.device
        with torch.inference_mode():
            q = self.advantage_path(self.encoder(as_tensors(obs, device)))
            allowed = None if masks is None else torch.as_tensor(masks, device=device)
            return masked_q(q, allowed).argmax(-1).cpu().numpy()

    def greedy_actor(self) -> GreedyActor | None:
        """greedy_action in numpy (a fast path), where the encoder has a numpy twin; None
        elsewhere."""
        if not hasattr(self.encoder, "host"):
            return None
        return GreedyActor(self.advantage_path, encoder=self.encoder)

    def spec_args(self) -> dict:
        return {
            "action_dim": self.num_actions,
            "dueling": self.dueling,
            "hidden": list(self.hidden),
        }

    @classmethod
    def from_spec(cls, spec: dict) -> QNetwork:
        encoder = encoder_from_description(description_of_spec(spec))
        hidden = tuple(spec.get("hidden", (120, 84)))  # (older model files: the default)
        return cls(0, spec["action_dim"], hidden, dueling=spec["dueling"], encoder=encoder)


def policy_spec(
    network: nn.Module, obs_space, action_space, action_masks: str | None = None
) -> dict:
    """What rebuilds `network` (its class's from_spec) and clips its actions, and how the
    env gives the action masks it acts under (rlstore/masks.py): kept in model.pt."""
    shape = None if obs_space.shape is None else list(obs_space.shape)  # (None: Dict, Tuple)
    spec = {
        "network": network.SPEC_NAME,
        "obs_shape": shape,
        "observation": getattr(getattr(network, "encoder", None), "description", None)
        or describe_space(obs_space),
    }
    spec |= network.spec_args()
    if action_masks is not None:
        spec["action_masks"] = action_masks
    if getattr(action_space, "env_start", 0):  # Discrete(n, start=s): envs.StartedDiscrete
        spec["action_start"] = action_space.env_start
    if spec.get("continuous"):
        spec |= {
            "action_low": action_space.low.tolist(),
            "action_high": action_space.high.tolist(),
            "action_dtype": str(action_space.dtype),
            # a Box of more dimensions, which the algorithms act in flat (custom_envs.FlatBox)
            "env_action_shape": list(getattr(action_space, "env_shape", action_space.shape)),
        }
    return spec
