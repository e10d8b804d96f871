"""`python -m hogwild doctor [--json]`: is this machine ready for Hogwild training, and how
should `trainer` be set here?

Exit status 0 when a default run can work; 1 with the reasons when it cannot.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import resource
import shutil
import sys
from typing import Any

from hogwild.process.sharing import FD_HEADROOM, SHM_DIR

MIN_SHM_BYTES = 64 * 2**20  # less than this and even the digits run is at risk
MIN_SHARED_TENSORS = 64  # a small model plus the data set, under file_descriptor


def _cuda() -> dict[str, Any]:
    import torch

    if torch.version.cuda is None:
        return {
            "available": False,
            "why": "this torch is a CPU-only build (install a CUDA build of torch for GPUs)",
        }
    if not torch.cuda.is_available():
        return {
            "available": False,
            "why": f"torch built for CUDA {torch.version.cuda}, but no usable GPU or driver",
        }
    devices = []
    for i in range(torch.cuda.device_count()):
        p = torch.cuda.get_device_properties(i)
        devices.append({"index": i, "name": p.name, "memory_gib": round(p.total_memory / 2**30, 1)})
    return {"available": True, "cuda_version": torch.version.cuda, "devices": devices}


def examine() -> dict[str, Any]:
    import torch
    import torch.multiprocessing as mp

    from hogwild.config.schema import usable_cores

    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    limit = hard if hard != resource.RLIM_INFINITY else 1 << 20
    try:
        shm = shutil.disk_usage(SHM_DIR)
        shm_info = {"path": SHM_DIR, "size_mib": shm.total // 2**20, "free_mib": shm.free // 2**20}
    except FileNotFoundError:
        shm_info = {"path": SHM_DIR, "size_mib": None, "free_mib": None}
    report: dict[str, Any] = {
        "python": platform.python_version(),
        "torch": torch.__version__,
        "torch_build": f"CUDA {torch.version.cuda}" if torch.version.cuda else "CPU",
        "cores_usable": usable_cores(),
        "cores_total": os.cpu_count(),
        "sharing_strategies": sorted(mp.get_all_sharing_strategies()),
        "default_sharing_strategy": mp.get_sharing_strategy(),
        "start_methods": mp.get_all_start_methods(),
        "open_files": {
            "soft": soft,
            "hard": hard,
            "shared_tensors_file_descriptor": max(0, limit - FD_HEADROOM),
        },
        "shm": shm_info,
        "cuda": _cuda(),
    }
    problems = []
    if shm_info["free_mib"] is not None and shm.free < MIN_SHM_BYTES:
        problems.append(
            f"{SHM_DIR} has only {shm_info['free_mib']} MiB free: enlarge it (docker --shm-size=1g)"
        )
    fd_ok = limit - FD_HEADROOM >= MIN_SHARED_TENSORS
    if not fd_ok and "file_system" not in report["sharing_strategies"]:
        problems.append(
            f"the open-file hard limit ({hard}) is too low and file_system sharing is unavailable"
        )
    method = "forkserver" if "forkserver" in report["start_methods"] else "spawn"
    cores = report["cores_usable"]
    report["recommended"] = {
        "trainer.num_workers": cores,
        "trainer.threads_per_worker": 1,
        "trainer.start_method": method,
        "trainer.sharing_strategy": "file_descriptor" if fd_ok else "file_system",
        "trainer.device": "cuda" if report["cuda"]["available"] else "cpu",
    }
    report["problems"] = problems
    report["ready"] = not problems
    return report


def _print(r: dict[str, Any]) -> None:
    of, shm, cuda = r["open_files"], r["shm"], r["cuda"]
    rows = [
        ("python / torch", f"{r['python']} / {r['torch']} ({r['torch_build']} build)"),
        ("CPU cores", f"{r['cores_usable']} usable of {r['cores_total']}"),
        (
            "sharing strategies",
            f"{', '.join(r['sharing_strategies'])} (default {r['default_sharing_strategy']})",
        ),
        ("start methods", ", ".join(r["start_methods"])),
        (
            "open files",
            f"soft {of['soft']}, hard {of['hard']}: about {of['shared_tensors_file_descriptor']} "
            "shared tensors under file_descriptor (the soft limit is raised as needed)",
        ),
        (
            "/dev/shm",
            "absent"
            if shm["size_mib"] is None
            else f"{shm['free_mib']} MiB free of {shm['size_mib']} MiB",
        ),
        (
            "CUDA",
            ", ".join(
                f"cuda:{d['index']} {d['name']} ({d['memory_gib']} GiB)" for d in cuda["devices"]
            )
            if cuda["available"]
            else f"none: {cuda['why']}",
        ),
    ]
    width = max(len(k) for k, _ in rows)
    for key, value in rows:
        print(f"{key:<{width}}  {value}")
    print("\nrecommended for this machine:")
    print("  python -m hogwild train " + " ".join(f"{k}={v}" for k, v in r["recommended"].items()))
    if r["problems"]:
        print("\nNOT READY:")
        for p in r["problems"]:
            print(f"  - {p}")
    else:
        print("\nready.")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="hogwild doctor", description=__doc__.splitlines()[0])
    parser.add_argument("--json", action="store_true", help="print the report as JSON")
    args = parser.parse_args(argv)
    report = examine()
    if args.json:
        json.dump(report, sys.stdout, indent=2)
        print()
    else:
        _print(report)
    return 0 if report["ready"] else 1
