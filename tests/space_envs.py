"""Small envs of the observation spaces beyond Box vectors, for the tests: each registers
itself on import (use the id as "space_envs:Id-v0"), is learnable in a few thousand steps,
and ends its episodes by a time limit (a truncation)."""

import gymnasium as gym
import numpy as np
from gymnasium import spaces


class ColorImage(gym.Env):
    """A 7x7x3 uint8 image lit in one random channel; reward 1 for naming that channel."""

    observation_space = spaces.Box(0, 255, (7, 7, 3), np.uint8)
    action_space = spaces.Discrete(3)

    def _observe(self):
        self.channel = int(self.np_random.integers(3))
        image = np.zeros((7, 7, 3), np.uint8)
        image[..., self.channel] = 255
        return image

    def reset(self, *, seed=None, options=None):
        super().reset(seed=seed)
        return self._observe(), {}

    def step(self, action):
        reward = float(int(action) == self.channel)
        return self._observe(), reward, False, False, {}


class BitParity(gym.Env):
    """MultiBinary(4) observations; reward 1 for the parity of the bits."""

    observation_space = spaces.MultiBinary(4)
    action_space = spaces.Discrete(2)

    def _observe(self):
        self.bits = self.np_random.integers(0, 2, 4).astype(np.int8)
        return self.bits

    def reset(self, *, seed=None, options=None):
        super().reset(seed=seed)
        return self._observe(), {}

    def step(self, action):
        reward = float(int(action) == int(self.bits.sum()) % 2)
        return self._observe(), reward, False, False, {}


class DiscreteTarget(gym.Env):
    """Discrete(5) states and a continuous action: reward -(a - (s - 2) / 2)^2."""

    observation_space = spaces.Discrete(5)
    action_space = spaces.Box(-1, 1, (1,), np.float32)

    def _observe(self):
        self.state = int(self.np_random.integers(5))
        return self.state

    def reset(self, *, seed=None, options=None):
        super().reset(seed=seed)
        return self._observe(), {}

    def step(self, action):
        reward = -float((action[0] - (self.state - 2) / 2) ** 2)
        return self._observe(), reward, False, False, {}


class PickTwo(gym.Env):
    """Discrete(3) states; MultiDiscrete actions [3 from 1, 2]: one point for the first
    entry at state + 1, one for the second at the state's parity."""

    observation_space = spaces.Discrete(3)
    action_space = spaces.MultiDiscrete([3, 2], start=[1, 0])

    def _observe(self):
        self.state = int(self.np_random.integers(3))
        return self.state

    def reset(self, *, seed=None, options=None):
        super().reset(seed=seed)
        return self._observe(), {}

    def step(self, action):
        if not self.action_space.contains(np.asarray(action, dtype=np.int64)):
            raise ValueError(f"PickTwo takes MultiDiscrete([3, 2], start=[1, 0]), got {action}")
        reward = float(action[0] == self.state + 1) + float(action[1] == self.state % 2)
        return self._observe(), reward, False, False, {}


class CopyBits(gym.Env):
    """MultiBinary(3) observations and actions: one point per bit copied."""

    observation_space = spaces.MultiBinary(3)
    action_space = spaces.MultiBinary(3)

    def _observe(self):
        self.bits = self.np_random.integers(0, 2, 3).astype(np.int8)
        return self.bits

    def reset(self, *, seed=None, options=None):
        super().reset(seed=seed)
        return self._observe(), {}

    def step(self, action):
        reward = float((np.asarray(action) == self.bits).sum())
        return self._observe(), reward, False, False, {}


class DictTarget(gym.Env):
    """Dict observations, an image and a Discrete part: a 6x6x3 uint8 image lit in one
    channel c, and an offset k in {0, 1}; reward 1 for action (c + k) % 3, which needs both
    parts."""

    observation_space = spaces.Dict(
        {"image": spaces.Box(0, 255, (6, 6, 3), np.uint8), "offset": spaces.Discrete(2)}
    )
    action_space = spaces.Discrete(3)

    def _observe(self):
        self.channel, self.offset = (int(x) for x in self.np_random.integers(0, (3, 2)))
        image = np.zeros((6, 6, 3), np.uint8)
        image[..., self.channel] = 255
        return {"image": image, "offset": self.offset}

    def reset(self, *, seed=None, options=None):
        super().reset(seed=seed)
        return self._observe(), {}

    def step(self, action):
        reward = float(int(action) == (self.channel + self.offset) % 3)
        return self._observe(), reward, False, False, {}


class TupleCount(gym.Env):
    """Tuple observations (Discrete(3), MultiBinary(2)): reward 1 for action
    (d + the number of bits set) % 3."""

    observation_space = spaces.Tuple((spaces.Discrete(3), spaces.MultiBinary(2)))
    action_space = spaces.Discrete(3)

    def _observe(self):
        self.state = int(self.np_random.integers(3))
        self.bits = self.np_random.integers(0, 2, 2).astype(np.int8)
        return (self.state, self.bits)

    def reset(self, *, seed=None, options=None):
        super().reset(seed=seed)
        return self._observe(), {}

    def step(self, action):
        reward = float(int(action) == (self.state + int(self.bits.sum())) % 3)
        return self._observe(), reward, False, False, {}


class DictScale(gym.Env):
    """Dict observations of a Discrete(5) state and a float scale in [0.5, 1], a continuous
    action: reward -(a - scale * (s - 2) / 2)^2."""

    observation_space = spaces.Dict(
        {"state": spaces.Discrete(5), "scale": spaces.Box(0.5, 1.0, (1,), np.float32)}
    )
    action_space = spaces.Box(-1, 1, (1,), np.float32)

    def _observe(self):
        self.state = int(self.np_random.integers(5))
        self.scale = self.np_random.uniform(0.5, 1.0, 1).astype(np.float32)
        return {"state": self.state, "scale": self.scale}

    def reset(self, *, seed=None, options=None):
        super().reset(seed=seed)
        return self._observe(), {}

    def step(self, action):
        reward = -float((action[0] - self.scale[0] * (self.state - 2) / 2) ** 2)
        return self._observe(), reward, False, False, {}


class Mission(gym.Env):
    """MiniGrid's shape: a Dict with a text `mission`, which rlstore cannot encode, beside
    a Discrete(3) state; reward 1 for naming the state."""

    observation_space = spaces.Dict({"mission": spaces.Text(12), "state": spaces.Discrete(3)})
    action_space = spaces.Discrete(3)

    def _observe(self):
        self.state = int(self.np_random.integers(3))
        return {"mission": "namethestate", "state": self.state}

    def reset(self, *, seed=None, options=None):
        super().reset(seed=seed)
        return self._observe(), {}

    def step(self, action):
        reward = float(int(action) == self.state)
        return self._observe(), reward, False, False, {}


class MaskedPick(gym.Env):
    """Discrete(4) states and actions; reward 1 for naming the state. info["action_mask"]
    (Gymnasium's convention) forbids one random action other than the state's; the env
    raises if a forbidden action is taken."""

    observation_space = spaces.Discrete(4)
    action_space = spaces.Discrete(4)

    def _observe(self):
        self.state = int(self.np_random.integers(4))
        forbidden = (self.state + 1 + int(self.np_random.integers(3))) % 4
        self.mask = np.ones(4, np.int8)
        self.mask[forbidden] = 0
        return self.state, {"action_mask": self.mask.copy()}

    def reset(self, *, seed=None, options=None):
        super().reset(seed=seed)
        return self._observe()

    def step(self, action):
        if not self.mask[int(action)]:
            raise ValueError(f"MaskedPick: action {action} is masked ({self.mask})")
        reward = float(int(action) == self.state)
        obs, info = self._observe()
        return obs, reward, False, False, info


class MaskedPair(gym.Env):
    """Dict observations {state: Discrete(3), bits: MultiBinary(2)}, MultiDiscrete([3, 2])
    actions; one point for a[0] == state and one for a[1] == bits[0]. `action_masks()`
    (sb3-contrib's convention) forbids, for a[0], one random value other than the state;
    the env raises if a forbidden value is taken."""

    observation_space = spaces.Dict({"state": spaces.Discrete(3), "bits": spaces.MultiBinary(2)})
    action_space = spaces.MultiDiscrete([3, 2])

    def _observe(self):
        self.state = int(self.np_random.integers(3))
        self.bits = self.np_random.integers(0, 2, 2).astype(np.int8)
        self.forbidden = (self.state + 1 + int(self.np_random.integers(2))) % 3
        return {"state": self.state, "bits": self.bits.copy()}

    def action_masks(self):
        first = [value != self.forbidden for value in range(3)]
        return np.array([*first, True, True])

    def reset(self, *, seed=None, options=None):
        super().reset(seed=seed)
        return self._observe(), {}

    def step(self, action):
        if int(action[0]) == self.forbidden:
            raise ValueError(f"MaskedPair: a[0] = {action[0]} is masked")
        reward = float(int(action[0]) == self.state) + float(int(action[1]) == self.bits[0])
        return self._observe(), reward, False, False, {}


class BoxGrid(gym.Env):
    """A 2x2 Box action: reward -mean((a - target)^2), the target +-0.5 by the sign of the
    observation's entries, [[x0, x1], [-x0, -x1]]; the env raises on an action of another
    shape."""

    observation_space = spaces.Box(-1, 1, (2,), np.float32)
    action_space = spaces.Box(-1, 1, (2, 2), np.float32)

    def _observe(self):
        self.obs = self.np_random.choice([-1.0, 1.0], 2).astype(np.float32)
        return self.obs

    def reset(self, *, seed=None, options=None):
        super().reset(seed=seed)
        return self._observe(), {}

    def step(self, action):
        if np.shape(action) != (2, 2):
            raise ValueError(f"BoxGrid takes (2, 2) actions, got {np.shape(action)}")
        target = 0.5 * np.stack([self.obs, -self.obs])
        reward = -float(np.mean((np.asarray(action) - target) ** 2))
        return self._observe(), reward, False, False, {}


class BadMask(gym.Env):
    """Gives an action mask of 2 entries for its 3 actions (a user's mistake)."""

    observation_space = spaces.Discrete(2)
    action_space = spaces.Discrete(3)

    def reset(self, *, seed=None, options=None):
        super().reset(seed=seed)
        return 0, {"action_mask": np.ones(2, np.int8)}

    def step(self, action):
        return 0, 0.0, False, False, {"action_mask": np.ones(2, np.int8)}


class MethodMaskedBox(gym.Env):
    """MaskedPick's task with a one-hot Box observation (the lean sync vector env's kind)
    and its masks from `action_masks()` (sb3-contrib's convention); raises on a masked
    action."""

    observation_space = spaces.Box(0, 1, (4,), np.float32)
    action_space = spaces.Discrete(4)

    def _observe(self):
        self.state = int(self.np_random.integers(4))
        self.forbidden = (self.state + 1 + int(self.np_random.integers(3))) % 4
        return np.eye(4, dtype=np.float32)[self.state]

    def action_masks(self):
        return np.arange(4) != self.forbidden

    def reset(self, *, seed=None, options=None):
        super().reset(seed=seed)
        return self._observe(), {}

    def step(self, action):
        if int(action) == self.forbidden:
            raise ValueError(f"MethodMaskedBox: action {action} is masked")
        reward = float(int(action) == self.state)
        return self._observe(), reward, False, False, {}


class StartedActions(gym.Env):
    """Discrete(3, start=5) actions: reward 1 for action 5 + state (a Discrete(3)
    observation); raises on an action outside its space."""

    observation_space = spaces.Discrete(3)
    action_space = spaces.Discrete(3, start=5)

    def reset(self, *, seed=None, options=None):
        super().reset(seed=seed)
        self.state = int(self.np_random.integers(3))
        return self.state, {}

    def step(self, action):
        if not self.action_space.contains(int(action)):
            raise ValueError(f"StartedActions: action {action} is not in {self.action_space}")
        reward = float(int(action) == 5 + self.state)
        self.state = int(self.np_random.integers(3))
        return self.state, reward, False, False, {}


class DeadEnd(gym.Env):
    """info["action_mask"]: actions 0 and 1 of 3 allowed, none at the termination after 3
    steps (allowed at an episode's end); reward 1 for action 1."""

    observation_space = spaces.Box(0, 1, (1,), np.float32)
    action_space = spaces.Discrete(3)

    def reset(self, *, seed=None, options=None):
        super().reset(seed=seed)
        self.t = 0
        return np.zeros(1, np.float32), {"action_mask": np.array([1, 1, 0], np.int8)}

    def step(self, action):
        if int(action) == 2:
            raise ValueError("DeadEnd: action 2 is masked")
        self.t += 1
        done = self.t == 3
        mask = np.array([0, 0, 0] if done else [1, 1, 0], np.int8)
        obs = np.full(1, self.t / 3, np.float32)
        return obs, float(int(action) == 1), done, False, {"action_mask": mask}


class Endless(gym.Env):
    """Never ends, and is registered with no time limit (as 2048 is)."""

    observation_space = spaces.Box(0, 1, (1,), np.float32)
    action_space = spaces.Discrete(2)

    def reset(self, *, seed=None, options=None):
        super().reset(seed=seed)
        return np.zeros(1, np.float32), {}

    def step(self, action):
        return np.zeros(1, np.float32), 1.0, False, False, {}


class Broken(gym.Env):
    """Box(3,) float32 observations, Discrete(2) actions, reward 1, 20 steps an episode;
    from its `at`-th step on (counted over its episodes) it returns what `mode` says:
    "nan_obs", "inf_reward", "shape" (4 entries), "float64", "list", "huge_reward" (1e30:
    finite, but a value loss overflows)."""

    observation_space = spaces.Box(-1, 1, (3,), np.float32)
    action_space = spaces.Discrete(2)

    def __init__(self, mode="nan_obs", at=10):
        self.mode, self.at, self.t, self.steps = mode, at, 0, 0

    def _observe(self):
        obs = np.zeros(3, np.float32)
        if self.steps < self.at:
            return obs
        if self.mode == "nan_obs":
            obs[1] = np.nan
        return {
            "shape": np.zeros(4, np.float32),
            "float64": obs.astype(np.float64),
            "list": obs.tolist(),
        }.get(self.mode, obs)

    def reset(self, *, seed=None, options=None):
        super().reset(seed=seed)
        self.t = 0
        return self._observe(), {}

    def step(self, action):
        self.t, self.steps = self.t + 1, self.steps + 1
        late = self.steps >= self.at
        reward = {"inf_reward": np.inf, "huge_reward": 1e30}.get(self.mode, 1.0) if late else 1.0
        return self._observe(), reward, False, self.t == 20, {}


if "Broken-v0" not in gym.registry:
    gym.register("Broken-v0", entry_point=Broken)


class Unseeded(Endless):
    """Endless, but its reset ignores the seed (Gymnasium's checker says so; it trains)."""

    def reset(self, *, seed=None, options=None):
        super().reset(seed=seed)
        return np.random.random(1).astype(np.float32), {}


if "Unseeded-v0" not in gym.registry:
    gym.register("Unseeded-v0", entry_point=Unseeded, max_episode_steps=5)

if "Endless-v0" not in gym.registry:
    gym.register("Endless-v0", entry_point=Endless)

for _cls, _steps in (
    (MethodMaskedBox, 5),
    (StartedActions, 5),
    (DeadEnd, 5),
    (ColorImage, 5),
    (BitParity, 5),
    (DiscreteTarget, 10),
    (PickTwo, 5),
    (CopyBits, 5),
    (DictTarget, 5),
    (TupleCount, 5),
    (DictScale, 10),
    (Mission, 5),
    (MaskedPick, 5),
    (MaskedPair, 5),
    (BoxGrid, 5),
    (BadMask, 5),
):
    if f"{_cls.__name__}-v0" not in gym.registry:
        gym.register(f"{_cls.__name__}-v0", entry_point=_cls, max_episode_steps=_steps)


def make_bit_parity(**kwargs):
    """An env made by a function, as rlstore.train(algo, env=make_bit_parity) takes it."""
    return gym.wrappers.TimeLimit(BitParity(**kwargs), max_episode_steps=5)


def make_masked_pick():
    """MaskedPick-v0 made by a function (rlstore eval --env space_envs:make_masked_pick)."""
    return gym.wrappers.TimeLimit(MaskedPick(), max_episode_steps=5)


def reward_per_step(env):
    """A wrapper as --wrapper takes it: reward 1 at every step, whatever the env's."""
    return gym.wrappers.TransformReward(env, lambda _: 1.0)


def not_a_wrapper(env):
    return "not an env"


class GoalPoint(gym.Env):
    """A goal-conditioned env in Gymnasium-Robotics' convention, for hindsight replay: a
    point in the plane moved by Box actions towards a goal; reward -1 until it is within
    0.2 of the goal, 0 there (compute_reward on arrays); info["is_success"]."""

    observation_space = spaces.Dict(
        {
            key: spaces.Box(-2, 2, (2,), np.float64)
            for key in ("observation", "achieved_goal", "desired_goal")
        }
    )
    action_space = spaces.Box(-1, 1, (2,), np.float32)

    def _observe(self):
        return {
            "observation": self.point.copy(),
            "achieved_goal": self.point.copy(),
            "desired_goal": self.goal.copy(),
        }

    def reset(self, *, seed=None, options=None):
        super().reset(seed=seed)
        self.point, self.goal = self.np_random.uniform(-1, 1, (2, 2))
        return self._observe(), {}

    def step(self, action):
        self.point = np.clip(self.point + 0.3 * np.asarray(action, np.float64), -2, 2)
        reward = float(self.compute_reward(self.point, self.goal, {}))
        return self._observe(), reward, False, False, {"is_success": reward == 0.0}

    @staticmethod
    def compute_reward(achieved_goal, desired_goal, info):
        return -(np.linalg.norm(achieved_goal - desired_goal, axis=-1) > 0.2).astype(np.float64)


class GoalWithoutReward(GoalPoint):
    """Goal Dict observations, but no compute_reward: HER cannot relabel it."""

    compute_reward = None

    def step(self, action):
        self.point = np.clip(self.point + 0.3 * np.asarray(action, np.float64), -2, 2)
        return self._observe(), 0.0, False, False, {}


for _cls, _steps in ((GoalPoint, 10), (GoalWithoutReward, 10)):
    if f"{_cls.__name__}-v0" not in gym.registry:
        gym.register(f"{_cls.__name__}-v0", entry_point=_cls, max_episode_steps=_steps)


class GoalScalarReward(GoalPoint):
    """compute_reward for one goal only (a float): HER cannot call it on a batch."""

    @staticmethod
    def compute_reward(achieved_goal, desired_goal, info):
        return -float(np.linalg.norm(achieved_goal - desired_goal) > 0.2)


if "GoalScalarReward-v0" not in gym.registry:
    gym.register("GoalScalarReward-v0", entry_point=GoalScalarReward, max_episode_steps=10)


class Frames(gym.Env):
    """Atari's observation: a stack of four 84x84 uint8 frames, channel first (the Nature
    CNN's input), random; reward 1 for naming the brightest frame."""

    observation_space = spaces.Box(0, 255, (4, 84, 84), np.uint8)
    action_space = spaces.Discrete(4)

    def _observe(self):
        self.frames = self.np_random.integers(0, 256, (4, 84, 84), dtype=np.uint8)
        return self.frames

    def reset(self, *, seed=None, options=None):
        super().reset(seed=seed)
        return self._observe(), {}

    def step(self, action):
        reward = float(int(action) == int(self.frames.mean(axis=(1, 2)).argmax()))
        return self._observe(), reward, False, False, {}


if "Frames-v0" not in gym.registry:
    gym.register("Frames-v0", entry_point=Frames, max_episode_steps=5)


class ShiftedParts(gym.Env):
    """Dict observations of integer parts that do not start at 0, {"state": Discrete(3,
    start=-1), "pair": MultiDiscrete([2, 3], start=[1, -1])}: reward 1 for action
    (state + pair[1]) % 2."""

    observation_space = spaces.Dict(
        {
            "state": spaces.Discrete(3, start=-1),
            "pair": spaces.MultiDiscrete([2, 3], start=[1, -1]),
        }
    )
    action_space = spaces.Discrete(2)

    def _observe(self):
        self.obs = self.observation_space.sample()
        return self.obs

    def reset(self, *, seed=None, options=None):
        super().reset(seed=seed)
        self.observation_space.seed(int(self.np_random.integers(2**31)))
        return self._observe(), {}

    def step(self, action):
        reward = float(int(action) == (int(self.obs["state"]) + int(self.obs["pair"][1])) % 2)
        return self._observe(), reward, False, False, {}


if "ShiftedParts-v0" not in gym.registry:
    gym.register("ShiftedParts-v0", entry_point=ShiftedParts, max_episode_steps=5)
