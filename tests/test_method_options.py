"""The new algorithms' options reach what they set: each switched away from its default in
a tiny run, and its effect read back from the trained model, its checkpoint, or a run that
differs from the default one."""

from __future__ import annotations

import pytest
import torch
from tiny_runs import SETUPS, params, replace, same_params

from rlstore.algos._distributional import NoisyLinear
from rlstore.algos.crossq import BatchRenorm
from rlstore.checkpoint import checkpoint_files
from rlstore.files import safe_load


def last_checkpoint(result) -> dict:
    return safe_load(checkpoint_files(result.run_dir / "checkpoints")[0])["algorithm"]


def test_c51_atoms_noise_and_adam_epsilon_reach_the_run(tmp_path):
    module, cfg = SETUPS["c51"]
    cfg = replace(cfg, logdir=str(tmp_path), n_atoms=7, v_min=-3.0, v_max=9.0)
    result = module.train(replace(cfg, noisy=True, adam_eps=1e-3))
    torch.testing.assert_close(result.model.support, torch.linspace(-3.0, 9.0, 7))
    assert any(isinstance(m, NoisyLinear) for m in result.model.modules())
    assert last_checkpoint(result)["optimizer"]["param_groups"][0]["eps"] == 1e-3
    plain = module.train(replace(cfg, logdir=str(tmp_path / "plain")))  # eps 0.01 / batch
    assert last_checkpoint(plain)["optimizer"]["param_groups"][0]["eps"] == 0.01 / cfg.batch_size
    assert not any(isinstance(m, NoisyLinear) for m in plain.model.modules())


@pytest.mark.parametrize(
    "algo, option, value",
    [
        ("pqn", "q_lambda", 0.0),
        ("tqc", "top_quantiles_to_drop_per_net", 0),
        ("qrdqn", "n_quantiles", 4),
        ("crossq", "policy_frequency", 1),
    ],
)
def test_an_option_changes_the_run(algo, option, value, tmp_path):
    """The same seed with the option at another value trains other parameters."""
    module, cfg = SETUPS[algo]
    cfg = replace(cfg, checkpoint_every=0)
    default = module.train(replace(cfg, logdir=str(tmp_path / "a")))
    changed = module.train(replace(cfg, logdir=str(tmp_path / "b"), **{option: value}))
    shapes = [p.shape for p in params(default.model)] == [p.shape for p in params(changed.model)]
    assert not (shapes and same_params(params(default.model), params(changed.model)))


def test_tqc_critics_and_crossq_renorm_options_reach_the_networks(tmp_path):
    module, cfg = SETUPS["tqc"]
    tqc = module.train(replace(cfg, logdir=str(tmp_path / "t"), n_critics=2, n_quantiles=3))
    out = tqc.model.critic(torch.zeros(1, 3), torch.zeros(1, 1))
    assert out.shape == (1, 2, 3)
    module, cfg = SETUPS["crossq"]
    crossq = module.train(
        replace(
            cfg,
            logdir=str(tmp_path / "c"),
            critic_hidden=(8,),
            renorm_momentum=0.5,
            renorm_warmup_steps=7,
            adam_beta1=0.3,
        )
    )
    layers = [m for m in crossq.model.critic.modules() if isinstance(m, BatchRenorm)]
    assert len(layers) == 2 * 2 and {(m.momentum, m.warmup_steps) for m in layers} == {(0.5, 7)}
    assert crossq.model.critic[0][1].out_features == 8
    state = last_checkpoint(crossq)
    assert state["critic_optimizer"]["param_groups"][0]["betas"] == (0.3, 0.999)
