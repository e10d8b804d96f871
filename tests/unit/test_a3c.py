"""A3C's rules, in this process: returns and advantages (truncation bootstraps, termination does
not), the rollout's bookkeeping, gradients cleared before every update, the shared optimizer's
step counter, the evaluator that solves a task, and the config that composes an RL run."""

from __future__ import annotations

import functools
import sys

import gymnasium
import numpy as np
import pytest
import torch

from hogwild.config.schema import A3CConfig, ScheduleConfig
from hogwild.errors import ConfigError
from hogwild.models import ActorCritic
from hogwild.optim import shared_state
from hogwild.protocol import Control, Scalars, WorkerSpec
from hogwild.run.summary import result_rows
from hogwild.worker.main import WorkerContext
from hogwild.workloads import envs
from hogwild.workloads.a3c import A3CTask, A3CWorkload, Episodes, PolicyEvaluator

from support import run_config

CARTPOLE = functools.partial(envs.gym_env, "CartPole-v1")

# ---- returns and advantages ----


def test_lambda_one_gives_the_n_step_returns_bootstrapped_at_the_end():
    rewards, values = [1.0, 1.0, 1.0], [0.5, 0.4, 0.3]
    next_values = [0.4, 0.3, 2.0]  # the last one: the value the rollout is cut at
    targets, advantages = envs.returns_and_advantages(
        rewards, values, next_values, [False] * 3, gamma=0.9, lam=1.0
    )
    expected = [1 + 0.9 + 0.81 + 0.729 * 2.0, 1 + 0.9 + 0.81 * 2.0, 1 + 0.9 * 2.0]
    assert targets == pytest.approx(expected)
    assert advantages == pytest.approx([t - v for t, v in zip(expected, values)])


def test_a_terminated_episode_is_not_bootstrapped_and_a_truncated_one_is():
    """Step 1 ends an episode. Terminated: its next value is 0 (the caller masks it) and nothing
    flows back from step 2. Truncated: the value of its final observation counts."""
    rewards, values = [1.0, 1.0, 1.0], [0.0, 0.0, 0.0]
    terminated, _ = envs.returns_and_advantages(
        rewards, values, [0.0, 0.0, 5.0], [False, True, False], gamma=0.5, lam=1.0
    )
    truncated, _ = envs.returns_and_advantages(
        rewards, values, [0.0, 4.0, 5.0], [False, True, False], gamma=0.5, lam=1.0
    )
    assert terminated == pytest.approx([1.5, 1.0, 3.5])
    assert truncated == pytest.approx([1 + 0.5 * 3.0, 1 + 0.5 * 4.0, 3.5])


def test_gae_weighs_later_td_errors_by_gamma_lambda():
    _, advantages = envs.returns_and_advantages(
        [1.0, 0.0], [0.0, 0.0], [0.0, 0.0], [False, False], gamma=1.0, lam=0.5
    )
    assert advantages == pytest.approx([1.0, 0.0])
    _, advantages = envs.returns_and_advantages(
        [0.0, 1.0], [0.0, 0.0], [0.0, 0.0], [False, False], gamma=1.0, lam=0.5
    )
    assert advantages == pytest.approx([0.5, 1.0])


def test_actions_are_drawn_with_the_policys_probabilities():
    rng, logits = np.random.default_rng(0), torch.log(torch.tensor([0.2, 0.5, 0.3]))
    counts = np.bincount([envs.sample(logits, rng) for _ in range(20_000)], minlength=3)
    assert counts / counts.sum() == pytest.approx([0.2, 0.5, 0.3], abs=0.015)


# ---- the rollout ----


class Countdown(gymnasium.Env):
    """Episodes of exactly 3 steps, observation = steps left; terminated or truncated at the end."""

    observation_space = gymnasium.spaces.Box(0, 3, (1,), np.float32)
    action_space = gymnasium.spaces.Discrete(2)

    def __init__(self, truncate: bool = False, reward: float = 1.0):
        self.truncate, self.reward = truncate, reward

    def reset(self, seed=None, options=None):
        self.left = 3
        return np.array([self.left], np.float32), {}

    def step(self, action):
        self.left -= 1
        end = self.left == 0
        obs = np.array([self.left], np.float32)
        return obs, self.reward, end and not self.truncate, end and self.truncate, {}


def test_a_rollout_keeps_the_final_observation_of_an_episode_and_goes_on_after_the_reset():
    task, env, episodes = A3CTask(Countdown, A3CConfig(rollout_steps=5)), Countdown(), Episodes()
    obs, _ = env.reset()
    rollout, obs = task.collect(ActorCritic([1], 2), env, obs, episodes, np.random.default_rng(0))
    assert rollout.obs[:, 0].tolist() == [3, 2, 1, 3, 2]
    assert rollout.next_obs[:, 0].tolist() == [2, 1, 0, 2, 1]  # 0: the final one, not the reset
    assert rollout.terminated == rollout.ends == [False, False, True, False, False]
    assert obs[0] == 1 and episodes.drain() == {"episode_return": 3.0, "episode_length": 3.0}


def spec(lr: float = 0.0, log_every: int = 1000):
    return WorkerSpec(
        num_workers=1, seed=0, threads=1, sharing_strategy="file_system", device="cpu",
        log_every_n_steps=log_every, optimizer_factory=functools.partial(torch.optim.SGD, lr=lr),
        skip_nonfinite=False, schedule=ScheduleConfig(), total_units=10_000, orchestrator_pid=0,
        task=None,
    )  # fmt: skip


class Pipe:
    def __init__(self):
        self.sent = []

    def send(self, message):
        self.sent.append(message)


def test_each_update_starts_from_cleared_gradients():
    """Three updates of the same rollout with lr=0 see the same gradients: nothing accumulates
    (torch >= 2.0's zero_grad sets grads to None; code that never clears the local ones grows
    them forever). begin() leaves no gradient behind at all."""
    torch.manual_seed(0)
    model = ActorCritic([4], 2)
    ctx = WorkerContext(0, spec(lr=0.0), model, Control(1), [], Pipe())
    task, env = A3CTask(CARTPOLE, A3CConfig(rollout_steps=8)), CARTPOLE()
    obs, _ = env.reset(seed=0)
    rollout, _ = task.collect(model, env, obs, Episodes(), np.random.default_rng(0))
    grads = []
    for update in range(3):
        ctx.begin()
        assert all(p.grad is None for p in model.parameters())
        loss, _ = task.loss(model, rollout)
        assert ctx.step(loss, 8, update + 1, max_grad_norm=task.cfg.max_grad_norm)
        grads.append(torch.cat([p.grad.flatten() for p in model.parameters()]))
    assert grads[0].abs().sum() > 0
    assert torch.equal(grads[0], grads[1]) and torch.equal(grads[0], grads[2])


def test_gradients_are_clipped_to_max_grad_norm():
    torch.manual_seed(0)
    model = ActorCritic([1], 2)
    ctx = WorkerContext(0, spec(lr=0.0), model, Control(1), [], Pipe())
    task, env = A3CTask(Countdown, A3CConfig(rollout_steps=6)), Countdown(reward=100.0)
    obs, _ = env.reset()
    rollout, _ = task.collect(model, env, obs, Episodes(), np.random.default_rng(0))
    ctx.begin()
    ctx.step(task.loss(model, rollout)[0], 6, 1, max_grad_norm=0.5)
    norm = torch.cat([p.grad.flatten() for p in model.parameters()]).norm()
    assert norm == pytest.approx(0.5, rel=1e-4)


def test_a_worker_runs_to_the_budget_and_reports_episodes():
    torch.manual_seed(0)
    control = Control(1)
    conn = Pipe()
    ctx = WorkerContext(
        0,
        spec(lr=1e-3, log_every=2),
        ActorCritic([4], 2),
        control,
        [],
        conn,
    )
    A3CTask(CARTPOLE, A3CConfig(rollout_steps=20, max_env_steps=400)).run(ctx)
    assert ctx.global_units() == 400 and int(control.progress[0, Control.STEPS]) == 20
    scalars = [m.values for m in conn.sent if isinstance(m, Scalars)]
    assert len(scalars) == 10 and {"policy_loss", "value_loss", "entropy"} <= set(scalars[0])
    assert any("episode_return" in s for s in scalars)


# ---- the shared optimizer ----


def test_the_shared_adam_step_counter_counts_every_workers_updates():
    """Two workers' optimizers adopt one state (optimizer.shared=true): one step tensor, which
    torch's Adam increments in place (current torch keeps `step` as a tensor), so it counts the
    updates of both, and the bias correction follows the shared count."""
    model = ActorCritic([4], 2)
    params = list(model.parameters())
    factory = functools.partial(torch.optim.Adam, lr=1e-3)
    state = shared_state.share(shared_state.build(factory, params))
    workers = [factory(params) for _ in range(2)]
    for optimizer in workers:
        shared_state.attach(optimizer, params, state)
    for _ in range(5):
        for optimizer in workers:
            for p in params:
                p.grad = torch.ones_like(p)
            optimizer.step()
    assert isinstance(state[0]["step"], torch.Tensor) and state[0]["step"].is_shared()
    assert shared_state.steps(state) == 10
    assert all(int(s["step"]) == 10 for s in state)
    assert all(o.state[params[0]]["step"] is state[0]["step"] for o in workers)


def test_a3c_shares_its_optimizer_state_by_default():
    from hogwild import Trainer

    workload = A3CWorkload(CARTPOLE)
    trainer = Trainer(ActorCritic([4], 2), workload, functools.partial(torch.optim.Adam))
    assert trainer.shared_optimizer is True
    explicit = Trainer(
        ActorCritic([4], 2), workload, functools.partial(torch.optim.Adam), shared_optimizer=False
    )
    assert explicit.shared_optimizer is False


# ---- evaluation and stopping ----


class Constant(torch.nn.Module):
    """Always the same action."""

    def forward(self, x):
        return torch.tensor([[0.0, 1.0]]).expand(x.shape[0], 2), torch.zeros(x.shape[0])


def test_the_evaluator_is_due_every_m_env_steps_and_a_resumed_run_counts_from_its_start():
    ev = PolicyEvaluator(Countdown, 0, every=1000, episodes=2, stop_at=None, started_at=0.0)
    assert ev.due(0, 5000) is None  # the first call: a resumed run's steps are not due
    assert ev.due(0, 5999) is None
    assert ev.due(0, 6000) == "6,000 env steps"
    assert ev.due(0, 6500) is None


def test_an_evaluation_that_reaches_stop_at_return_solves_the_task():
    ev = PolicyEvaluator(Countdown, 0, every=10, episodes=3, stop_at=3.0, started_at=0.0)
    assert ev.goal() is None and ev.needs_final(True, True)
    ev.due(0, 0)
    assert ev.due(0, 12) == "12 env steps"
    assert ev.evaluate(Constant(), "x") == {"eval/return": 3.0, "eval/return_min": 3.0}
    assert ev.goal() == "solved: greedy return 3.0 >= 3"
    r = ev.results()
    assert r["solved"] is True and r["eval_return"] == 3.0 and r["seconds_to_solve"] > 0
    assert r["env_steps_to_solve"] == 12
    assert not ev.needs_final(True, True)  # the solving evaluation is the record


def test_an_evaluation_below_the_target_does_not_solve():
    ev = PolicyEvaluator(Countdown, 0, every=10, episodes=2, stop_at=3.5, started_at=0.0)
    ev.evaluate(Constant(), "x")
    assert ev.goal() is None and ev.results()["solved"] is False
    assert ev.results()["seconds_to_solve"] is None


def test_stop_at_return_defaults_to_the_environments_reward_threshold():
    assert A3CWorkload(CARTPOLE).stop_at_return == 475
    assert A3CWorkload(CARTPOLE, A3CConfig(stop_at_return=100.0)).stop_at_return == 100
    assert A3CWorkload(Countdown).stop_at_return is None  # no spec: the budget ends it


def test_the_console_report_says_whether_and_when_it_solved():
    s = {"solved": True, "seconds_to_solve": 61.24, "stop_at_return": 475.0, "eval_return": 488.2,
         "env_steps": 123456, "env_steps_per_second": 4000.0}  # fmt: skip
    rows = dict(result_rows(s))
    assert rows["solved"] == "yes, 61.2 s after the start (return >= 475)"
    assert rows["eval return"].startswith("488.2") and rows["env steps"].startswith("123,456")
    s.update(solved=False, seconds_to_solve=None, eval_return=None, env_steps_per_second=None)
    rows = dict(result_rows(s))
    assert rows["solved"] == "no (return 475 not reached)" and rows["eval return"].startswith("n/a")


# ---- config ----


def test_the_a3c_experiment_composes_an_env_run_without_data():
    run = run_config(["+experiment=a3c_cartpole"])
    assert run.env["id"] == "CartPole-v1" and run.data == {} and run.shared_optimizer is True
    assert run.a3c == A3CConfig() and run.trainer.threads_per_worker == 1
    assert run_config(["+experiment=a3c_cartpole", "env=acrobot"]).env["id"] == "Acrobot-v1"


def test_env_and_data_together_are_refused():
    with pytest.raises(ConfigError, match="env and data are both set"):
        run_config(["+env=cartpole"])


def test_an_env_run_on_cuda_is_refused():
    with pytest.raises(ConfigError, match="trainer.device='cuda'.*runs on the CPU"):
        run_config(["+experiment=a3c_cartpole", "trainer.device=cuda"])


def test_a3c_keys_are_checked():
    with pytest.raises(ConfigError, match=r"a3c.gamma=1.5 is not valid"):
        run_config(["+experiment=a3c_cartpole", "a3c.gamma=1.5"])
    with pytest.raises(ConfigError, match="did you mean a3c.rollout_steps"):
        run_config(["+experiment=a3c_cartpole", "+a3c.rollout_step=5"])


def test_a_missing_gymnasium_is_one_line_naming_the_extra(monkeypatch):
    monkeypatch.setitem(sys.modules, "gymnasium", None)  # import gymnasium -> ImportError
    with pytest.raises(ConfigError) as e:
        envs.gym_env("CartPole-v1")
    assert str(e.value) == (
        "environments need gymnasium, which is not installed: "
        "pip install 'gymnasium>=0.29' (hogwild's `rl` extra)"
    )


def test_an_unknown_env_id_is_one_line():
    with pytest.raises(ConfigError, match=r"env.id='CartPol-v1'"):
        envs.gym_env("CartPol-v1")


def test_a_continuous_action_space_is_refused():
    with pytest.raises(ConfigError, match="discrete action space"):
        A3CWorkload(functools.partial(envs.gym_env, "Pendulum-v1"))
