#!/usr/bin/env python
"""Soak check: does a long run stay flat? (minutes, not hours)

Starts `python -m hogwild train` (synthetic data, MLP, 2 workers, many short epochs, periodic
checkpoints) as a subprocess, samples every second the RSS, PSS, open files and threads of the
orchestrator and of every process below it (fork server, resource tracker, workers), then stops
the run with SIGINT, as Ctrl-C would, and checks that it ends `interrupted` with exit code 130
and leaves no process behind.

    python scripts/soak.py                 # ~120 s
    python scripts/soak.py --quick         # ~30 s
    python scripts/soak.py --seconds 600 --out soak-runs/

Verdict "flat": after the warm-up, no process's memory (PSS where readable, else RSS) grows by
more than --max-growth-mb AND --max-growth-pct, and no open-file count changes. The table, the
samples and the verdict go to soak.json. Exit code: 0 flat, 1 something grows, 2 the run itself
misbehaved (ended early, wrong exit code, wrong status, processes left behind).
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import psutil

MB = 2**20


def parse_args(argv=None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument(
        "--seconds", type=float, default=120.0, help="how long to sample the run (default 120)"
    )
    p.add_argument("--quick", action="store_true", help="a ~30 s check (same as --seconds 30)")
    p.add_argument(
        "--warmup",
        type=float,
        default=None,
        help="seconds not judged at the start (default: a quarter of the run, 5..30 s)",
    )
    p.add_argument(
        "--out",
        type=Path,
        default=None,
        help="folder for the run and soak.json (default: a temp folder)",
    )
    p.add_argument("--workers", type=int, default=2)
    p.add_argument("--start-method", default="forkserver", choices=["fork", "spawn", "forkserver"])
    p.add_argument(
        "--sharing-strategy", default="file_descriptor", choices=["file_descriptor", "file_system"]
    )
    p.add_argument(
        "--num-samples",
        type=int,
        default=5000,
        help="training samples per epoch (small: short epochs)",
    )
    p.add_argument("--max-growth-mb", type=float, default=20.0)
    p.add_argument("--max-growth-pct", type=float, default=5.0)
    p.add_argument("--interval", type=float, default=1.0, help="seconds between samples")
    p.add_argument("overrides", nargs="*", help="extra Hydra overrides for the run")
    args = p.parse_args(argv)
    if args.quick:
        args.seconds = 30.0
    if args.warmup is None:
        args.warmup = min(30.0, max(5.0, args.seconds / 4))
    if args.warmup >= args.seconds:
        p.error("--warmup must be shorter than --seconds")
    return args


def run_command(args, run_dir: Path) -> list[str]:
    return [
        sys.executable,
        "-m",
        "hogwild",
        "train",
        f"hydra.run.dir={run_dir}",
        "data=synthetic",
        f"data.num_samples={args.num_samples}",
        "data.num_test_samples=500",
        "model=mlp",
        f"trainer.num_workers={args.workers}",
        f"trainer.start_method={args.start_method}",
        f"trainer.sharing_strategy={args.sharing_strategy}",
        "trainer.epochs=1000000",
        "checkpoint.every_seconds=5",
        *args.overrides,
    ]


# ---- sampling ----


def role_of(proc: psutil.Process, root: psutil.Process, forkservers: set[int]) -> str:
    if proc.pid == root.pid:
        return "orchestrator"
    try:
        cmdline = " ".join(proc.cmdline())
        ppid = proc.ppid()
    except (psutil.NoSuchProcess, psutil.AccessDenied, psutil.ZombieProcess):
        return "?"
    if "resource_tracker" in cmdline:
        return "resource_tracker"
    if "torch_shm_manager" in cmdline:
        return "torch_shm_manager"
    if "forkserver" in cmdline and ppid == root.pid:
        forkservers.add(proc.pid)
        return "forkserver"
    return "worker"  # a fork/spawn child of the orchestrator, or a child of the fork server


def measure(proc: psutil.Process) -> dict | None:
    try:
        with proc.oneshot():
            rss = proc.memory_info().rss
            try:
                pss = getattr(proc.memory_full_info(), "pss", None)
            except (psutil.AccessDenied, NotImplementedError):
                pss = None
            return {"rss": rss, "pss": pss, "fds": proc.num_fds(), "threads": proc.num_threads()}
    except (psutil.NoSuchProcess, psutil.ZombieProcess, psutil.AccessDenied):
        return None


class Sampler:
    def __init__(self, root_pid: int):
        self.root = psutil.Process(root_pid)
        self.forkservers: set[int] = set()
        self.procs: dict[int, dict] = {}  # pid -> {"role", "cmd", "samples": [(t, metrics)]}
        self.t0 = time.monotonic()

    def sample(self) -> None:
        t = round(time.monotonic() - self.t0, 2)
        try:
            tree = [self.root, *self.root.children(recursive=True)]
        except psutil.NoSuchProcess:
            return
        for proc in tree:
            metrics = measure(proc)
            if metrics is None:
                continue
            entry = self.procs.get(proc.pid)
            if entry is None:
                role = role_of(proc, self.root, self.forkservers)
                entry = self.procs[proc.pid] = {"role": role, "first_seen": t, "samples": []}
            entry["samples"].append((t, metrics))

    def pids(self) -> list[int]:
        return list(self.procs)


# ---- judging ----


def memory_of(metrics: dict) -> int:
    return metrics["pss"] if metrics["pss"] is not None else metrics["rss"]


def judge(sampler: Sampler, args) -> tuple[list[dict], list[str]]:
    rows, problems = [], []
    workers = 0
    for pid, entry in sampler.procs.items():
        samples = entry["samples"]
        judged = [m for t, m in samples if t >= args.warmup]
        row = {
            "pid": pid,
            "role": entry["role"],
            "samples": len(samples),
            "first_seen_s": entry["first_seen"],
            "memory_kind": "pss" if samples and samples[0][1]["pss"] is not None else "rss",
        }
        for key, values in (
            ("mem", [memory_of(m) for _, m in samples]),
            ("rss", [m["rss"] for _, m in samples]),
            ("fds", [m["fds"] for _, m in samples]),
            ("threads", [m["threads"] for _, m in samples]),
        ):
            row[f"{key}_first"], row[f"{key}_last"], row[f"{key}_max"] = (
                values[0],
                values[-1],
                max(values),
            )
        if entry["role"] == "worker":
            workers += 1
        if len(judged) < 6:
            row["growth_mb"] = row["growth_pct"] = row["fds_change"] = None
            row["verdict"] = "too short to judge"
            if entry["role"] == "worker" or entry["role"] == "orchestrator":
                problems.append(
                    f"{entry['role']} {pid}: only {len(judged)} samples after the warm-up "
                    "(started late or died early)"
                )
            rows.append(row)
            continue
        # medians of the first and last three judged samples: one sample taken mid-checkpoint
        # (an extra fd, a transient buffer) is not a trend
        base_mem = statistics.median(memory_of(m) for m in judged[:3])
        end_mem = statistics.median(memory_of(m) for m in judged[-3:])
        base_fds = statistics.median(m["fds"] for m in judged[:3])
        end_fds = statistics.median(m["fds"] for m in judged[-3:])
        growth = end_mem - base_mem
        row["growth_mb"] = round(growth / MB, 2)
        row["growth_pct"] = round(100 * growth / base_mem, 2) if base_mem else 0.0
        row["fds_change"] = int(end_fds - base_fds)
        verdicts = []
        if growth > args.max_growth_mb * MB and row["growth_pct"] > args.max_growth_pct:
            verdicts.append("MEMORY GROWS")
            problems.append(
                f"{entry['role']} {pid}: memory grew {row['growth_mb']} MiB ({row['growth_pct']}%) "
                "after the warm-up"
            )
        if row["fds_change"] != 0:
            verdicts.append("FDS CHANGE")
            problems.append(
                f"{entry['role']} {pid}: open files went from {int(base_fds)} to {int(end_fds)} "
                "after the warm-up"
            )
        row["verdict"] = ", ".join(verdicts) or "flat"
        rows.append(row)
    if workers < args.workers:
        problems.append(f"saw {workers} worker process(es), expected {args.workers}")
    elif workers > args.workers:
        problems.append(
            f"saw {workers} worker processes for {args.workers} ranks: workers were replaced"
        )
    return rows, problems


def print_table(rows: list[dict], args) -> None:
    mem_label = "PSS" if rows and all(r["memory_kind"] == "pss" for r in rows) else "mem"
    header = (
        f"{'process':<18} {'pid':>7} {'n':>4}  {mem_label + ' MiB first/last/max':>26}  {'growth':>17}  "
        f"{'fds first/last/max':>18}  {'thr':>3}  verdict"
    )
    print(header)
    print("-" * len(header))
    order = {"orchestrator": 0, "forkserver": 1, "worker": 2, "resource_tracker": 3}
    for r in sorted(rows, key=lambda r: (order.get(r["role"], 9), r["first_seen_s"], r["pid"])):
        mem = f"{r['mem_first'] / MB:7.1f}/{r['mem_last'] / MB:7.1f}/{r['mem_max'] / MB:7.1f}"
        growth = (
            "n/a"
            if r["growth_mb"] is None
            else f"{r['growth_mb']:+.1f} MiB {r['growth_pct']:+.1f}%"
        )
        fds = f"{r['fds_first']}/{r['fds_last']}/{r['fds_max']}"
        print(
            f"{r['role']:<18} {r['pid']:>7} {r['samples']:>4}  {mem:>26}  {growth:>17}  {fds:>18}  "
            f"{r['threads_last']:>3}  {r['verdict']}"
        )
    total_first = sum(r["mem_first"] for r in rows)
    total_last = sum(r["mem_last"] for r in rows)
    total = f"{total_first / MB:7.1f}/{total_last / MB:7.1f}/{'':>7}"
    print(f"{'total':<18} {'':>7} {'':>4}  {total:>26}")
    print(
        f"(growth: median of the last 3 samples minus median of the first 3 after a {args.warmup:.0f} s warm-up; "
        f"'grows' = more than {args.max_growth_mb:g} MiB and {args.max_growth_pct:g}%)"
    )


# ---- the run ----


def stop_run(proc: subprocess.Popen, timeout: float = 60.0) -> tuple[int | None, float]:
    sent = time.monotonic()
    if proc.poll() is None:
        proc.send_signal(signal.SIGINT)
    try:
        proc.wait(timeout=timeout)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait()
        return None, time.monotonic() - sent
    return proc.returncode, time.monotonic() - sent


def main(argv=None) -> int:
    args = parse_args(argv)
    out = args.out or Path(tempfile.mkdtemp(prefix="hogwild-soak-"))
    out.mkdir(parents=True, exist_ok=True)
    run_dir = out / "run"
    if (run_dir / "summary.json").exists():
        print(f"soak: {run_dir} already holds a run; pick another --out", file=sys.stderr)
        return 2
    command = run_command(args, run_dir)
    env = {**os.environ, "HOGWILD_PROGRESS": "0"}
    print(f"soak: {' '.join(command[1:])}")
    print(
        f"soak: sampling for {args.seconds:.0f} s (warm-up {args.warmup:.0f} s), output in {out}",
        flush=True,
    )
    log_path = out / "run.log"
    problems: list[str] = []
    with open(log_path, "w") as log_file:
        # its own session: a Ctrl-C on this script is passed on as one SIGINT, below
        proc = subprocess.Popen(
            command,
            stdout=log_file,
            stderr=subprocess.STDOUT,
            env=env,
            cwd=out,
            start_new_session=True,
        )
        sampler = Sampler(proc.pid)
        deadline = time.monotonic() + args.seconds
        interrupted_by_user = False
        try:
            while time.monotonic() < deadline and proc.poll() is None:
                tick = time.monotonic()
                sampler.sample()
                time.sleep(max(0.0, args.interval - (time.monotonic() - tick)))
        except KeyboardInterrupt:
            interrupted_by_user = True
            problems.append("the soak was cut short by Ctrl-C")
        ended_early = proc.poll() is not None
        if ended_early:
            problems.append(
                f"the run ended by itself after {time.monotonic() - sampler.t0:.0f} s "
                f"with exit code {proc.returncode} (see {log_path})"
            )
        pids = sampler.pids()
        code, stop_seconds = stop_run(proc)
    if not ended_early:
        if code is None:
            problems.append("the run did not end within 60 s of SIGINT; killed")
        elif code != 130:
            problems.append(
                f"the run ended with exit code {code} after SIGINT, expected 130 (see {log_path})"
            )
    summary = None
    try:
        summary = json.loads((run_dir / "summary.json").read_text())
    except (OSError, ValueError):
        problems.append(f"no readable {run_dir / 'summary.json'}")
    if summary is not None and not ended_early and summary.get("status") != "interrupted":
        problems.append(f"summary.json says {summary.get('status')!r}, expected 'interrupted'")
    if summary is not None and not (run_dir / "checkpoints" / "last.pt").exists():
        problems.append("no checkpoints/last.pt after the interrupt")
    # every process of the run must be gone within a few seconds
    left = []
    for _ in range(50):
        left = [pid for pid in pids if _alive(pid)]
        if not left:
            break
        time.sleep(0.1)
    if left:
        problems.append(f"processes left behind after the run ended: {left}")

    rows, growth_problems = judge(sampler, args)
    run_problems = list(problems)
    print()
    print_table(rows, args)
    print()
    if summary:
        print(
            f"run: status {summary.get('status')}, exit code {code}, stopped {stop_seconds:.1f} s after SIGINT, "
            f"{summary.get('samples_seen', 0):,} samples, {summary.get('samples_per_second') or 0:,.0f} samples/s"
        )
    verdict = (
        "flat"
        if not growth_problems and not run_problems
        else ("GROWS" if growth_problems else "RUN PROBLEM")
    )
    for line in run_problems + growth_problems:
        print(f"  - {line}")
    print(f"verdict: {verdict}")
    report = {
        "verdict": verdict,
        "problems": run_problems + growth_problems,
        "settings": {k: (str(v) if isinstance(v, Path) else v) for k, v in vars(args).items()},
        "command": command,
        "exit_code": code,
        "stop_seconds": round(stop_seconds, 2),
        "summary": summary,
        "processes": rows,
        "samples": {
            str(pid): {"role": e["role"], "samples": e["samples"]}
            for pid, e in sampler.procs.items()
        },
    }
    (out / "soak.json").write_text(json.dumps(report, indent=1))
    print(f"soak.json: {out / 'soak.json'}")
    if interrupted_by_user:
        return 130
    if run_problems:
        return 2
    return 1 if growth_problems else 0


def _alive(pid: int) -> bool:
    try:
        return psutil.Process(pid).status() != psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return False


if __name__ == "__main__":
    sys.exit(main())
