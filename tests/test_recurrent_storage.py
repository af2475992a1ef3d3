"""RecurrentRolloutStorage, the RolloutStorage of recurrent policies: episode starts under
NEXT_STEP autoreset, the state stored at every step, and `sequences`, the minibatches of
whole sequences a recurrent policy replays (docs/reference/storage.md)."""

import numpy as np
import pytest
import torch

from rlstore.storage import RecurrentRolloutStorage, RolloutStorage

T, N, S = 12, 3, 5  # steps, envs, state size


def done_stream(rng: np.random.Generator, steps: int) -> tuple[np.ndarray, np.ndarray]:
    """Terminations and truncations as NEXT_STEP envs give them: never at a pseudo-step."""
    term, trunc = np.zeros((steps, N), bool), np.zeros((steps, N), bool)
    for n in range(N):
        t = 0
        while t < steps:
            if rng.random() < 0.25:
                (term if rng.random() < 0.5 else trunc)[t, n] = True
                t += 1  # the next step is the pseudo-step
            t += 1
    return term, trunc


class ToyRecurrence:
    """A deterministic recurrent 'policy': s' = tanh(s A + obs B), zeroed at episode
    starts; its action, log-prob and value are functions of the state it acts from."""

    def __init__(self, seed: int) -> None:
        g = torch.Generator().manual_seed(seed)
        self.A = torch.randn(S, S, generator=g) * 0.5
        self.B = torch.randn(2, S, generator=g)

    def step(self, state: torch.Tensor, obs: torch.Tensor) -> torch.Tensor:
        return torch.tanh(state @ self.A + obs @ self.B)


def collect(rng, storage: RolloutStorage, policy: ToyRecurrence, state: torch.Tensor, rollouts):
    """Fill and hand back each rollout's storage contents; `state` is carried across."""
    out = []
    for _ in range(rollouts):
        term, trunc = done_stream(rng, T)
        for t in range(T):
            starts = torch.from_numpy(storage.current_episode_starts.copy())
            state = torch.where(starts[:, None], torch.zeros_like(state), state)
            acting = state.clone()
            state = policy.step(state, storage.current_obs)
            storage.insert(
                next_obs=torch.from_numpy(rng.normal(size=(N, 2)).astype(np.float32)),
                action=torch.zeros(N, dtype=torch.int64),
                log_prob=state[:, 0],
                value=state[:, 1],
                reward=torch.ones(N),
                terminated=term[t],
                truncated=trunc[t],
                recurrent_state=acting,
            )
        storage.compute_returns(torch.zeros(N), gamma=0.9, gae_lambda=0.9)
        out.append((term, trunc))
        yield storage, term, trunc
        storage.after_update()
    return out


def test_episode_starts_follow_the_pseudo_steps_across_rollouts():
    """obs[t] begins an episode iff step t - 1 was the pseudo-step after a done (or it is
    the first observation after reset); a naive scan of the done flags says the same."""
    rng = np.random.default_rng(0)
    storage = RecurrentRolloutStorage(T, N, obs_shape=(2,), recurrent_state_shape=(S,))
    storage.reset(np.zeros((N, 2), np.float32))
    policy, state = ToyRecurrence(0), torch.zeros(N, S)
    prev_done, starts_next = np.zeros(N, bool), np.ones(N, bool)
    for _, term, trunc in collect(rng, storage, policy, state, rollouts=4):
        done = term | trunc
        expected = np.zeros((T + 1, N), bool)
        expected[0] = starts_next
        for t in range(T):
            expected[t + 1] = prev_done  # step t is the pseudo-step after a done
            prev_done = done[t]
        assert np.array_equal(storage.episode_starts.numpy(), expected)
        assert np.array_equal(storage.valid.numpy(), ~expected[1:])
        starts_next = expected[T]


def test_sequences_replay_the_recurrence_exactly():
    """From each sequence's initial state, zeroing at its episode starts, the toy policy
    recomputes the state (so the log-prob and value) of every step as collected, for
    whole rollouts and for sequences of 4 and 3 steps."""
    rng = np.random.default_rng(1)
    storage = RecurrentRolloutStorage(T, N, obs_shape=(2,), recurrent_state_shape=(S,))
    storage.reset(np.zeros((N, 2), np.float32))
    policy = ToyRecurrence(1)
    checked = 0
    for filled, _, _ in collect(rng, storage, policy, torch.zeros(N, S), rollouts=3):
        for length in (None, 4, 3):
            seen = []
            for batch in filled.sequences(2, sequence_length=length):
                L, B = batch.valid.shape
                assert (length or T) == L and batch.initial_state.shape == (B, S)
                state = batch.initial_state
                for t in range(L):
                    if t > 0:
                        state = torch.where(batch.episode_starts[t][:, None], 0.0, state)
                    state = policy.step(state, batch.obs[t])
                    assert torch.equal(state[:, 0], batch.log_probs[t])
                    assert torch.equal(state[:, 1], batch.values[t])
                    checked += B
                seen.append(batch.obs)
            # every (step, env) exactly once
            flat = torch.cat([o.reshape(-1, 2) for o in seen])
            assert len(flat) == T * N
            assert len({tuple(r) for r in flat.tolist()}) == len(
                {tuple(r) for r in filled.obs[:T].reshape(-1, 2).tolist()}
            )
    assert checked == 3 * 3 * T * N


def test_sequences_hand_out_the_stored_fields_at_their_steps():
    """A sequence starting at step t0 of env n holds obs, actions, log-probs, values,
    advantages, returns, valid and starts of steps t0 .. t0 + L - 1 of env n, and the state
    stored at t0."""
    rng = np.random.default_rng(2)
    storage = RecurrentRolloutStorage(T, N, obs_shape=(2,), recurrent_state_shape=(S,))
    storage.reset(rng.normal(size=(N, 2)).astype(np.float32))
    storage, _, _ = next(collect(rng, storage, ToyRecurrence(2), torch.zeros(N, S), rollouts=1))
    L = 4
    for batch in storage.sequences(
        5, sequence_length=L, generator=torch.Generator().manual_seed(0)
    ):
        for b in range(batch.valid.shape[1]):
            matches = [
                (t0, n)
                for t0 in range(0, T, L)
                for n in range(N)
                if torch.equal(storage.obs[t0, n], batch.obs[0, b])
            ]
            assert len(matches) == 1  # the observations are random: each is one step's
            t0, n = matches[0]
            steps = slice(t0, t0 + L)
            assert torch.equal(batch.initial_state[b], storage.recurrent_states[t0, n])
            assert torch.equal(batch.obs[:, b], storage.obs[steps, n])
            assert torch.equal(batch.log_probs[:, b], storage.log_probs[steps, n])
            assert torch.equal(batch.values[:, b], storage.values[steps, n])
            assert torch.equal(batch.advantages[:, b], storage.advantages[steps, n])
            assert torch.equal(batch.returns[:, b], storage.returns[steps, n])
            assert torch.equal(batch.valid[:, b], storage.valid[steps, n])
            assert torch.equal(batch.episode_starts[:, b], storage.episode_starts[steps, n])


def test_recurrent_storage_bad_use_is_refused_and_state_round_trips():
    storage = RecurrentRolloutStorage(T, N, obs_shape=(2,), recurrent_state_shape=(S,))
    storage.reset(np.zeros((N, 2), np.float32))
    step = dict(
        next_obs=np.zeros((N, 2), np.float32),
        action=np.zeros(N, np.int64),
        log_prob=np.zeros(N, np.float32),
        value=np.zeros(N, np.float32),
        reward=np.zeros(N, np.float32),
        terminated=np.zeros(N, bool),
        truncated=np.zeros(N, bool),
    )
    with pytest.raises(ValueError, match="recurrent_state must be given"):
        storage.insert(**step)
    with pytest.raises(ValueError, match="recurrent_state has shape"):
        storage.insert(**step, recurrent_state=np.zeros((N, S + 1), np.float32))
    assert storage.step == 0  # nothing written
    # a good state beside a bad input is not written either (docs/reference/storage.md:
    # every input is checked before anything is written), nor a good mask
    masked = RecurrentRolloutStorage(
        T, N, obs_shape=(2,), recurrent_state_shape=(S,), action_mask_shape=(3,)
    )
    masked.reset(np.zeros((N, 2), np.float32), action_mask=np.ones((N, 3), bool))
    before = {k: v.clone() for k, v in masked.state_dict().items() if torch.is_tensor(v)}
    for bad in ({"action": np.zeros(N + 1, np.int64)}, {"next_obs": np.zeros((N, 3))}):
        with pytest.raises(ValueError, match="has shape"):
            masked.insert(
                **(step | bad),
                recurrent_state=np.ones((N, S), np.float32),
                action_mask=np.zeros((N, 3), bool) | [True, False, False],
            )
    after = masked.state_dict()
    assert masked.step == 0 and all(torch.equal(after[k], v) for k, v in before.items())
    with pytest.raises(ValueError, match="recurrent_state must be given"):
        RolloutStorage(T, N, obs_shape=(2,)).insert(**step, recurrent_state=np.zeros((N, S)))
    assert not hasattr(RolloutStorage(T, N, obs_shape=(2,)), "sequences")  # (its own class)
    rng = np.random.default_rng(3)
    storage, _, _ = next(collect(rng, storage, ToyRecurrence(3), torch.zeros(N, S), rollouts=1))
    with pytest.raises(ValueError, match="sequence_length must divide"):
        next(storage.sequences(1, sequence_length=5))
    with pytest.raises(ValueError, match="num_minibatches must lie in"):
        next(storage.sequences(N + 1))
    copy = RecurrentRolloutStorage(T, N, obs_shape=(2,), recurrent_state_shape=(S,))
    copy.load_state_dict(storage.state_dict())
    assert torch.equal(copy.recurrent_states, storage.recurrent_states)
    assert torch.equal(copy.episode_starts, storage.episode_starts)
