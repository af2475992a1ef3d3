"""Recurrent PPO (rlstore/algos/ppo_lstm.py): replaying the stored sequences recomputes
the collected log-probs and values (ratio 1 before the first gradient step), across
terminations, truncations and rollout boundaries."""

import pytest
import torch

from rlstore.algos import ppo_lstm
from rlstore.algos.ppo_lstm import PPOLSTMConfig

MAX_DEVIATION = []  # (algo setting, largest |ratio - 1|, |value - stored|, minibatches)


@pytest.mark.parametrize("sequence_length", [None, 8])
@pytest.mark.parametrize("env_id", ["CartPoleNoVel-v1", "PendulumNoVel-v1"])
def test_replayed_sequences_give_the_collected_log_probs_and_values(
    env_id, sequence_length, tmp_path, monkeypatch
):
    cfg = PPOLSTMConfig(
        env_id=env_id, total_timesteps=4 * 3 * 32, num_envs=4, num_steps=32, num_minibatches=2,
        update_epochs=2, sequence_length=sequence_length, lstm_hidden_size=16,
        max_episode_steps=13, logdir=str(tmp_path), progress=False, device="cpu",
    )  # fmt: skip
    seen = {"minibatches": 0, "ratio": 0.0, "value": 0.0, "starts": 0, "pseudo": 0}
    real_update = ppo_lstm.update

    def checked_update(agent, optimizer, storage, cfg):
        with torch.no_grad():
            for batch in storage.sequences(cfg.num_minibatches, cfg.sequence_length):
                log_prob, _, value = agent.evaluate_sequences(
                    batch.obs, batch.actions, batch.initial_state, batch.episode_starts
                )
                valid = batch.valid
                ratio = (log_prob[valid] - batch.log_probs[valid]).exp()
                seen["ratio"] = max(seen["ratio"], float((ratio - 1).abs().max()))
                deviation = (value[valid] - batch.values[valid]).abs().max()
                seen["value"] = max(seen["value"], float(deviation))
                seen["minibatches"] += 1
                seen["starts"] += int(batch.episode_starts[1:].sum())
                seen["pseudo"] += int((~valid).sum())
        return real_update(agent, optimizer, storage, cfg)

    monkeypatch.setattr(ppo_lstm, "update", checked_update)
    ppo_lstm.train(cfg)
    MAX_DEVIATION.append((env_id, sequence_length, seen))
    assert seen["minibatches"] == 3 * 2
    assert seen["starts"] > 0 and seen["pseudo"] > 0  # episodes began inside sequences
    assert seen["ratio"] < 1e-5 and seen["value"] < 1e-4, seen


def test_a_loaded_policy_carries_its_state_and_rlstore_eval_plays_it(tmp_path):
    """load_policy gives a stateful policy: its actions over a sequence of observations
    are the network's when its state is carried, reset() starts again; rlstore eval runs."""
    import numpy as np
    from tiny_runs import SETUPS, replace

    import rlstore
    from rlstore.cli import main

    _, cfg = SETUPS["ppo_lstm"]
    result = ppo_lstm.train(replace(cfg, logdir=str(tmp_path), total_timesteps=256))
    policy = rlstore.load_policy(result.run_dir)
    rng = np.random.default_rng(0)
    observations = rng.normal(size=(6, 3, 2)).astype(np.float32)  # 6 steps of 3 envs
    policy.reset()
    carried = [policy(obs) for obs in observations]
    state = result.model.initial_state(3)
    with torch.no_grad():
        for obs, action in zip(observations, carried, strict=True):
            expected, state = result.model.deterministic_action(torch.from_numpy(obs), state)
            assert np.array_equal(action, expected.numpy())
    policy.reset()
    assert np.array_equal(policy(observations[0]), carried[0])
    assert main(["eval", str(result.run_dir), "--episodes", "3"]) == 0
