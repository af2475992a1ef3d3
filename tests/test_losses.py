"""Loss and schedule math, checked against hand-computed values."""

import math

import pytest
import torch

from rlstore.algos._on_policy import explained_variance
from rlstore.algos._shared import linear_schedule
from rlstore.algos.a2c import A2CConfig, a2c_loss
from rlstore.algos.ppo import PPOConfig, ppo_loss
from rlstore.storage import RolloutBatch


def test_ppo_loss_hand_computed():
    batch = RolloutBatch(
        obs=torch.zeros(2, 1),
        actions=torch.zeros(2),
        log_probs=torch.zeros(2),
        values=torch.tensor([0.0, 2.5]),
        advantages=torch.tensor([1.0, -1.0]),
        returns=torch.tensor([0.5, 3.0]),
    )
    new_log_prob = torch.log(torch.tensor([1.5, 0.5]))  # ratios 1.5 and 0.5
    cfg = PPOConfig(norm_adv=False, clip_coef=0.2, ent_coef=0.01, vf_coef=0.5)
    out = ppo_loss(new_log_prob, torch.tensor([1.0, 2.0]), torch.tensor([0.6, 0.4]), batch, cfg)
    # policy: mean(max(-1 * 1.5, -1 * 1.2), max(1 * 0.5, 1 * 0.8)) = mean(-1.2, 0.8)
    assert out["losses/policy_loss"].item() == pytest.approx(-0.2)
    # value: max(0.25, (0.2 - 0.5)^2) = 0.25 and max(1, (2.3 - 3)^2) = 1 -> 0.5 * mean
    assert out["losses/value_loss"].item() == pytest.approx(0.3125)
    assert out["loss"].item() == pytest.approx(-0.2 - 0.01 * 0.5 + 0.5 * 0.3125)
    assert out["losses/clipfrac"].item() == 1.0
    kl = ((0.5 - math.log(1.5)) + (-0.5 - math.log(0.5))) / 2
    assert out["losses/approx_kl"].item() == pytest.approx(kl)
    unclipped = ppo_loss(
        new_log_prob,
        torch.tensor([1.0, 2.0]),
        torch.tensor([0.6, 0.4]),
        batch,
        PPOConfig(norm_adv=False, clip_vloss=False),
    )
    assert unclipped["losses/value_loss"].item() == pytest.approx(0.5 * (0.25 + 1.0) / 2)


def test_a2c_loss_hand_computed():
    cfg = A2CConfig(ent_coef=0.01, vf_coef=0.5)
    out = a2c_loss(
        log_prob=torch.tensor([-0.5, -1.0]),
        advantages=torch.tensor([1.0, -1.0]),
        value=torch.tensor([0.0, 2.0]),
        returns=torch.tensor([1.0, 2.0]),
        entropy=torch.tensor([0.6, 0.4]),
        cfg=cfg,
    )
    assert out["losses/policy_loss"].item() == pytest.approx(-0.25)
    assert out["losses/value_loss"].item() == pytest.approx(0.5)
    assert out["loss"].item() == pytest.approx(-0.25 - 0.005 + 0.25)


def test_linear_schedule_and_explained_variance():
    assert linear_schedule(2.5e-4, 0.0, 100, 0) == 2.5e-4
    assert linear_schedule(2.5e-4, 0.0, 100, 50) == pytest.approx(1.25e-4)
    assert linear_schedule(1.0, 0.05, 10, 25) == 0.05
    target = torch.tensor([1.0, 2.0, 3.0, 4.0])
    assert explained_variance(target, target).item() == 1.0
    assert explained_variance(torch.full((4,), 2.5), target).item() == pytest.approx(0.0)
    assert math.isnan(explained_variance(target, torch.ones(4)).item())
