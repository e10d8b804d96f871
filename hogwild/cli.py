"""`python -m hogwild <command> [hydra overrides]` — the only module that imports Hydra.

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
# Finished runs, kept until os._exit: freeing a file_system shared tensor after
# torch_shm_manager was killed aborts the process ("terminate called ... Broken pipe"); the
# kernel frees them at exit, and hogwild.sharing unlinks their names.
_FINISHED: list = []


def config_dir() -> str:
    """configs/ ships inside the wheel as hogwild/configs; a source checkout has it at the top."""
    here = Path(__file__).resolve().parent
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

    code = main()
    atexit._run_exitfuncs()  # logging's flush, our /dev/shm cleanup (hogwild.sharing), ...
    for stream in (sys.stdout, sys.stderr):
        try:
            stream.flush()
        except (BrokenPipeError, OSError):
            pass
    os._exit(code)


def main(argv: list[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    if not argv or argv[0] in ("-h", "--help", "help"):
        print(USAGE)
        return 0
    command, rest = argv[0], argv[1:]
    if command == "train":
        return train(rest)
    if command == "doctor":
        from hogwild import doctor

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
    """Each typed group's base config is its dataclass's defaults (hogwild.config, the one home
    of every default): `trainer/default.yaml` and friends inherit `_defaults` and restate
    nothing. Plain dicts, not typed nodes: hogwild's own checks give the clearer errors."""
    import dataclasses

    from hydra.core.config_store import ConfigStore

    from hogwild.config import GROUPS

    store = ConfigStore.instance()
    for group, cls in GROUPS.items():
        store.store(group=group, name="_defaults", node=dataclasses.asdict(cls()))


def train(overrides: list[str]) -> int:
    from hogwild import lifetime

    previous = lifetime.install()  # Ctrl-C, SIGTERM, SIGHUP: one line, no traceback, from here on
    try:
        return _hydra_main(overrides)
    except lifetime.Interrupted as e:  # before a run's workers started (docs/fault-tolerance.md)
        print(f"hogwild: interrupted by {e} before the run started; nothing was written")
        return e.exit_code
    finally:
        lifetime.restore(previous)


def _hydra_main(overrides: list[str]) -> int:
    import hydra

    exit_codes: list[int] = []
    started_at = _process_start_time()
    register_defaults()

    @hydra.main(version_base="1.3", config_path=config_dir(), config_name="train")
    def task(cfg) -> None:
        nonlocal started_at
        exit_codes.append(run_job(cfg, started_at))
        started_at = time.time()  # the next job of a sweep starts now

    saved_argv, saved_full_error = sys.argv, os.environ.get("HYDRA_FULL_ERROR")
    sys.argv = ["hogwild train", *overrides]
    os.environ["HYDRA_FULL_ERROR"] = "1"  # Hydra raises its errors here instead of printing them
    try:
        task()
    except Exception as e:
        from hogwild import hydra_errors

        line = hydra_errors.describe(e, overrides, config_dir())
        if line is None:
            raise  # not the user's input: a bug, with its traceback
        print(f"hogwild: error: {line}", file=sys.stderr)
        return 2
    finally:
        sys.argv = saved_argv
        if saved_full_error is None:
            os.environ.pop("HYDRA_FULL_ERROR", None)
        else:
            os.environ["HYDRA_FULL_ERROR"] = saved_full_error
    return max(exit_codes, default=0)


def run_job(cfg, started_at: float | None = None) -> int:
    """One training run from a composed config; returns the process exit code."""
    from hydra.core.hydra_config import HydraConfig
    from omegaconf import OmegaConf

    from hogwild.errors import HogwildError
    from hogwild.lifetime import Interrupted
    from hogwild.run_config import build_run_config

    output_dir = HydraConfig.get().runtime.output_dir
    try:  # a bad value is refused before torch is even imported (~2 s)
        raw = OmegaConf.to_container(cfg, resolve=True, throw_on_missing=True)
        run = build_run_config(raw, output_dir)
        trainer = _train(run, raw, started_at, lambda: _save_hydra_files(cfg, output_dir))
    except HogwildError as e:
        _remove_if_empty(output_dir)  # Hydra made it for this run; a refused run leaves nothing
        print(f"hogwild: error: {e}", file=sys.stderr)
        return 2
    _FINISHED.append(trainer)  # its shared tensors live until the process exits (see run())
    try:
        return _report(trainer)
    except Interrupted:  # after summary.json: the run's exit code stands
        return trainer.summary.exit_code


def _save_hydra_files(cfg, output_dir: str) -> None:
    """What Hydra writes to `.hydra/` (hydra.output_subdir is null in train.yaml): written here,
    once this run holds its folder, so that a second run into it cannot overwrite them."""
    from hydra.core.hydra_config import HydraConfig
    from omegaconf import OmegaConf

    from hogwild import run_folder

    folder = Path(output_dir) / ".hydra"
    hydra_cfg = HydraConfig.get()
    files = {
        "config.yaml": cfg,
        "hydra.yaml": OmegaConf.create({"hydra": OmegaConf.to_container(hydra_cfg)}),
        "overrides.yaml": OmegaConf.create(list(hydra_cfg.overrides.task)),
    }
    for name, content in files.items():
        try:
            folder.mkdir(exist_ok=True)
            OmegaConf.save(content, folder / name)
        except OSError as e:
            raise run_folder.write_error(str(folder / name), e) from None


def _remove_if_empty(folder: str) -> None:
    try:
        os.rmdir(folder)
    except OSError:
        pass


def _train(run, raw: dict, started_at: float | None, save_config=lambda: None):
    import contextlib

    import torch

    from hogwild import run_folder
    from hogwild.node import LocalNode

    # Before any torch work in this process: an OpenMP pool used here and then inherited
    # through fork hangs any child that asks for more than one thread.
    torch.set_num_threads(1)
    node = LocalNode()
    try:
        if run.distributed.mode == "torchrun":
            from hogwild.distributed import NodeSync

            node = NodeSync(run.distributed, torch.device(run.trainer.device))
        # the node that writes holds the run folder from here to its last write
        claim = run_folder.claim(run.output_dir) if node.is_writer else contextlib.nullcontext()
        with claim:
            if node.is_writer:
                save_config()
            return _fit(run, raw, started_at, node)
    finally:
        node.close()


def _fit(run, raw: dict, started_at: float | None, node):
    from tqdm.contrib.logging import logging_redirect_tqdm

    from hogwild import builders
    from hogwild.supervisor import prestart
    from hogwild.trainer import Trainer

    prestart(run.trainer.start_method)  # the fork server boots while the data loads (seconds)
    data, model = builders.build_workload(run, node, started_at)  # a data set, or an env (A3C)
    trainer = Trainer(
        model=model,
        data=data,
        optimizer_factory=builders.build_optimizer_factory(run.optimizer),
        trainer=run.trainer,
        batch_size=run.batch_size,
        output_dir=run.output_dir,
        checkpointing=run.checkpoint,
        resume_from=run.resume_from,
        shared_optimizer=run.shared_optimizer,
        schedule=run.schedule,
        node=node,
        record=raw,
        started_at=started_at,
    )
    with logging_redirect_tqdm():
        trainer.fit()
    return trainer


def _report(trainer) -> int:
    """The few lines a user reads at the end of a run (rank 0's; the other nodes say one)."""
    node = trainer.node
    summary = trainer.summary
    if not node.is_writer:
        print(
            f"node {node.rank}: {summary.status}, {summary.total_samples:,} samples "
            f"({summary.samples_per_second or 0:,.0f}/s); rank 0 writes the run's files"
        )
        return summary.exit_code
    failure, lines = summary.report(trainer.output_dir)
    if failure:
        print(failure, file=sys.stderr)
    try:
        print("\n".join(lines), flush=True)
    except BrokenPipeError:  # `hogwild train | head -1`: a reader that left is not a failure
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, sys.stdout.fileno())  # nor is Python's flush of stdout at exit
        os.close(devnull)
    return summary.exit_code


def _process_start_time() -> float:
    try:
        import psutil

        return psutil.Process().create_time()
    except Exception:  # noqa: BLE001 - wall time is then measured from here
        return time.time()
