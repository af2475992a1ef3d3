"""Networks: the actor-critic of PPO and A2C, the Q-network of DQN and its greedy actor.
They know nothing about storage or envs."""

from __future__ import annotations

import math

import numpy as np
import torch
from torch import nn
from torch.nn import functional as F

LOG_SQRT_2PI = 0.5 * math.log(2 * math.pi)


def layer_init(layer: nn.Linear, std: float = math.sqrt(2), bias: float = 0.0) -> nn.Linear:
    """Orthogonal weights with gain `std` and a constant bias (the PPO implementation detail)."""
    nn.init.orthogonal_(layer.weight, std)
    nn.init.constant_(layer.bias, bias)
    return layer


def linear_layers(net: nn.Sequential) -> list[tuple[nn.Parameter, nn.Parameter]]:
    """(weight, bias) of each Linear in `net`, for calls that skip nn.Module dispatch."""
    return [(m.weight, m.bias) for m in net if isinstance(m, nn.Linear)]


def run_mlp(layers: list[tuple[torch.Tensor, torch.Tensor]], x: torch.Tensor, act) -> torch.Tensor:
    """The same arithmetic as the nn.Sequential, without its per-module Python overhead
    (which costs more than the matrix products at these sizes)."""
    for weight, bias in layers[:-1]:
        x = act(F.linear(x, weight, bias))
    weight, bias = layers[-1]
    return F.linear(x, weight, bias)


class FastMLPModule(nn.Module):
    """A module that keeps (weight, bias) lists for run_mlp, rebuilt whenever the module
    moves (`.to()` may replace its parameters, e.g. to or from the meta device)."""

    def _cache_layers(self) -> None:
        raise NotImplementedError

    def _apply(self, fn, recurse: bool = True):  # type: ignore[override]
        super()._apply(fn, recurse)
        self._cache_layers()
        return self


def mlp(in_dim: int, hidden: tuple[int, ...], out_dim: int, out_std: float) -> nn.Sequential:
    """Tanh MLP with orthogonal init; the output layer's gain is `out_std`."""
    layers: list[nn.Module] = []
    for width in hidden:
        layers += [layer_init(nn.Linear(in_dim, width)), nn.Tanh()]
        in_dim = width
    layers.append(layer_init(nn.Linear(in_dim, out_dim), std=out_std))
    return nn.Sequential(*layers)


class ActorCritic(FastMLPModule):
    """Separate actor and critic MLPs for vector observations.

    Discrete actions: a Categorical head over `action_dim` logits. Continuous actions: a
    Gaussian head with a state-independent log-std; samples are returned unclipped (the
    caller clips what it sends to the env, never what it stores).
    Sampling and log-probabilities use direct formulas instead of torch.distributions,
    which costs several times more per call than the arithmetic.
    """

    def __init__(
        self,
        obs_dim: int,
        action_dim: int,
        continuous: bool = False,
        hidden: tuple[int, ...] = (64, 64),
    ) -> None:
        super().__init__()
        self.continuous = continuous
        self.critic = mlp(obs_dim, hidden, 1, out_std=1.0)
        self.actor = mlp(obs_dim, hidden, action_dim, out_std=0.01)
        if continuous:
            self.actor_logstd = nn.Parameter(torch.zeros(1, action_dim))
        self._cache_layers()

    def _cache_layers(self) -> None:
        self._actor, self._critic = linear_layers(self.actor), linear_layers(self.critic)

    @staticmethod
    def _features(obs: torch.Tensor) -> torch.Tensor:
        return obs.reshape(obs.shape[0], -1).float()

    def value(self, obs: torch.Tensor) -> torch.Tensor:
        """V(obs), shape (batch,)."""
        return run_mlp(self._critic, self._features(obs), torch.tanh).squeeze(-1)

    def act(self, obs: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """Sample actions; returns (action, log_prob, value)."""
        x = self._features(obs)
        out = run_mlp(self._actor, x, torch.tanh)
        if self.continuous:
            std = self.actor_logstd.exp()
            noise = torch.randn_like(out)
            action = out + std * noise
            log_prob = (-0.5 * noise.square() - self.actor_logstd - LOG_SQRT_2PI).sum(-1)
        else:
            log_probs = out.log_softmax(-1)
            # Inverse-CDF sampling: the first action whose cumulative probability exceeds u.
            u = torch.rand(out.shape[0], 1, device=out.device)
            below = (log_probs.exp().cumsum(-1) < u).sum(-1, keepdim=True)
            action = below.clamp_(max=out.shape[-1] - 1)  # u above a rounded-down total
            log_prob = log_probs.gather(-1, action).squeeze(-1)
            action = action.squeeze(-1)
        return action, log_prob, run_mlp(self._critic, x, torch.tanh).squeeze(-1)

    def evaluate(
        self, obs: torch.Tensor, action: torch.Tensor
    ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """(log_prob of `action`, entropy, value) under the current parameters."""
        x = self._features(obs)
        out = run_mlp(self._actor, x, torch.tanh)
        if self.continuous:
            logstd = self.actor_logstd.expand_as(out)
            z = (action - out) / logstd.exp()
            log_prob = (-0.5 * z.square() - logstd - LOG_SQRT_2PI).sum(-1)
            entropy = (0.5 + LOG_SQRT_2PI + logstd).sum(-1)
        else:
            log_probs = out.log_softmax(-1)
            log_prob = log_probs.gather(-1, action.long().unsqueeze(-1)).squeeze(-1)
            entropy = -(log_probs.exp() * log_probs).sum(-1)
        return log_prob, entropy, run_mlp(self._critic, x, torch.tanh).squeeze(-1)

    def deterministic_action(self, obs: torch.Tensor) -> torch.Tensor:
        """The mode of the policy: argmax logits, or the Gaussian mean."""
        out = self.actor(self._features(obs))
        return out if self.continuous else out.argmax(-1)


def actor_critic_for(obs_space, action_space) -> ActorCritic:  # gymnasium spaces
    """An ActorCritic shaped for a single env's observation and action spaces."""
    from gymnasium import spaces

    obs_dim = int(np.prod(obs_space.shape))
    if isinstance(action_space, spaces.Discrete):
        return ActorCritic(obs_dim, int(action_space.n))
    if isinstance(action_space, spaces.Box) and len(action_space.shape) == 1:
        return ActorCritic(obs_dim, action_space.shape[0], continuous=True)
    raise ValueError(f"unsupported action space {action_space}: use Discrete or a 1-d Box")


class QNetwork(FastMLPModule):
    """ReLU MLP Q-network (120-84 like the classic DQN reference), optionally dueling."""

    def __init__(
        self,
        obs_dim: int,
        num_actions: int,
        hidden: tuple[int, ...] = (120, 84),
        dueling: bool = False,
    ) -> None:
        super().__init__()
        layers: list[nn.Module] = []
        in_dim = obs_dim
        for width in hidden:
            layers += [nn.Linear(in_dim, width), nn.ReLU()]
            in_dim = width
        self.body = nn.Sequential(*layers)
        self.dueling = dueling
        self.advantage = nn.Linear(in_dim, num_actions)
        if dueling:
            self.value = nn.Linear(in_dim, 1)
        self._cache_layers()

    def _cache_layers(self) -> None:
        self._layers = [*linear_layers(self.body), (self.advantage.weight, self.advantage.bias)]

    def forward(self, obs: torch.Tensor) -> torch.Tensor:
        """Q-values, shape (batch, num_actions)."""
        x = obs.reshape(obs.shape[0], -1).float()
        if not self.dueling:
            return run_mlp(self._layers, x, torch.relu)
        x = self.body(x)
        advantage = self.advantage(x)
        return self.value(x) + advantage - advantage.mean(-1, keepdim=True)


def policy_spec(network: nn.Module, obs_space, action_space) -> dict:  # gymnasium spaces
    """What rebuilds `network` (build_policy) and clips its actions: kept in model.pt."""
    spec = {"obs_shape": list(obs_space.shape)}
    if isinstance(network, QNetwork):
        return {"network": "q_network", **spec, "action_dim": int(action_space.n),
                "dueling": network.dueling}  # fmt: skip
    if not network.continuous:
        return {"network": "actor_critic", **spec, "action_dim": int(action_space.n),
                "continuous": False}  # fmt: skip
    return {"network": "actor_critic", **spec, "action_dim": action_space.shape[0],
            "continuous": True, "action_low": action_space.low.tolist(),
            "action_high": action_space.high.tolist()}  # fmt: skip


def build_policy(spec: dict) -> nn.Module:
    """The network a policy spec describes, with fresh parameters."""
    obs_dim = int(np.prod(spec["obs_shape"]))
    if spec["network"] == "q_network":
        return QNetwork(obs_dim, spec["action_dim"], dueling=spec["dueling"])
    return ActorCritic(obs_dim, spec["action_dim"], continuous=spec["continuous"])


class GreedyActor:
    """argmax_a Q(obs, a) for a batch of host observations, as an int64 numpy array.

    Acting is one tiny forward per env step, where torch's per-call dispatch costs several
    times the arithmetic (~25 us against ~8 us for a 1-row forward). So with parameters in
    host memory the forward runs in numpy, on views of the live parameters (the optimizer
    and load_state_dict update them in place; a moved network is noticed and re-viewed).
    On any other device it runs in torch; `use_numpy=False` makes it torch everywhere.
    The argmax is taken over the advantage head: with a dueling head V(s) and the mean
    advantage are the same for every action, so the argmax is that of Q.
    """

    def __init__(self, q_network: QNetwork, use_numpy: bool = True) -> None:
        self.q_network = q_network
        self.use_numpy = use_numpy
        self._source: list | None = None  # q_network._layers when the views were taken
        self._views: list[tuple[np.ndarray, np.ndarray]] = []

    def __call__(self, obs: np.ndarray) -> np.ndarray:
        layers = self.q_network._layers
        if layers is not self._source:  # first call, or the network moved
            self._source = layers
            on_host = layers[0][0].device.type == "cpu"
            self._views = (
                [(w.detach().numpy().T, b.detach().numpy()) for w, b in layers]
                if on_host and self.use_numpy
                else []
            )
        if not self._views:
            with torch.inference_mode():
                x = torch.as_tensor(obs, device=layers[0][0].device)
                x = run_mlp(layers, x.reshape(x.shape[0], -1).float(), torch.relu)
                return x.argmax(-1).cpu().numpy()
        x = np.asarray(obs, dtype=np.float32).reshape(len(obs), -1)
        for weight, bias in self._views[:-1]:
            x = x @ weight
            x += bias
            np.maximum(x, 0.0, out=x)
        weight, bias = self._views[-1]
        return (x @ weight + bias).argmax(-1)
