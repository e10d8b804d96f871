"""Models that fail on purpose, picked with `model._target_=faults.<Name>` (tests put this
folder on PYTHONPATH). A fault fires in one worker only (`rank`), at its `at_step`-th forward;
the orchestrator's evaluation (no HOGWILD_RANK) never triggers it. With HOGWILD_FAULT_FILE set,
the fault fires once per run: it writes the time it fired there, and a replacement worker that
finds the file trains normally. With HOGWILD_PROGRESS_FILE set, each worker creates
`<that path>.<rank>` once it has taken 3 steps (`.<node><rank>` under torchrun): what a test waits for before it interrupts a run
that is really training (never a fixed sleep)."""

from __future__ import annotations

import os
import signal
import time

import torch

from hogwild.models import MLP


class FaultyMLP(MLP):
    def __init__(
        self,
        input_shape,
        num_classes,
        fault: str = "none",
        at_step: int = 5,
        rank: int = 1,
        hidden_sizes=(32,),
        step_seconds: float = 0.0,
    ):
        super().__init__(input_shape, num_classes, hidden_sizes)
        self.fault, self.at_step, self.rank, self.step_seconds = fault, at_step, rank, step_seconds
        self.calls = 0

    def forward(self, x):
        my_rank = os.environ.get("HOGWILD_RANK")
        if my_rank is not None:
            self.calls += 1
            if self.calls == 4 and os.environ.get("HOGWILD_PROGRESS_FILE"):  # 3 steps are done
                node = os.environ.get("RANK", "")  # the torchrun node, if any
                open(f"{os.environ['HOGWILD_PROGRESS_FILE']}.{node}{my_rank}", "w").close()
            if self.step_seconds:
                time.sleep(self.step_seconds)  # make runs long enough to interrupt
            if int(my_rank) == self.rank and self.calls == self.at_step and self._arm():
                self._fire()
        out = super().forward(x)
        if (
            self.fault == "nangrad"  # a finite loss whose gradients are NaN
            and my_rank is not None
            and int(my_rank) == self.rank
            and self.calls >= self.at_step
        ):
            out.register_hook(lambda g: g * float("nan"))
        if (
            self.fault == "nonfinite"
            and my_rank is not None
            and int(my_rank) == self.rank
            and self.calls >= self.at_step
        ):
            out = out * float("nan")
        return out

    @staticmethod
    def _arm() -> bool:
        path = os.environ.get("HOGWILD_FAULT_FILE")
        if not path:
            return True
        try:
            fd = os.open(path, os.O_CREAT | os.O_EXCL | os.O_WRONLY)
        except FileExistsError:
            return False
        os.write(fd, repr(time.time()).encode())
        os.close(fd)
        return True

    def _fire(self):
        if self.fault == "raise":
            raise ZeroDivisionError("injected fault in forward")
        if self.fault == "exit":
            os._exit(7)
        if self.fault == "sigkill":
            os.kill(os.getpid(), signal.SIGKILL)
        if self.fault == "segv":
            os.kill(os.getpid(), signal.SIGSEGV)
        if self.fault == "hang":
            time.sleep(3600)


class LoggingMLP(MLP):
    """Logs once from inside each worker (checks that worker logs reach the orchestrator)."""

    def __init__(self, input_shape, num_classes, hidden_sizes=(32,)):
        super().__init__(input_shape, num_classes, hidden_sizes)
        self.logged = False

    def forward(self, x):
        if os.environ.get("HOGWILD_RANK") is not None and not self.logged:
            import logging

            self.logged = True
            logging.getLogger("user.model").info(
                "hello from a worker, threads=%d", torch.get_num_threads()
            )
        return super().forward(x)


def faulty_env(
    id: str = "CartPole-v1", fault: str = "none", at_step: int = 300, rank: int = 1, **kwargs
):
    """A gymnasium environment (picked with `env._target_=faults.faulty_env`) whose `step`
    fails at the `at_step`-th step of worker `rank` (HOGWILD_FAULT_FILE and
    HOGWILD_PROGRESS_FILE as for FaultyMLP; the progress file after 100 steps)."""
    import gymnasium

    class FaultyEnv(gymnasium.Wrapper):
        steps = 0

        def step(self, action):
            my_rank = os.environ.get("HOGWILD_RANK")
            if my_rank is not None:
                self.steps += 1
                if self.steps == 100 and os.environ.get("HOGWILD_PROGRESS_FILE"):
                    open(f"{os.environ['HOGWILD_PROGRESS_FILE']}.{my_rank}", "w").close()
                if int(my_rank) == rank and self.steps == at_step and FaultyMLP._arm():
                    if fault == "raise":
                        raise RuntimeError("injected fault in env.step")
                    if fault == "exit":
                        os._exit(7)
            return super().step(action)

    return FaultyEnv(gymnasium.make(id, **kwargs))
