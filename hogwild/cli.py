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


def config_dir() -> str:
    """configs/ ships inside the wheel as hogwild/configs; a source checkout has it at the top."""
    here = Path(__file__).resolve().parent
    for candidate in (here / "configs", here.parent / "configs"):
        if (candidate / "train.yaml").is_file():
            return str(candidate)
    raise FileNotFoundError(
        f"hogwild's configs are missing (looked in {here / 'configs'} and {here.parent / 'configs'})"
    )


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
    import hydra

    exit_codes: list[int] = []
    started_at = _process_start_time()
    register_defaults()

    @hydra.main(version_base="1.3", config_path=config_dir(), config_name="train")
    def task(cfg) -> None:
        nonlocal started_at
        exit_codes.append(run_job(cfg, started_at))
        started_at = time.time()  # the next job of a sweep starts now

    saved_argv = sys.argv
    sys.argv = ["hogwild train", *overrides]
    try:
        task()
    finally:
        sys.argv = saved_argv
    return max(exit_codes, default=0)


def run_job(cfg, started_at: float | None = None) -> int:
    """One training run from a composed config; returns the process exit code."""
    from hydra.core.hydra_config import HydraConfig
    from omegaconf import OmegaConf

    from hogwild.errors import HogwildError
    from hogwild.run_config import build_run_config

    try:  # a bad value is refused before torch is even imported (~2 s)
        raw = OmegaConf.to_container(cfg, resolve=True, throw_on_missing=True)
        run = build_run_config(raw, HydraConfig.get().runtime.output_dir)
        trainer = _train(run, raw, started_at)
    except HogwildError as e:
        print(f"hogwild: error: {e}", file=sys.stderr)
        return 2
    return _report(trainer)


def _train(run, raw: dict, started_at: float | None):
    import torch
    from tqdm.contrib.logging import logging_redirect_tqdm

    from hogwild import builders
    from hogwild.node import LocalNode
    from hogwild.supervisor import prestart
    from hogwild.trainer import Trainer

    # Before any torch work in this process: an OpenMP pool used here and then inherited
    # through fork hangs any child that asks for more than one thread.
    torch.set_num_threads(1)
    node = LocalNode()
    try:
        if run.distributed.mode == "torchrun":
            from hogwild.distributed import NodeSync

            node = NodeSync(run.distributed, torch.device(run.trainer.device))
        prestart(run.trainer.start_method)  # the fork server boots while the data loads (seconds)
        data = node.shard(builders.build_data(run.data))
        model = builders.build_model(
            run.model, data.input_shape, data.num_classes, data.model_kwargs
        )
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
    finally:
        node.close()
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
    print("\n".join(lines))
    return summary.exit_code


def _process_start_time() -> float:
    try:
        import psutil

        return psutil.Process().create_time()
    except Exception:  # noqa: BLE001 - wall time is then measured from here
        return time.time()
