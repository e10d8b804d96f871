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


def config_dir() -> str:
    """configs/ ships inside the wheel as hogwild/configs; a source checkout has it at the top."""
    here = Path(__file__).resolve().parent
    for candidate in (here / "configs", here.parent / "configs"):
        if (candidate / "train.yaml").is_file():
            return str(candidate)
    raise FileNotFoundError(f"hogwild's configs are missing (looked in {here / 'configs'} and {here.parent / 'configs'})")


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
    print(f"hogwild: unknown command {command!r}; commands: train, doctor, bench (see `hogwild --help`)",
          file=sys.stderr)
    return 2


def train(overrides: list[str]) -> int:
    import hydra

    exit_codes: list[int] = []
    started_at = _process_start_time()

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
    import torch
    from hydra.core.hydra_config import HydraConfig
    from omegaconf import OmegaConf
    from tqdm.contrib.logging import logging_redirect_tqdm

    from hogwild import builders
    from hogwild.config import HogwildError, build_run_config
    from hogwild.supervisor import prestart
    from hogwild.trainer import Trainer

    # Before any torch work in this process: an OpenMP pool used here and then inherited
    # through fork hangs any child that asks for more than one thread.
    torch.set_num_threads(1)
    node = None
    try:
        raw = OmegaConf.to_container(cfg, resolve=True, throw_on_missing=True)
        run = build_run_config(raw, HydraConfig.get().runtime.output_dir)
        if run.distributed.mode == "torchrun":
            from hogwild.distributed import NodeSync

            node = NodeSync(run.distributed, torch.device(run.trainer.device))
        prestart(run.trainer.start_method)  # the fork server boots while the data loads (seconds)
        data = builders.build_data(run.data)
        if node:
            data = node.shard(data)
        model = builders.build_model(run.model, data.input_shape, data.num_classes, data.model_kwargs)
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
            summary = trainer.fit()
    except HogwildError as e:
        print(f"hogwild: error: {e}", file=sys.stderr)
        return 2
    finally:
        if node:
            node.close()
    if node and not node.is_writer:
        print(f"node {node.rank}: {summary['status']}, {summary['total_samples']:,} samples "
              f"({summary['samples_per_second'] or 0:,.0f}/s); rank 0 writes the run's files")
        return summary["exit_code"]
    _report(summary, run.output_dir)
    return summary["exit_code"]


def _report(summary: dict, output_dir: str) -> None:
    """The few lines a user reads at the end of a run: results and where everything is."""
    status, error = summary["status"], summary.get("error") or {}
    if status == "failed":
        who = "" if error.get("rank", -1) < 0 else f"worker {error['rank']}: "  # -1: the orchestrator itself
        print(f"hogwild: run failed: {who}{error.get('reason')}", file=sys.stderr)
    rel = os.path.relpath(output_dir)
    rel = output_dir if rel.startswith("..") else rel

    def fmt(value, spec: str, suffix: str = "") -> str:
        return "n/a" if value is None else f"{value:{spec}}{suffix}"

    rows = [
        ("test RMSE", fmt(summary["test_rmse"], ".4f")) if summary.get("task") == "regression" else
        ("test accuracy", fmt(summary["test_accuracy"] and 100 * summary["test_accuracy"], ".2f", "%")),
        ("test loss", fmt(summary["test_loss"], ".4f")),
        ("samples/s", f"{'node 0: ' if summary.get('distributed') else ''}"
                      f"{fmt(summary['samples_per_second'], ',.0f')} ({summary['num_workers']} workers, "
                      f"{summary['start_method']}, {summary['sharing_strategy']})"),
        ("samples", f"{summary['total_samples']:,} in {fmt(summary['train_seconds'], '.2f')} s of training, "
                    f"{summary['wall_seconds']:.1f} s in all"),
        *_node_rows(summary.get("distributed"), fmt),
        ("run folder", rel),
        ("checkpoint", os.path.join(rel, "checkpoints", "last.pt")
         + (" (the last one before the failure)" if status == "failed" else "")
         if os.path.exists(os.path.join(output_dir, "checkpoints", "last.pt")) else "none written"),
        ("dashboards", f"tensorboard --logdir {os.path.join(rel, 'tensorboard')}"),
    ]
    print(f"run {status}")
    for key, value in rows:
        print(f"  {key:<14} {value}")


def _node_rows(d: dict | None, fmt) -> list[tuple[str, str]]:
    """Under torchrun, the rows above are rank 0's own; these are the whole run's."""
    if not d:
        return []
    return [("all nodes", f"{d['world_size']} nodes, {fmt(d['samples_per_second_all_nodes'], ',.0f')} samples/s "
                          f"together, {fmt(d['samples_seen_all_nodes'], ',')} samples seen"),
            ("sync", f"{d['sync_rounds']} rounds, {d['sync_seconds']:.2f} s, {d['sync_bytes'] / 2**20:,.1f} MiB")]


def _process_start_time() -> float:
    try:
        import psutil

        return psutil.Process().create_time()
    except Exception:  # noqa: BLE001 - wall time is then measured from here
        return time.time()
