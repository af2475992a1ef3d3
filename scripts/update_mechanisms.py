"""The update's mechanisms side by side (issue 74, item 3): for PPO, A2C and DQN at their
CartPole-v1 defaults, the time of all the gradient steps of a default run, start-up
included, taken four ways:

- reference: the torch step of the algorithm's file (its loss, backward,
  clip_grad_norm_, the optimizer's step), eager, as `--fast-paths off` runs it;
- compiled: that same function under torch.compile (inductor, on the CPU), with the
  optimizer unfused so that its step is traced too (a fused one is opaque to the compiler);
  the graph breaks at zero_grad and backward remain;
- compiled, one graph: the whole step as one pure function, compiled with fullgraph=True:
  the gradient by torch.func.grad of the same loss function, the clipping and the
  optimizer's update (Adam or RMSprop) written as tensor arithmetic on the optimizer's own
  state; general in the loss (any loss the torch step takes), not in the optimizer;
- twin: the numpy step of rlstore/host_updates.py (HostPPOStep, HostA2CStep, HostDQNStep),
  as the default runs take it.

Each compiled mechanism is timed twice: with a fresh compile cache (a user's first run)
and with the cache the first left (every later run with these shapes).

    python scripts/update_mechanisms.py              # the markdown table
    python scripts/update_mechanisms.py --scale 0.1  # a tenth of each run's steps
    python scripts/update_mechanisms.py --out results/update-mechanisms  # .md and .json

Each measurement runs in its own process (so importing the compiler counts where it is
used), one torch thread and one BLAS thread as a Run sets them, on fixed random minibatches
of the default shapes (the arithmetic does not depend on the values), from the mechanism's
set-up to the end of its last step. Each also reports how far its parameters are from the
reference's after ten steps from the same start (float32 rounding, not a different step).
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

# gradient steps in a run of the CartPole-v1 defaults (`rlstore train ALGO`)
STEPS = {
    "ppo": 500_000 // (4 * 128) * 4 * 4,  # iterations x epochs x minibatches of 128
    "a2c": 500_000 // (8 * 5),  # one step per rollout of 8 envs x 5 steps
    "dqn": (500_000 - 10_000) // 10,  # one step of batch 128 every 10 env steps
}
ROWS = [  # (mechanism, label): a compiled one twice, the second with the first's cache
    ("reference", "reference (eager torch)"),
    ("compiled", "torch.compile, cold cache"),
    ("compiled", "torch.compile, warm cache"),
    ("one-graph", "torch.compile one graph, cold cache"),
    ("one-graph", "torch.compile one graph, warm cache"),
    ("twin", "twin (numpy)"),
]


class Update:
    """One algorithm's update at its defaults: the network, its optimizer, the loss as a
    function of (network, minibatch, diagnostics) returning the algorithm's losses dict,
    the minibatches, and the twin's step."""

    def __init__(self, algo: str, fast: bool, fused: bool) -> None:
        import copy

        import numpy as np
        import torch

        from rlstore.networks import ActorCritic, QNetwork

        rng = np.random.default_rng(0)
        torch.manual_seed(0)

        def f32(*shape):
            return torch.from_numpy(rng.normal(size=shape).astype(np.float32))

        self.algo = algo
        if algo in ("ppo", "a2c"):
            from rlstore.storage import RolloutBatch

            self.network = ActorCritic(4, 2, fast=fast)
            size = 128 if algo == "ppo" else 40
            self.batches = [
                RolloutBatch(
                    f32(size, 4),
                    torch.from_numpy(rng.integers(0, 2, size)),
                    f32(size) - 0.7,
                    f32(size),
                    f32(size),
                    f32(size),
                )
                for _ in range(8)
            ]
        else:
            from rlstore.storage.replay import ReplayBatch

            self.network = QNetwork(4, 2, fast=fast)
            self.target = copy.deepcopy(self.network)
            self.batches = [
                ReplayBatch(
                    f32(128, 4),
                    torch.from_numpy(rng.integers(0, 2, 128)),
                    f32(128),
                    f32(128, 4),
                    torch.from_numpy(rng.random(128) < 0.05),
                    torch.full((128,), 0.99),
                    torch.ones(128),
                    torch.arange(128),
                )
                for _ in range(8)
            ]
        params = self.network.parameters()
        if algo == "ppo":
            from rlstore.algos.ppo import PPOConfig

            self.cfg = PPOConfig()
            self.optimizer = torch.optim.Adam(params, lr=2.5e-4, eps=1e-5, fused=fused)
        elif algo == "a2c":
            from rlstore.algos.a2c import A2CConfig

            self.cfg = A2CConfig(learning_rate=7e-4)
            self.optimizer = torch.optim.RMSprop(
                params, lr=7e-4, alpha=0.99, eps=1e-5, foreach=True
            )
        else:
            from rlstore.algos.dqn import DQNConfig

            self.cfg = DQNConfig()
            self.optimizer = torch.optim.Adam(params, lr=self.cfg.learning_rate, fused=fused)

    def loss(self, network, batch, diagnostics: bool) -> dict:
        """The algorithm's loss, by its own function (algos/<algo>.py)."""
        cfg = self.cfg
        if self.algo == "dqn":
            from rlstore.algos.dqn import td_loss

            return {"loss": td_loss(network, self.target, batch, cfg)[0]}
        log_prob, entropy, value = network.evaluate(batch.obs, batch.actions)
        if self.algo == "ppo":
            from rlstore.algos.ppo import ppo_loss

            return ppo_loss(log_prob, value, entropy, batch, cfg, diagnostics)
        from rlstore.algos.a2c import a2c_loss

        return a2c_loss(log_prob, batch.advantages, value, batch.returns, entropy, cfg)

    def torch_step(self, batch, diagnostics: bool) -> dict:
        """The algorithm file's torch step."""
        from torch import nn

        losses = self.loss(self.network, batch, diagnostics)
        self.optimizer.zero_grad(set_to_none=True)
        losses["loss"].backward()
        if self.cfg.max_grad_norm is not None:
            params = list(self.network.parameters())
            nn.utils.clip_grad_norm_(params, self.cfg.max_grad_norm, foreach=True)
        self.optimizer.step()
        return losses

    def twin(self):
        from rlstore.host_updates import HostA2CStep, HostDQNStep, HostPPOStep
        from rlstore.storage.replay import ReplayBatch

        cfg = self.cfg
        if self.algo == "ppo":
            step = HostPPOStep(self.network, self.optimizer)
            return lambda batch, diagnostics: step(batch, cfg, diagnostics)
        if self.algo == "a2c":
            step = HostA2CStep(self.network, self.optimizer)
            return lambda batch, diagnostics: step(batch, cfg)
        step = HostDQNStep(self.network, self.target, self.optimizer)
        host = {
            id(b): ReplayBatch(*(x if x is None else x.numpy() for x in b)) for b in self.batches
        }
        return lambda batch, diagnostics: step(host[id(batch)], cfg)

    def one_graph(self):
        """The whole step as one pure function for torch.compile(fullgraph=True)."""
        import torch
        from torch import nn

        class Loss(nn.Module):  # functional_call replaces the parameters of a module's forward
            def __init__(self, network, loss) -> None:
                super().__init__()
                self.network, self.loss = network, loss

            def forward(self, batch, diagnostics):
                return self.loss(self.network, batch, diagnostics)

        module = Loss(self.network, self.loss)
        named = dict(module.named_parameters())
        optimizer, max_norm = self.optimizer, self.cfg.max_grad_norm
        group = optimizer.param_groups[0]
        adam = isinstance(optimizer, torch.optim.Adam)
        for param in named.values():  # the optimizer's own state, as it initializes it
            state = optimizer.state[param]
            state["step"] = torch.tensor(0.0)
            for key in ("exp_avg", "exp_avg_sq") if adam else ("square_avg",):
                state[key] = torch.zeros_like(param)

        def pure_loss(values, batch, diagnostics):
            losses = torch.func.functional_call(module, values, (batch, diagnostics))
            return losses["loss"], {k: v.detach() for k, v in losses.items()}

        def step(batch, diagnostics):
            values = {name: param.detach() for name, param in named.items()}
            grads, losses = torch.func.grad(pure_loss, has_aux=True)(values, batch, diagnostics)
            grads = [grads[name] for name in named]
            if max_norm is not None:  # clip_grad_norm_
                norm = torch.linalg.vector_norm(torch.stack([g.norm() for g in grads]))
                coef = (max_norm / (norm + 1e-6)).clamp(max=1.0)
                grads = [g * coef for g in grads]
            with torch.no_grad():
                for param, grad in zip(named.values(), grads, strict=True):
                    state = optimizer.state[param]
                    state["step"].add_(1)
                    if adam:
                        (beta1, beta2), t = group["betas"], state["step"]
                        state["exp_avg"].lerp_(grad, 1 - beta1)
                        state["exp_avg_sq"].mul_(beta2).addcmul_(grad, grad, value=1 - beta2)
                        denom = state["exp_avg_sq"].sqrt() / (1 - beta2**t).sqrt() + group["eps"]
                        param.sub_(group["lr"] / (1 - beta1**t) * state["exp_avg"] / denom)
                    else:  # RMSprop
                        alpha, square_avg = group["alpha"], state["square_avg"]
                        square_avg.mul_(alpha).addcmul_(grad, grad, value=1 - alpha)
                        param.sub_(group["lr"] * grad / (square_avg.sqrt() + group["eps"]))
            return losses

        return torch.compile(step, fullgraph=True)

    def step_of(self, mechanism: str):
        import torch

        if mechanism == "compiled":
            return torch.compile(self.torch_step)
        if mechanism == "one-graph":
            return self.one_graph()
        return self.twin() if mechanism == "twin" else self.torch_step


def measure(algo: str, mechanism: str, steps: int) -> dict:
    """Seconds for `steps` gradient steps by `mechanism`, from before its set-up, and the
    largest difference of its parameters from the reference's after ten steps."""
    import torch
    from threadpoolctl import threadpool_limits

    torch.set_num_threads(1)
    threadpool_limits(1, user_api="blas")
    fast, fused = mechanism == "twin", mechanism != "compiled"  # a fused step is opaque
    update = Update(algo, fast, fused)
    began = time.perf_counter()
    step = update.step_of(mechanism)
    first = None
    for i in range(steps):
        step(update.batches[i % 8], diagnostics=i % 4 == 3)  # PPO: each epoch's last
        if i == 3:  # both variants (with diagnostics and without) taken once
            first = time.perf_counter() - began
    total = time.perf_counter() - began

    # ten steps from the same start (the same seed), this mechanism's and the reference's
    reference, update = Update(algo, False, True), Update(algo, fast, fused)
    step = update.step_of(mechanism)
    for i in range(10):
        reference.torch_step(reference.batches[i % 8], diagnostics=i % 4 == 3)
        step(update.batches[i % 8], diagnostics=i % 4 == 3)
    pairs = zip(update.network.parameters(), reference.network.parameters(), strict=True)
    difference = max((p - r).abs().max().item() for p, r in pairs)
    return {
        "algo": algo,
        "mechanism": mechanism,
        "steps": steps,
        "total_s": total,
        "first_four_steps_s": first,
        "max_difference": difference,
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--scale", type=float, default=1.0, help="fraction of each run's steps")
    parser.add_argument("--algo", nargs="+", default=list(STEPS), choices=list(STEPS))
    parser.add_argument("--out", type=Path, help="write the table to OUT.md, the rows to OUT.json")
    parser.add_argument("--one", nargs=2, metavar=("ALGO", "MECHANISM"), help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.one:
        algo, mechanism = args.one
        print(json.dumps(measure(algo, mechanism, max(int(STEPS[algo] * args.scale), 20))))
        return
    rows = []
    for algo in args.algo:
        with tempfile.TemporaryDirectory() as cache:  # cold for the first compiled run
            env = dict(os.environ, TORCHINDUCTOR_CACHE_DIR=cache)
            for mechanism, label in ROWS:
                command = [sys.executable, __file__, "--one", algo, mechanism]
                command += ["--scale", str(args.scale)]
                out = subprocess.run(command, env=env, capture_output=True, text=True, check=True)
                rows.append(json.loads(out.stdout.strip().splitlines()[-1]) | {"label": label})
                print(rows[-1], file=sys.stderr)
    table = [
        "| algorithm | gradient steps | mechanism | total, s | first four steps, s | "
        "per step after, us | x the reference | of the twin's speed | max difference |",
        "|---|---|---|---|---|---|---|---|---|",
    ]
    for row in rows:
        ref = next(r for r in rows if r["algo"] == row["algo"] and r["mechanism"] == "reference")
        twin = next(r for r in rows if r["algo"] == row["algo"] and r["mechanism"] == "twin")
        per_step = (row["total_s"] - row["first_four_steps_s"]) / (row["steps"] - 4) * 1e6
        table.append(
            f"| {row['algo']} | {row['steps']:,} | {row['label']} | {row['total_s']:.1f} | "
            f"{row['first_four_steps_s']:.2f} | {per_step:.0f} | "
            f"x{ref['total_s'] / row['total_s']:.2f} | {twin['total_s'] / row['total_s']:.0%} | "
            f"{row['max_difference']:.1e} |"
        )
    print("\n".join(table))
    if args.out:
        import platform

        import torch

        commit = subprocess.run(
            ["git", "rev-parse", "--short", "HEAD"], capture_output=True, text=True
        ).stdout.strip()
        command = "python scripts/update_mechanisms.py " + " ".join(sys.argv[1:])
        header = (
            f"# The update's mechanisms at the default run lengths\n\n`{command}` at {commit}, "
            f"{time.strftime('%Y-%m-%d')}, {platform.machine()}, {os.cpu_count()} cores, "
            f"torch {torch.__version__}. The script's docstring says what each row is.\n\n"
        )
        args.out.with_suffix(".md").write_text(header + "\n".join(table) + "\n")
        args.out.with_suffix(".json").write_text(json.dumps(rows, indent=1) + "\n")


if __name__ == "__main__":
    main()
