"""Recurrent PPO (rlstore/algos/ppo_lstm.py): replaying the stored sequences recomputes
the collected log-probs and values (ratio 1 before the first gradient step), across
terminations, truncations and rollout boundaries."""

import pytest
import torch
from extras import needs

from rlstore.algos import ppo_lstm
from rlstore.algos.ppo_lstm import PPOLSTMConfig

MAX_DEVIATION = []  # (algo setting, largest |ratio - 1|, |value - stored|, minibatches)


def replay_deviation(cfg, monkeypatch, preset=None) -> dict:
    """Train `cfg`, recomputing each update's minibatch sequences before its first gradient
    step: the largest |ratio - 1| and |value - stored value| over the valid steps, the
    minibatches checked, and the episode starts and pseudo-steps inside them."""
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
    ppo_lstm.train(cfg, preset)
    return seen


@pytest.mark.parametrize("sequence_length", [None, 8])
@pytest.mark.parametrize("env_id", ["CartPoleNoVel-v1", "PendulumNoVel-v1"])
def test_replayed_sequences_give_the_collected_log_probs_and_values(
    env_id, sequence_length, tmp_path, monkeypatch
):
    cfg = PPOLSTMConfig(
        env_id=env_id,
        total_timesteps=4 * 3 * 32,
        num_envs=4,
        num_steps=32,
        num_minibatches=2,
        update_epochs=2,
        sequence_length=sequence_length,
        lstm_hidden_size=16,
        max_episode_steps=13,
        logdir=str(tmp_path),
        progress=False,
        device="cpu",
    )
    seen = replay_deviation(cfg, monkeypatch)
    MAX_DEVIATION.append((env_id, sequence_length, seen))
    assert seen["minibatches"] == 3 * 2
    assert seen["starts"] > 0 and seen["pseudo"] > 0  # episodes began inside sequences
    assert seen["ratio"] < 1e-5 and seen["value"] < 1e-4, seen


@needs("atari", "ale_py")
def test_the_atari_lstm_replays_its_sequences_too(tmp_path, monkeypatch):
    """The Nature CNN + shared LSTM (configs/ppo_lstm/atari.toml, smaller) on Breakout with
    13-step episodes: the same oracle; model.pt rebuilds the CNN LSTM."""
    import rlstore
    from rlstore.presets import resolve
    from rlstore.recurrent_networks import CnnRecurrentActorCritic

    cfg, preset = resolve(
        "ppo_lstm",
        "ALE/Breakout-v5",
        dict(
            total_timesteps=3 * 2 * 32,
            num_envs=2,
            num_steps=32,
            num_minibatches=2,
            update_epochs=1,
            lstm_hidden_size=16,
            max_episode_steps=13,
            logdir=str(tmp_path),
            progress=False,
            device="cpu",
            checkpoint_every=0,
        ),
    )
    assert cfg.sign_rewards and cfg.clip_coef == 0.1  # the Atari preset
    seen = replay_deviation(cfg, monkeypatch, preset)
    assert seen["minibatches"] == 3 * 2 and seen["starts"] > 0 and seen["pseudo"] > 0
    assert seen["ratio"] < 1e-5 and seen["value"] < 1e-4, seen
    policy = rlstore.load_policy(next(tmp_path.glob("*/model.pt")))
    assert isinstance(policy.network, CnnRecurrentActorCritic)


def test_the_cnn_lstm_replays_a_sequence_as_it_was_stepped():
    """CnnRecurrentActorCritic: evaluate_sequences over frames with episode starts inside
    gives the log-probs and values of stepping one frame at a time, the state zeroed at
    each start (a naive loop)."""
    from rlstore.recurrent_networks import CnnRecurrentActorCritic

    torch.manual_seed(0)
    net = CnnRecurrentActorCritic((4, 84, 84), action_dim=4, lstm_hidden=16)
    L, B = 7, 3
    obs = torch.randint(0, 256, (L, B, 4, 84, 84), dtype=torch.uint8)
    actions = torch.randint(0, 4, (L, B))
    starts = torch.zeros(L, B, dtype=torch.bool)
    starts[2, 0] = starts[5, 1] = starts[5, 2] = True
    state0 = torch.randn(B, 2, 16)
    with torch.no_grad():
        log_prob, _, value = net.evaluate_sequences(obs, actions, state0, starts)
        state = state0
        for t in range(L):
            state = state * (~starts[t]).float()[:, None, None] if t > 0 else state
            logits = net.actor(net._step(obs[t], state)[0])
            expected = logits.log_softmax(-1).gather(-1, actions[t][:, None])[:, 0]
            assert torch.allclose(log_prob[t], expected, atol=1e-5)
            assert torch.allclose(value[t], net.value(obs[t], state), atol=1e-5)
            state = net._step(obs[t], state)[2]


def test_a_loaded_policy_carries_its_state_and_rlstore_eval_plays_it(tmp_path):
    """load_policy gives a stateful policy: its actions over a sequence of observations
    are the network's when its state is carried, reset(rows) zeroes those rows' state,
    reset() starts again; rlstore eval runs."""
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
    policy.reset(np.array([False, True, False]))  # row 1 begins an episode, 0 and 2 go on
    with torch.no_grad():
        obs = torch.from_numpy(observations[0])
        zeroed = state * torch.tensor([1.0, 0.0, 1.0])[:, None, None]
        expected = result.model.value(obs, zeroed).numpy()
        assert not np.allclose(expected, result.model.value(obs, state).numpy())
    assert np.array_equal(policy.value(observations[0]), expected)
    policy.reset()
    assert np.array_equal(policy(observations[0]), carried[0])
    assert main(["eval", str(result.run_dir), "--episodes", "3"]) == 0


@needs("video", "moviepy", "pygame")
def test_eval_with_video_plays_the_same_episodes(tmp_path):
    """rlstore eval --video plays episode 0 alone on a rendering env, the others side by
    side: the recurrent state of each gives the returns of a plain eval, episode by episode."""
    from tiny_runs import SETUPS, replace

    from rlstore.evaluate import evaluate

    _, cfg = SETUPS["ppo_lstm"]
    result = ppo_lstm.train(replace(cfg, logdir=str(tmp_path), total_timesteps=512))
    plain = evaluate(result.run_dir, episodes=3)
    filmed = evaluate(result.run_dir, episodes=3, video=True)
    assert filmed["returns"] == plain["returns"] and filmed["lengths"] == plain["lengths"]
    assert len(list((result.run_dir / "videos").glob("*.mp4"))) == 1
