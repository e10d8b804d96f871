"""`python -m hogwild <command> [hydra overrides]`: the CLI layer (with hogwild.cli.job, one job,
and hogwild.cli.hydra_errors), where Hydra stops.

    python -m hogwild train                            # digits, 2 workers, offline
    python -m hogwild train +experiment=mnist          # the classic MNIST Hogwild setup
    python -m hogwild train trainer.num_workers=4 trainer.start_method=spawn
    python -m hogwild train -m trainer.num_workers=1,2 # a Hydra sweep, one run folder each
    python -m hogwild train --cfg job                  # print the composed config

Hydra composes the config; `build_run_config` validates it into plain dataclasses before any
data is loaded or any process starts; builders turn the `_target_` sections into objects; the
Trainer runs. Errors the user can fix are printed as one line, with a non-zero exit code.
"""

from __future__ import annotations

import logging
import os
import sys
import time
from pathlib import Path

EXEC_SECONDS = 5.0  # an interpreter reaches main() within this of its exec (interpreter_start)

USAGE = """usage: hogwild <command> [options]

commands:
  train     train a model with Hogwild workers (Hydra overrides follow; `train --help` lists them)
  doctor    check this machine (cores, sharing, /dev/shm, open files, CUDA) and suggest a config
  bench     measure the framework against a plain hand-written Hogwild loop (`bench --help`)

examples:
  hogwild train
  hogwild train +experiment=mnist trainer.num_workers=4
  hogwild train -m trainer.num_workers=1,2"""

log = logging.getLogger("hogwild")


def config_dir() -> str:
    """configs/ ships inside the wheel as hogwild/configs; a source checkout has it at the top."""
    here = Path(__file__).resolve().parent.parent  # the package: hogwild/cli/ is one down
    for candidate in (here / "configs", here.parent / "configs"):
        if (candidate / "train.yaml").is_file():
            return str(candidate)
    raise FileNotFoundError(
        f"hogwild's configs are missing (looked in {here / 'configs'} and {here.parent / 'configs'})"
    )


def run() -> None:
    """The `hogwild` command and `python -m hogwild`: main(), the exit handlers, then the exit
    itself without interpreter teardown. Every file is written by then; the teardown only frees
    memory, and with torch loaded it can take a second, or abort the process (a shared tensor
    freed after torch_shm_manager was killed) with an exit code that is not the run's."""
    import atexit
    import signal

    # Until `train` takes the signals (hogwild.process.signals.install), nothing has been
    # started: a stop is one line and the exit, not KeyboardInterrupt's traceback. (bench and
    # doctor keep Python's own: their clean-up runs in `finally` blocks.)
    training = sys.argv[1:2] == ["train"]
    for signum in (signal.SIGINT, signal.SIGTERM, signal.SIGHUP) if training else ():
        signal.signal(signum, _stopped_early)
    finished: list = []  # every finished run's Trainer, freed by the exit itself (cli.job.run_job)
    code = main(finished=finished)
    for signum in (signal.SIGINT, signal.SIGTERM, signal.SIGHUP) if training else ():
        signal.signal(signum, signal.SIG_IGN)  # the run is over: its exit code stands
    atexit._run_exitfuncs()  # logging's flush, our /dev/shm cleanup (hogwild.process.sharing), ...
    for stream in (sys.stdout, sys.stderr):
        try:
            stream.flush()
        except (BrokenPipeError, OSError):
            pass
    os._exit(code)


def _stopped_early(signum: int, frame) -> None:
    import signal

    name = signal.Signals(signum).name
    try:
        print(f"hogwild: interrupted by {name} before the run started; nothing was written")
        sys.stdout.flush()
    finally:
        os._exit(128 + signum)


def main(argv: list[str] | None = None, finished: list | None = None) -> int:
    started_at = _process_start_time(reached=time.time())  # the run's fixed costs start here
    argv = list(sys.argv[1:] if argv is None else argv)
    if argv and argv[0] in ("-h", "--help", "help"):
        print(USAGE)
        return 0
    if not argv:  # a command is missing: the usage, as a mistake (exit 2, as argparse does)
        print(USAGE, file=sys.stderr)
        return 2
    command, rest = argv[0], argv[1:]
    if command == "train":
        return train(rest, [] if finished is None else finished, started_at)
    if command == "doctor":
        from hogwild.cli import doctor

        return doctor.main(rest)
    if command == "bench":
        from hogwild import bench

        return bench.main(rest)
    print(
        f"hogwild: unknown command {command!r}; commands: train, doctor, bench (see `hogwild --help`)",
        file=sys.stderr,
    )
    return 2


def register_defaults() -> None:
    """Each typed group's base config is its dataclass's defaults (hogwild.config.schema, the one home
    of every default): `trainer/default.yaml` and friends inherit `_defaults` and restate
    nothing. Plain dicts, not typed nodes: hogwild's own checks give the clearer errors."""
    import dataclasses

    from hydra.core.config_store import ConfigStore

    from hogwild.config.schema import GROUPS

    store = ConfigStore.instance()
    for group, cls in GROUPS.items():
        store.store(group=group, name="_defaults", node=dataclasses.asdict(cls()))


def train(overrides: list[str], finished: list, started_at: float | None = None) -> int:
    from hogwild.process import signals

    previous = signals.install()  # Ctrl-C, SIGTERM, SIGHUP: one line, no traceback, from here on
    try:
        return _hydra_main(overrides, finished, started_at or time.time())
    except signals.Interrupted as e:  # before a run's workers started (docs/fault-tolerance.md)
        print(f"hogwild: interrupted by {e} before the run started; nothing was written")
        return e.exit_code
    finally:
        signals.restore(previous)


def _hydra_main(overrides: list[str], finished: list, started_at: float) -> int:
    from hogwild.cli import resume
    from hogwild.process.forkserver import ServerAhead

    resumed = resume.with_own_overrides(overrides)  # resume_from: the run's own config back
    if resumed is not None:
        overrides = resumed.overrides
    saved_argv, saved_full_error = sys.argv, os.environ.get("HYDRA_FULL_ERROR")
    sys.argv = ["hogwild train", *overrides]
    os.environ["HYDRA_FULL_ERROR"] = "1"  # Hydra raises its errors here instead of printing them
    ahead = ServerAhead()
    try:
        if not any(o.startswith("-") and o not in ("-m", "--multirun") for o in overrides):
            # a run, not --cfg or --help: its fork server's imports are the longest part of
            # the start-up, so they begin before Hydra's import and compose (hogwild.process.forkserver)
            ahead = ServerAhead.start()
        if "--help" in overrides or "-h" in overrides:
            return _help(overrides, ahead, finished)
        return _compose_and_run(overrides, ahead, finished, started_at, resumed)
    finally:
        ahead.stop_unless_kept()  # no config kept it: a refused or interrupted run
        sys.argv = saved_argv
        if saved_full_error is None:
            os.environ.pop("HYDRA_FULL_ERROR", None)
        else:
            os.environ["HYDRA_FULL_ERROR"] = saved_full_error


def _help(overrides: list[str], ahead, finished: list) -> int:
    """Hydra's `train --help`, without the `_defaults` entries (the schema's defaults that
    each group's files inherit, register_defaults): they are not choices."""
    import contextlib
    import io
    import re

    text, code = io.StringIO(), 0
    try:
        with contextlib.redirect_stdout(text):
            code = _compose_and_run(overrides, ahead, finished, time.time())
    except SystemExit as e:  # Hydra ends its help with sys.exit(0)
        code = e.code if isinstance(e.code, int) else 0
    print(re.sub(r"(?m)(: )_defaults(, |$)", r"\1", text.getvalue()), end="")
    return code


def _compose_and_run(
    overrides: list[str], ahead, finished: list, started_at: float, resumed=None
) -> int:
    import hydra

    from hogwild.cli import job as cli_job
    from hogwild.cli.sweep import SweepRun, fixed_keys, register_job_folder
    from hogwild.process.signals import Interrupted
    from hogwild.reporting.timeline import Timeline
    from hogwild.run.context import RunSetup

    exit_codes: list[int] = []
    sweep = SweepRun()  # under -m: the jobs, and the stop after a signal (hogwild.cli.sweep)
    ours: list[BaseException] = []  # what our task raised, as opposed to Hydra's own code
    entered = time.time()
    register_defaults()
    register_job_folder(fixed_keys(overrides))  # a sweep's job folders: what each job varies

    @hydra.main(version_base="1.3", config_path=config_dir(), config_name="train")
    def task(cfg) -> None:
        from hydra.core.hydra_config import HydraConfig
        from hydra.types import RunMode

        nonlocal started_at
        hydra_cfg = HydraConfig.get()
        multirun = hydra_cfg.mode == RunMode.MULTIRUN
        if multirun and not sweep.should_run(
            hydra_cfg.runtime.output_dir, list(hydra_cfg.overrides.task)
        ):
            return  # a signal stopped the sweep: marked `not run`, its folder removed
        try:
            # the run's fixed costs start with the interpreter (the first job) and Hydra's compose
            first = {"python_and_imports": entered - started_at} if not exit_codes else {}
            timeline = Timeline(
                started_at, {**first, "config": time.time() - max(entered, started_at)}
            )
            # one job, and the process exits after it: the final evaluation may use every core
            setup = RunSetup(timeline, last_run_in_process=not multirun)
            late: list[int] = []  # a signal during the job's report: no further job starts
            code = cli_job.run_job(cfg, setup, ahead, finished, started_at, late, resumed)
            exit_codes.append(code)
            if multirun:
                sweep.ran(code, late)
            started_at = time.time()  # the next job of a sweep starts now
        except Interrupted as e:  # before this job's run started: nothing of it was written
            if not multirun:
                raise
            sweep.skip()
            if not sweep.exit_codes:  # the sweep's first job: nothing was written at all
                sweep.discard(hydra_cfg.sweep.dir)
                raise
            sweep.stop(e.signum)
        except BaseException as e:
            ours.append(e)
            raise
        finally:
            if multirun:
                sweep.between_jobs()  # signals wait for the next job, or for the table

    if _plain_sweep(overrides):
        from hogwild.cli.sweep import check_every_job
        from hogwild.errors import HogwildError

        try:
            check_every_job(overrides, config_dir())
        except HogwildError as e:
            print(f"hogwild: error: {e}", file=sys.stderr)
            return 2
    try:
        try:
            task()
        except Interrupted as e:
            if not sweep.exit_codes:  # no job started: "nothing was written" (train())
                raise
            sweep.stop(e.signum)
        except Exception as e:
            line = _refusal(e, ours, overrides)
            if line is None:
                raise  # not the user's input: a bug, with its traceback
            print(f"hogwild: error: {line}", file=sys.stderr)
            exit_codes.append(2)
        if sweep.jobs:  # one row per job of the multirun (hogwild.cli.sweep)
            sweep.print_report()
    finally:
        sweep.end()
    return max([*exit_codes, sweep.exit_code()])


def _plain_sweep(overrides: list[str]) -> bool:
    """A `-m` sweep of overrides only (no --cfg, --help, --config-dir ...): its jobs are
    checked before the first starts (hogwild.cli.sweep.check_every_job)."""
    flags = [o for o in overrides if o.startswith("-")]
    return bool(flags) and all(f in ("-m", "--multirun") for f in flags)


def _refusal(e: Exception, ours: list[BaseException], overrides: list[str]) -> str | None:
    """The one line for what Hydra refused: a composition error, or a run folder its own code
    could not make or write (a read-only parent, no permission, no space: an OSError from
    Hydra, not from our task). None: a bug, which keeps its traceback."""
    from hogwild.cli import hydra_errors

    if isinstance(e, OSError) and e.filename and not any(e is mine for mine in ours):
        sweep = any(o in ("-m", "--multirun") for o in overrides)
        key = "hydra.sweep.dir" if sweep else "hydra.run.dir"
        return hydra_errors.folder_error(str(e.filename), e, key)
    return hydra_errors.describe(e, overrides, config_dir())


def _process_start_time(reached: float) -> float:
    """When this interpreter started (time.time()), to 10 ms: the process's start in clock
    ticks since boot (/proc/self/stat) against the seconds since boot (/proc/uptime). psutil's
    create_time counts from a boot time rounded to the second: up to a second off. `reached`:
    when the CLI's main() began."""
    try:
        with open("/proc/self/stat") as f:
            ticks = int(f.read().rsplit(")", 1)[1].split()[19])
        with open("/proc/uptime") as f:
            uptime = float(f.read().split()[0])
        started = time.time() - (uptime - ticks / os.sysconf("SC_CLK_TCK"))
    except (OSError, ValueError, IndexError):  # not Linux: wall time is then measured from here
        return reached
    return interpreter_start(started, reached)


def interpreter_start(process_start: float, loaded_at: float) -> float:
    """A process keeps its start time across exec: a shell that ran other commands before it
    exec'd python (`bash -c 'make data; python -m hogwild train'`, a subshell's last command)
    would add their time to the run's start-up. Python reaches the CLI's main() within about a
    second of its exec; much later than that, main() is the start."""
    return process_start if loaded_at - process_start < EXEC_SECONDS else loaded_at
