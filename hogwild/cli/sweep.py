"""A Hydra sweep as one table, one row per job (docs/performance.md): what the CLI prints at the
end of `python -m hogwild train -m ...`, and what scripts/sweep_table.py prints (and plots) for
a sweep folder afterwards. Reads each job folder's summary.json and .hydra/overrides.yaml; a
job the CLI saw refused is listed as `refused`, one without summary.json otherwise (still
running, or killed) as `missing`, one that an interrupted sweep never started as `not run`
(SweepRun, the CLI's side). Every job's config is checked before the first job starts
(`check_every_job`). Each job's folder is named by its number and what it varies
(`job_folder`), which is how TensorBoard names it.
"""

from __future__ import annotations

import json
import os
import signal
from pathlib import Path

import yaml

from hogwild.cli.resume import override_key
from hogwild.process.signals import SIGNALS, SignalRelay
from hogwild.reporting.text import plural, print_cells, shown_path
from hogwild.run.folder import job_number

FIELDS = (
    "status",
    "num_workers",
    "samples_per_second",
    "test_accuracy",
    "test_rmse",
    "wall_seconds",
)


_LONGEST_BYTES = 100  # of a job folder's name after its number (a name has 255 at most)

NOT_RUN = "not run"  # a job an interrupted sweep never started
REFUSED = "refused"  # a job refused before it started (exit 2: its one line was printed)


def read_job(
    job: Path, overrides: list[str] | None = None, not_run: bool = False, refused: bool = False
) -> dict:
    """One job's row. `overrides`: the job's own, for a job whose folder has no .hydra/ (it
    was refused, or never run); `not_run`: the job never started (its folder is gone);
    `refused`: it exited 2 before it started."""
    overrides_file = job / ".hydra" / "overrides.yaml"
    if overrides_file.is_file():
        overrides = yaml.safe_load(overrides_file.read_text()) or []
    summary_file = job / "summary.json"
    summary = (
        json.loads(summary_file.read_text())
        if summary_file.is_file()
        else {"status": NOT_RUN if not_run else REFUSED if refused else "missing"}
    )
    number = job_number(job.name)
    return {
        "job": job.name if number is None else str(number),
        "folder": str(job),
        "overrides": list(overrides or []),
        **{k: summary.get(k) for k in FIELDS},
    }


def read_sweep(folder: Path) -> list[dict]:
    jobs = sorted(
        (p for p in folder.iterdir() if p.is_dir() and job_number(p.name) is not None),
        key=lambda p: job_number(p.name),
    )
    return [read_job(job) for job in jobs]


def job_folder(number: int, overrides, exclude_keys, fixed: tuple[str, ...] = ()) -> str:
    """A job's folder, `hydra.sweep.subdir` in configs/train.yaml: its number, then its overrides
    less those every job shares (`fixed`, the keys the command line sets to one value for all
    jobs: `fixed_keys`) and the keys the config excludes from Hydra's `override_dirname`, sorted
    and joined as Hydra joins them, so that TensorBoard's run list says what each job tried:
    `0_trainer.num_workers=1`, `1_trainer.num_workers=2`. Only the number when nothing varies;
    a `/` in a value becomes `_`, and a long name is cut (the number keeps it unique)."""
    skip = {*fixed, *(exclude_keys or ())}
    # a group's key as exclude_keys names it: `model@pkg=mlp` -> `model`
    varying = ",".join(
        sorted(o for o in overrides or () if override_key(o).split("@", 1)[0] not in skip)
    )
    cut = varying.replace("/", "_").encode()[:_LONGEST_BYTES].decode(errors="ignore")
    return f"{number}_{cut}" if cut else str(number)


def fixed_keys(argv: list[str]) -> tuple[str, ...]:
    """The keys the command line sets to one value for every job of a sweep (`trainer.epochs`
    in `-m trainer.num_workers=1,2 trainer.epochs=1`): none of their overrides is a sweep.
    Read as Hydra reads the command line (`--config-dir X` and other options aside); () when
    Hydra cannot read it (it says why when it runs)."""
    import contextlib
    import io

    from hydra._internal.utils import get_args_parser
    from hydra.core.override_parser.overrides_parser import OverridesParser

    try:
        with contextlib.redirect_stderr(io.StringIO()):  # argparse's own complaint: Hydra's to make
            given = get_args_parser().parse_intermixed_args(argv).overrides
        parsed = OverridesParser.create().parse_overrides(given)
    except (Exception, SystemExit):  # noqa: BLE001 - Hydra says what is wrong when it runs
        return ()
    swept = {o.key_or_group for o in parsed if o.is_sweep_override()}
    return tuple(sorted({o.key_or_group for o in parsed} - swept))


def register_job_folder(fixed: tuple[str, ...] = ()) -> None:
    """`${hogwild_job_folder:...}` for configs/train.yaml's sweep subdir, knowing the keys this
    sweep's jobs share (`fixed_keys`): registered by the CLI before Hydra composes (replacing
    the one registered for an earlier command in this process)."""
    import functools

    from omegaconf import OmegaConf

    folder = functools.partial(_resolved_job_folder, fixed=fixed)
    OmegaConf.register_new_resolver("hogwild_job_folder", folder, replace=True)


def _resolved_job_folder(number, overrides, exclude_keys, fixed: tuple[str, ...]) -> str:
    """job_folder, given what the resolver receives (OmegaConf lists)."""
    from omegaconf import OmegaConf

    def plain(value) -> list[str]:
        return list(OmegaConf.to_container(value) if OmegaConf.is_list(value) else value or [])

    return job_folder(int(number), plain(overrides), plain(exclude_keys), fixed)


def varying(rows: list[dict]) -> tuple[list[str], list[list[str]]]:
    """The overrides every job shares, and per job the ones that differ (what the sweep varies)."""
    common = [o for o in rows[0]["overrides"] if all(o in r["overrides"] for r in rows)]
    return common, [[o for o in r["overrides"] if o not in common] for r in rows]


def _result(r: dict) -> str:
    if r["test_rmse"] is not None:
        return f"RMSE {r['test_rmse']:.4f}"
    if r["test_accuracy"] is not None:
        return f"{100 * r['test_accuracy']:.2f}%"
    return "-"


def print_table(rows: list[dict]) -> None:
    def fmt(value, spec):
        return "-" if value is None else format(value, spec)

    common, own = varying(rows)
    print("all jobs:", " ".join(common) or "(no common overrides)")
    cells = [
        [
            "job",
            "overrides",
            "status",
            "workers",
            "samples/s",
            "test result",
            "wall s",
            "run folder",
        ]
    ] + [
        [
            r["job"],
            " ".join(mine) or "(none)",
            r["status"],
            fmt(r["num_workers"], "d"),
            fmt(r["samples_per_second"], ",.0f"),
            _result(r),
            fmt(r["wall_seconds"], ".1f"),
            "-" if r["status"] == NOT_RUN else shown_path(r["folder"]),
        ]
        for r, mine in zip(rows, own)
    ]
    print_cells(cells, left=3, last_left=True)


def check_every_job(overrides: list[str], config_dir: str) -> None:
    """Before the first job of a `-m` sweep starts: every job's config composed and validated
    as its job will do it (hogwild.config.run_config), so that a bad value in job 3 does not
    wait for jobs 0-2 to run. Raises ConfigError naming the job and its overrides, with the
    job's own one line. A job whose config reads Hydra's runtime (`${hydra:...}`) is left to
    its own check when it starts, as is every job of a config that sweeps itself
    (`hydra.sweeper.params`) or of overrides Hydra cannot expand. About 0.15 s per job."""
    from hydra import compose, initialize_config_dir
    from hydra._internal.core_plugins.basic_sweeper import BasicSweeper
    from hydra.core.global_hydra import GlobalHydra
    from hydra.core.override_parser.overrides_parser import OverridesParser
    from omegaconf import OmegaConf
    from omegaconf.errors import InterpolationResolutionError

    from hogwild.cli import hydra_errors
    from hogwild.config.run_config import build_run_config
    from hogwild.errors import ConfigError, HogwildError

    given = [o for o in overrides if not o.startswith("-")]
    try:
        parsed = OverridesParser.create().parse_overrides(given)
        (jobs,) = BasicSweeper.split_arguments(parsed, None)  # Hydra's own order: job numbers
    except Exception:  # noqa: BLE001 - an override Hydra cannot read or expand: Hydra says so
        return
    GlobalHydra.instance().clear()
    try:
        with initialize_config_dir(config_dir=config_dir, version_base="1.3"):
            for number, job in enumerate(jobs):
                mine = [o for o in job if not o.startswith("hydra.")]
                try:
                    composable = [o for o in job if _composable(o)]
                    if number == 0:
                        first = compose("train", composable, return_hydra_config=True)
                        if OmegaConf.select(first, "hydra.sweeper.params"):
                            return  # the config sweeps too: its jobs are Hydra's to expand; each is checked as it starts
                    cfg = compose("train", overrides=composable)
                    raw = OmegaConf.to_container(cfg, resolve=True, throw_on_missing=True)
                    build_run_config(raw, os.getcwd())
                except InterpolationResolutionError:
                    continue
                except HogwildError as e:
                    raise ConfigError(_job_line(number, mine, str(e.cli or e))) from None
                except Exception as e:  # a composition error (Hydra's own types), or a bug
                    line = hydra_errors.describe(e, mine, config_dir)
                    if line is None:
                        raise
                    raise ConfigError(_job_line(number, mine, line)) from None
    finally:
        GlobalHydra.instance().clear()


def _composable(override: str) -> bool:
    """What compose() takes of a job's overrides: the config's own and the search path."""
    return not override.startswith("hydra.") or override.startswith("hydra.searchpath")


def _job_line(number: int, overrides: list[str], line: str) -> str:
    return f"sweep job #{number} ({' '.join(overrides)}): {line}; no job was started"


class SweepRun:
    """A sweep as the CLI runs it (hogwild.cli.main), one `job` call per job of Hydra's launcher,
    whose loop hogwild does not control: the jobs in order, and the stop after a signal.

    The first Ctrl-C (SIGTERM, SIGHUP) stops the job that is running as it stops a single run,
    and no further job starts: Hydra still hands over every job, which is then marked `not run`
    at once and its empty folder removed; the table follows and the sweep's exit code is the
    signal's. Between jobs (and while the table is printed) signals are taken by a SignalRelay,
    so that none is raised inside Hydra's code; within a job they reach it as in a single run.
    """

    def __init__(self):
        self.jobs: list[tuple[Path, list[str]]] = []
        self.not_run: set[int] = set()  # indices into jobs
        self.exit_codes: list[int] = []
        self.refused: set[int] = set()  # indices into jobs: exit 2, nothing of them written
        self.stopped_by: int | None = None  # the signal that stopped the sweep
        self._relay = None

    def should_run(self, folder: str, overrides: list[str]) -> bool:
        """A job is handed over: False when the sweep has been stopped (the job is then marked
        `not run` and its empty folder, made by Hydra, removed). True: the job runs, and signals
        reach it from here on."""
        self.jobs.append((Path(folder), list(overrides)))
        self._close_relay()  # a signal that came between jobs stops the sweep here
        if self.stopped_by is None:
            return True
        self.skip()
        self.between_jobs()
        return False

    def skip(self) -> None:
        """The current job never started: `not run`, its folder removed if empty."""
        from hogwild.cli.job import remove_if_empty

        folder = self.jobs[-1][0]
        if not (folder / "summary.json").exists():
            self.not_run.add(len(self.jobs) - 1)
            remove_if_empty(str(folder))

    def ran(self, code: int, late_signals: list[int]) -> None:
        self.exit_codes.append(code)
        if code == 2:
            self.refused.add(len(self.jobs) - 1)
        if code - 128 in (int(s) for s in SIGNALS):
            self.stop(code - 128)
        for signum in late_signals:
            self.stop(signum)

    def stop(self, signum: int) -> None:
        if self.stopped_by is None:
            self.stopped_by = signum

    def between_jobs(self) -> None:
        """After a job: signals go to the relay until the next job starts (or the end)."""
        if self._relay is None:
            self._relay = SignalRelay().__enter__()

    def end(self) -> None:
        """After the table: signals are the CLI's again. One that came after the last job had
        finished stopped nothing: the jobs' exit codes stand."""
        self._close_relay(stops=False)

    def _close_relay(self, stops: bool = True) -> None:
        relay, self._relay = self._relay, None
        if relay is not None:
            relay.__exit__(None, None, None)
            for signum in relay.drain() if stops else ():
                self.stop(signum)

    @staticmethod
    def discard(sweep_dir: str) -> None:
        """Interrupted before its first job started: not even the sweep folder stays (Hydra
        wrote multirun.yaml there), when nothing else is in it."""
        from hogwild.cli.job import remove_if_empty

        folder = Path(sweep_dir)
        if folder.is_dir() and [p.name for p in folder.iterdir()] == ["multirun.yaml"]:
            (folder / "multirun.yaml").unlink()
        remove_if_empty(str(folder))

    def exit_code(self) -> int:
        stopped = [] if self.stopped_by is None else [128 + self.stopped_by]
        return max([*self.exit_codes, *stopped], default=0)

    def print_report(self) -> None:
        head = f"\nsweep: {plural(len(self.jobs), 'job')}"
        if self.stopped_by is not None:
            name = signal.Signals(self.stopped_by).name
            head += f", {len(self.not_run)} not run (stopped by {name})"
        print(head)
        print_table(
            [
                read_job(folder, overrides, i in self.not_run, i in self.refused)
                for i, (folder, overrides) in enumerate(self.jobs)
            ]
        )
