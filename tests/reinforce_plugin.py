"""REINFORCE with a value baseline, defined outside rlstore: the test that a new algorithm
is one file (tests/test_registry.py trains, evaluates, resumes and benchmarks it through
the command line). It registers itself when imported; RLSTORE_ALGORITHMS names this
module so that `rlstore` and the benchmark's child processes import it."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import torch
from gymnasium import spaces

from rlstore.algos import Algorithm, register
from rlstore.algos._on_policy import build_actor_critic, collect_rollout, compute_returns
from rlstore.config import OnPolicyConfig, Positive
from rlstore.networks import ActorCritic
from rlstore.run import Run, TrainResult


@dataclass
class ReinforceConfig(OnPolicyConfig):
    """REINFORCE: Monte Carlo returns (bootstrapped at the rollout's end), a value baseline."""

    learning_rate: Positive = 1e-2
    anneal_lr: bool = False
    num_steps: int = 64
    use_gae: bool = False


def reinforce_loss(log_prob, value, returns, cfg: ReinforceConfig) -> torch.Tensor:
    """-(G - V) log pi + vf_coef (G - V)^2, the baseline's gradient kept off the policy."""
    advantage = (returns - value).detach()
    return -(advantage * log_prob).mean() + cfg.vf_coef * (returns - value).square().mean()


def train(
    cfg: ReinforceConfig, preset: Path | None = None, resume: Path | None = None, callbacks=()
) -> TrainResult:
    run = Run(cfg, ALGORITHM.name, preset, resume, callbacks)
    agent, storage, state = build_actor_critic(cfg, ALGORITHM, run.device)
    optimizer = torch.optim.Adam(agent.parameters(), lr=cfg.learning_rate)
    state.parts["optimizer"] = optimizer
    with run.start(state):
        for _ in run.iterations():
            collect_rollout(agent, storage, state, run)
            compute_returns(agent, storage, cfg)
            data = storage.flatten()
            log_prob, _, value = agent.evaluate(data["obs"], data["actions"])
            loss = reinforce_loss(log_prob, value, data["returns"], cfg)
            optimizer.zero_grad()
            loss.backward()
            optimizer.step()
            if run.log_due():
                run.log_scalars({"losses/loss": loss.detach()})
            storage.after_update()
        return run.finish()


ALGORITHM = register(
    Algorithm(
        name="reinforce",
        summary="REINFORCE with a value baseline (a test of the registry)",
        config=ReinforceConfig,
        train=train,
        action_spaces=(spaces.Discrete,),
        networks=(ActorCritic,),
    )
)
