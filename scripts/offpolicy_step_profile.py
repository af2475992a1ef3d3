"""Where a SAC or TD3 gradient step's time goes: the step timed on HalfCheetah's shapes
(17 observations, 6 actions, 256-256 networks, batch 256) from a filled replay buffer,
then profiled, its ops grouped. Prints the figures docs/maintainers/fast-paths.md quotes.

    python scripts/offpolicy_step_profile.py                 # SAC, one thread
    python scripts/offpolicy_step_profile.py --algo td3
    python scripts/offpolicy_step_profile.py --compile       # also torch.compile's modules

Median of --blocks blocks of --steps steps. Run it on a quiet machine: the steps are
matrix products on one core, which any other process slows down.
"""

from __future__ import annotations

import argparse
import copy
import statistics
import time
from collections.abc import Callable

import numpy as np
import torch

from rlstore.algos import sac, td3
from rlstore.continuous_networks import DeterministicActorCritic, SquashedGaussianActorCritic
from rlstore.storage.replay import ReplayBuffer

OBS_DIM, ACTION_DIM = 17, 6  # HalfCheetah's
GROUPS = {  # profiler op name -> what the table calls it
    "aten::addmm": "matrix products",
    "aten::mm": "matrix products",
    "aten::clamp_min": "ReLU forward",
    "aten::threshold_backward": "ReLU backward",
    "aten::_fused_adam_": "Adam",
    "aten::copy_": "copies (bias into products, dtype casts)",
}


def filled_buffer(transitions: int) -> ReplayBuffer:
    rng = np.random.default_rng(0)
    buffer = ReplayBuffer(
        transitions,
        1,
        (OBS_DIM,),
        torch.float32,
        action_shape=(ACTION_DIM,),
        action_dtype=torch.float32,
        gamma=0.99,
        seed=0,
    )
    obs = rng.standard_normal((1, OBS_DIM), dtype=np.float32)
    for i in range(transitions):
        next_obs = rng.standard_normal((1, OBS_DIM), dtype=np.float32)
        action = rng.uniform(-1, 1, (1, ACTION_DIM)).astype(np.float32)
        ended = np.array([i % 1000 == 999])
        buffer.add(obs, action, rng.standard_normal(1), next_obs, ended, np.array([False]))
        obs = next_obs
    return buffer


def step_function(algo: str, compiled: bool) -> Callable[[int], None]:
    """gradient_step(number) of a fresh agent of `algo` (its modules compiled if asked)."""
    buffer, bounds = filled_buffer(20_000), ([-1.0] * ACTION_DIM, [1.0] * ACTION_DIM)
    if algo == "sac":
        cfg = sac.SACConfig()
        agent = SquashedGaussianActorCritic(OBS_DIM, *bounds)
        target = copy.deepcopy(agent.critic)
        entropy = sac.EntropyCoefficient()
        optimizers = sac.Optimizers(
            torch.optim.Adam(agent.actor.parameters(), lr=cfg.policy_lr, fused=True),
            torch.optim.Adam(agent.critic.parameters(), lr=cfg.q_lr, fused=True),
            torch.optim.Adam([entropy.log_alpha], lr=cfg.q_lr),
        )
        if compiled:
            agent.actor, agent.critic = torch.compile(agent.actor), torch.compile(agent.critic)
            target = torch.compile(target)

        def step(number: int) -> None:
            sac.gradient_step(
                number, agent, target, entropy, optimizers, buffer, cfg, -float(ACTION_DIM)
            )

        return step
    cfg = td3.TD3Config()
    agent = DeterministicActorCritic(OBS_DIM, *bounds)
    target = copy.deepcopy(agent)
    actor_opt = torch.optim.Adam(agent.actor.parameters(), lr=cfg.learning_rate, fused=True)
    critic_opt = torch.optim.Adam(agent.critic.parameters(), lr=cfg.learning_rate, fused=True)
    if compiled:
        for net in (agent, target):
            net.actor, net.critic = torch.compile(net.actor), torch.compile(net.critic)

    def step(number: int) -> None:
        td3.gradient_step(number, agent, target, actor_opt, critic_opt, buffer, cfg)

    return step


def time_step(step: Callable[[int], None], blocks: int, steps: int) -> float:
    """Median microseconds per step over `blocks` blocks of `steps` (after a warm-up)."""
    number = 1
    for _ in range(50):
        step(number)
        number += 1
    per_block = []
    for _ in range(blocks):
        start = time.perf_counter()
        for _ in range(steps):
            step(number)
            number += 1
        per_block.append((time.perf_counter() - start) / steps * 1e6)
    return statistics.median(per_block)


def profile_step(step: Callable[[int], None], steps: int) -> dict[str, float]:
    """Microseconds per step of each group of ops (self time), by torch.profiler."""
    from torch.profiler import profile

    with profile() as prof:
        for number in range(1, steps + 1):
            step(number)
    groups: dict[str, float] = {}
    for event in prof.key_averages():
        if event.key.startswith("aten::") or event.key.startswith("Optimizer."):
            name = GROUPS.get(event.key, "other ops, autograd, optimizer bookkeeping")
            groups[name] = groups.get(name, 0.0) + event.self_cpu_time_total / steps
    return groups


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--algo", choices=["sac", "td3"], default="sac")
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--blocks", type=int, default=5)
    parser.add_argument("--steps", type=int, default=100)
    parser.add_argument("--compile", action="store_true", help="also time torch.compile'd modules")
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    torch.manual_seed(0)
    step = step_function(args.algo, compiled=False)
    eager = time_step(step, args.blocks, args.steps)
    groups = profile_step(step, args.steps)
    total = sum(groups.values())
    print(
        f"{args.algo} gradient step, {args.threads} thread(s): {eager:,.0f} us "
        f"(median of {args.blocks} blocks of {args.steps})"
    )
    print(f"\nprofiled, {total:,.0f} us per step:\n\n| ops | us per step | share |\n|---|---|---|")
    for name, us in sorted(groups.items(), key=lambda kv: -kv[1]):
        print(f"| {name} | {us:,.0f} | {us / total:.0%} |")
    if args.compile:
        compiled = time_step(step_function(args.algo, compiled=True), args.blocks, args.steps)
        print(
            f"\ntorch.compile'd actor and critics: {compiled:,.0f} us against {eager:,.0f} "
            f"eager (x{eager / compiled:.2f})"
        )


if __name__ == "__main__":
    main()
