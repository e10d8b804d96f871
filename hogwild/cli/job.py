"""One training job of the CLI (hogwild.cli.main): a composed config in, the report out.

    run_job(cfg, ...)  validate (build_run_config) -> claim the run folder -> write .hydra/ ->
                       settle the fork server, import torch -> build data, model, optimizer ->
                       Trainer.fit() -> the report on stdout

The job's set-up is made here once and handed to the Trainer (hogwild.run.context.RunSetup):
the claimed folder, the timeline, whether the process ends with this run. A refused job leaves
no folder behind; the node that writes (rank 0 under torchrun) holds the run folder from before
`.hydra/` is written to its last write (hogwild.run.folder).
"""

from __future__ import annotations

import logging
import os
import sys
from pathlib import Path

from hogwild.reporting.text import plural, shown_path

log = logging.getLogger("hogwild")


def run_job(
    cfg,
    setup,
    ahead,
    finished: list,
    started_at: float | None = None,
    late_signals: list[int] | None = None,
    resumed=None,
) -> int:
    """One training run from a composed config; returns the process exit code. `setup` is the
    job's RunSetup without its claim (made here), `ahead` the fork server the CLI started
    before the config (hogwild.process.forkserver.ServerAhead). The finished run's Trainer goes
    into `finished`, which the CLI keeps until os._exit: freeing a file_system shared tensor
    after torch_shm_manager was killed aborts the process ("terminate called ... Broken
    pipe"); the kernel frees them at exit, and hogwild.process.sharing unlinks their names.
    `resumed`: the run this one continues, whose own overrides were composed (hogwild.cli.resume).
    A signal after summary.json (during the report) leaves the run's exit code as it is; it
    goes into `late_signals`, so that a sweep starts no further job (hogwild.cli.sweep)."""
    from hydra.core.hydra_config import HydraConfig
    from hydra.types import RunMode
    from omegaconf import OmegaConf

    from hogwild.config.run_config import build_run_config
    from hogwild.errors import HogwildError
    from hogwild.process.signals import Interrupted

    output_dir = HydraConfig.get().runtime.output_dir
    multirun = HydraConfig.get().mode == RunMode.MULTIRUN
    try:  # a bad value is refused before torch is even imported (~2 s)
        raw = OmegaConf.to_container(cfg, resolve=True, throw_on_missing=True)
        run = build_run_config(raw, output_dir)
        # before the first line logged opens train.log: a read-only folder is one line
        _check_writable(output_dir, "hydra.sweep.dir" if multirun else "hydra.run.dir")
        # which file of each config group was used (data: mnist, ...): the run's record, and
        # the experiment / data / model / optimizer columns of TensorBoard's HParams tab
        choices = HydraConfig.get().runtime.choices
        raw["choices"] = {k: v for k, v in choices.items() if not k.startswith("hydra/")}
        log.info(  # the first line, within a second of the start: torch and the data take longer
            "preparing %s on %s: %s, %s",
            choices.get("model", "model"),
            choices.get("env") or choices.get("data", "data"),  # A3C: the environment
            plural(run.trainer.num_workers, "worker"),
            run.trainer.start_method,
        )
        if resumed is not None:
            _say_resumed(resumed, OmegaConf.to_container(cfg, resolve=False))
        trainer = _train(
            run, raw, setup, ahead, started_at, lambda: _save_hydra_files(cfg, output_dir)
        )
    except HogwildError as e:
        remove_if_empty(output_dir)  # Hydra made it for this run; a refused run leaves nothing
        print(f"hogwild: error: {e.cli or e}", file=sys.stderr)
        return 2
    except Interrupted:  # before the run started (its records are written once it has)
        remove_if_empty(output_dir)
        raise
    finished.append(trainer)  # its shared tensors live until the process exits
    try:
        return _print_report(trainer)
    except Interrupted as e:  # after summary.json: the run's exit code stands
        if late_signals is not None:
            late_signals.append(e.signum)
        return trainer.summary.exit_code


def _say_resumed(resumed, composed: dict) -> None:
    """One line: the run continued, with the config it ran with, and what differs now."""
    from hogwild.cli.resume import changes

    own = " ".join(resumed.own) or "no overrides"
    changed = changes(resumed.folder, composed)
    log.info(
        "continuing %s with the config it ran with (%s)%s",
        resumed.folder,
        own,
        f"; changed: {', '.join(changed)}" if changed else "",
    )


def _check_writable(output_dir: str, key: str) -> None:
    """The run folder Hydra made (or found) takes a file, and Hydra's log file in it (opened by
    the first line logged) can be appended to: otherwise one line that names the folder, the
    OS reason and the key to change, before anything is written. An unnamed temporary file
    (O_TMPFILE) asks the file system itself: read-only, immutable, no permission."""
    import tempfile

    from hogwild.cli.hydra_errors import folder_error
    from hogwild.errors import RunFolderError

    folder = os.path.abspath(output_dir)
    try:
        with tempfile.TemporaryFile(dir=folder):
            pass
        for _, handler in _log_handlers_in(folder):
            if os.path.exists(handler.baseFilename):
                with open(handler.baseFilename, "a"):
                    pass
    except OSError as e:
        for logger, handler in _log_handlers_in(folder):  # no later line may try to open it
            logger.removeHandler(handler)
            handler.close()
        raise RunFolderError(folder_error(output_dir, e, key)) from None


def _log_handlers_in(folder: str) -> list[tuple[logging.Logger, logging.FileHandler]]:
    """Hydra's train.log handler (job_logging), with the logger that holds it."""
    return [
        (logger, h)
        for logger in (logging.getLogger(), logging.getLogger("hogwild"))
        for h in logger.handlers
        if isinstance(h, logging.FileHandler)
        and os.path.dirname(os.path.abspath(h.baseFilename)) == folder
    ]


def _save_hydra_files(cfg, output_dir: str) -> None:
    """What Hydra writes to `.hydra/` (hydra.output_subdir is null in train.yaml): written here,
    once this run holds its folder, so that a second run into it cannot overwrite them."""
    from hydra.core.hydra_config import HydraConfig
    from omegaconf import OmegaConf

    from hogwild.run import folder as run_folder

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


def remove_if_empty(folder: str) -> None:
    """The run folder, and the empty folders Hydra made above it (outputs/<date>/), up to the
    working directory. (Also for the folders Hydra makes for a sweep's jobs that never run.)"""
    stop, path = Path.cwd().resolve(), Path(folder).resolve()
    while path != stop and stop in path.parents:
        try:
            path.rmdir()
        except FileNotFoundError:  # removed already (the run's Claim): on to the one above
            pass
        except OSError:
            return
        path = path.parent


def _train(run, raw: dict, setup, ahead, started_at: float | None, save_config):
    import contextlib

    from hogwild.run.folder import Claim

    # A single node holds its run folder from the start: a Ctrl-C while torch is imported
    # then leaves no folder behind (the claim removes a fresh one that never started). Under
    # torchrun only rank 0 claims it, once the nodes have met (`_start`).
    if run.distributed.mode != "torchrun":
        setup.claim = Claim(run.output_dir)
    with setup.claim or contextlib.nullcontext():
        return _start(run, raw, setup, ahead, started_at, save_config)


def _start(run, raw: dict, setup, ahead, started_at: float | None, save_config):
    import contextlib

    from hogwild.process import forkserver
    from hogwild.run import preflight
    from hogwild.run.folder import Claim

    timeline = setup.timeline
    # the fork server (started before the config, hogwild.cli.main) imports torch while this one does
    with timeline.phase("fork_server_launch"):
        ahead.settle(run.trainer.start_method)
    with timeline.phase("torch_import"):
        import torch
    from hogwild.cli.builders import optimizer_class

    optimizer = optimizer_class(run.optimizer)
    if forkserver.needs_dynamo(run.trainer.start_method, run.shared_optimizer, optimizer):
        forkserver.import_dynamo()  # in a thread, while the data is built

    from hogwild.distributed.node import LocalNode

    # Before any torch work in this process: an OpenMP pool used here and then inherited
    # through fork hangs any child that asks for more than one thread.
    torch.set_num_threads(1)
    node, claim = LocalNode(), None
    try:
        if run.distributed.mode == "torchrun":
            from hogwild.distributed.torchrun import NodeSync

            node = NodeSync(run.distributed, torch.device(run.trainer.device))
            _tag_log_lines(f"[node {node.rank}] ")
            if node.is_writer:  # the node that writes holds the run folder to its last write
                claim = setup.claim = Claim(run.output_dir)
        with claim or contextlib.nullcontext():
            if node.is_writer:
                # a folder this run may not write is refused before its record is touched:
                # `.hydra/` of a finished run stays as that run wrote it. (Under torchrun the
                # nodes hear of a refusal in pre-flight, where they agree on the run.)
                if run.distributed.mode != "torchrun":
                    preflight.check_folder(run.output_dir, run.resume_from)
                save_config()
            return _fit(run, raw, setup, started_at, node)
    finally:
        node.close()


def _fit(run, raw: dict, setup, started_at: float | None, node):
    from tqdm.contrib.logging import logging_redirect_tqdm

    from hogwild.cli import builders
    from hogwild.run import memory
    from hogwild.run.trainer import Trainer

    with setup.timeline.phase("data_and_model"):  # a data set, or an environment (A3C)
        data, model = builders.build_workload(run, node, started_at, memory.available())
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
        setup=setup,
    )
    with logging_redirect_tqdm():
        trainer.fit()
    return trainer


def _tag_log_lines(tag: str) -> None:
    """Under torchrun every node logs to the same terminal: say which node each line is from."""

    class Tag(logging.Filter):
        def filter(self, record: logging.LogRecord) -> bool:
            if not str(record.msg).startswith(tag):
                record.msg = f"{tag}{record.msg}"
            return True

    for handler in logging.getLogger().handlers:
        handler.addFilter(Tag())


def _print_report(trainer) -> int:
    """The few lines a user reads at the end of a run (rank 0's; the other nodes say one)."""
    node = trainer.node
    summary = trainer.summary
    if not node.is_writer:
        print(
            f"node {node.rank}: {summary.status}, {summary.total_samples:,} samples "
            f"({summary.samples_per_second or 0:,.0f}/s); rank 0 writes the run's files"
        )
        return summary.exit_code
    failure, lines = summary.console_lines(trainer.output_dir)
    if summary.status != "completed" and not summary.distributed:
        if os.path.exists(os.path.join(trainer.output_dir, "checkpoints", "last.pt")):
            from hydra.core.hydra_config import HydraConfig
            from omegaconf import OmegaConf

            from hogwild.cli.resume import command, config_dir_given

            sources = OmegaConf.to_container(HydraConfig.get().runtime.config_sources)
            again = command(shown_path(trainer.output_dir), config_dir_given(sources))
            lines.append(f"  {'resume with':<14} {again}")
    if failure:
        print(failure, file=sys.stderr)
    try:
        print("\n".join(lines), flush=True)
    except BrokenPipeError:  # `hogwild train | head -1`: a reader that left is not a failure
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, sys.stdout.fileno())  # nor is Python's flush of stdout at exit
        os.close(devnull)
    return summary.exit_code
