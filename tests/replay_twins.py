"""Two replay buffers holding the same random transitions, for comparing a numpy gradient
step with the torch one on the same samples (their samplers share a seed)."""

import numpy as np

from rlstore.storage.replay import ReplayBuffer


def twin_buffers(
    obs_dim: int,
    actions: int,
    prioritized: bool,
    seed: int,
    reward_scale: float = 1.0,
    masked: bool = False,
) -> list[ReplayBuffer]:
    """Two 2-env buffers of 150 steps each: Discrete actions, Gaussian observations and
    rewards (times `reward_scale`), about 10% terminations and 5% truncations; `masked`:
    with random action masks, some allowing no action."""
    mask_shape = (actions,) if masked else None
    buffers = [
        ReplayBuffer(
            200, 2, (obs_dim,), prioritized=prioritized, seed=3, action_mask_shape=mask_shape
        )
        for _ in range(2)
    ]
    rng = np.random.default_rng(seed)
    obs = rng.normal(size=(2, obs_dim)).astype(np.float32)
    mask = rng.random((2, actions)) < 0.6
    for _ in range(150):
        next_obs = rng.normal(size=(2, obs_dim)).astype(np.float32)
        next_mask = rng.random((2, actions)) < 0.6
        step = (
            rng.integers(0, actions, 2),
            reward_scale * rng.normal(size=2),
            next_obs,
            rng.random(2) < 0.1,
            rng.random(2) < 0.05,
        )
        both = {"action_mask": mask, "next_action_mask": next_mask} if masked else {}
        for buffer in buffers:
            buffer.add(obs, *step, **both)
        obs, mask = next_obs, next_mask
    return buffers
