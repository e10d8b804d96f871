"""Train a policy on your own environment with A3C workers — no Hydra, no YAML (docs/a3c.md).

python examples/a3c_custom_env.py

Any class with the gymnasium API works: `reset(seed=...) -> (obs, info)`, `step(action) ->
(obs, reward, terminated, truncated, info)`, a Box observation space and a Discrete action
space. Each worker makes its own instance (seeded seed + rank); the orchestrator makes one more
to evaluate the greedy policy, and stops the run once it reaches `stop_at_return`.
"""

import functools

import gymnasium as gym
import numpy as np
import torch

from hogwild import A3CConfig, Trainer, TrainerConfig
from hogwild.models import ActorCritic
from hogwild.workloads.a3c import A3CWorkload


class Corridor(gym.Env):
    """A corridor of 11 cells; the agent starts in the middle and must walk to the end the
    observation points to (+1 there, -0.01 per step). Best return: 1 - 5 x 0.01 = 0.95."""

    def __init__(self, length: int = 11):
        self.length = length
        self.observation_space = gym.spaces.Box(-1.0, 1.0, (2,), np.float32)
        self.action_space = gym.spaces.Discrete(2)  # 0: left, 1: right

    def _obs(self):
        return np.array([2 * self.pos / (self.length - 1) - 1, self.goal], np.float32)

    def reset(self, seed=None, options=None):
        super().reset(seed=seed)
        self.pos, self.steps = self.length // 2, 0
        self.goal = 1.0 if self.np_random.random() < 0.5 else -1.0  # which end pays
        return self._obs(), {}

    def step(self, action):
        self.pos += 1 if action == 1 else -1
        self.steps += 1
        at_end = self.pos in (0, self.length - 1)
        won = at_end and (self.pos == 0) == (self.goal < 0)
        reward = (1.0 if won else 0.0) - 0.01
        return self._obs(), reward, at_end, self.steps >= 50, {}  # truncated after 50 steps


if __name__ == "__main__":  # required: spawn/forkserver workers re-import this file
    workload = A3CWorkload(
        Corridor,  # the factory: any picklable callable that returns an environment
        A3CConfig(max_env_steps=200_000, eval_every_env_steps=4_000, stop_at_return=0.9),
    )
    model = ActorCritic(workload.input_shape, workload.num_actions, hidden_sizes=(32,))
    summary = Trainer(
        model,
        workload,  # optimizer.shared defaults to true for A3C: one Adam state for all workers
        functools.partial(torch.optim.Adam, lr=1e-3),
        TrainerConfig(num_workers=2),
        # no output_dir: a fresh outputs/a3c_custom_env/<date>_<time>/ each time it is run
    ).fit()
    print(
        f"{summary['status']}: solved={summary['solved']} with greedy return "
        f"{summary['eval_return']} after {summary['env_steps']:,} env steps "
        f"({summary['env_steps_per_second']:,.0f}/s)"
    )
