"""The benchmark's figures: ratios between rows, the table, the plot, the machine."""

from __future__ import annotations

import os
import platform
import sys
import time
from typing import Any

import torch

from hogwild.reporting.text import print_cells

BASE_IMPL = {"framework-step": "framework", "ddp": "plain"}


def add_ratios(rows: list[dict]) -> None:
    def find(**want):
        return next(
            (
                r
                for r in rows
                if r["samples_per_second"] and all(r[k] == v for k, v in want.items())
            ),
            None,
        )

    def ratio(row, ref):
        return (
            round(row["samples_per_second"] / ref["samples_per_second"], 3)
            if ref and row["samples_per_second"]
            else None
        )

    for r in rows:
        # the extra rows scale against the 1-worker row they differ from (hogwild.bench.recipes)
        same = dict(model=r["model"], impl=BASE_IMPL.get(r["impl"], r["impl"]))
        r["speedup"] = ratio(
            r,
            find(
                **same,
                start_method=r["start_method"],
                sharing_strategy=r["sharing_strategy"],
                num_workers=1,
                threads=1,
            ),
        )
        singles = [
            x
            for x in rows
            if x["model"] == r["model"] and x["threads"] > 1 and x["samples_per_second"]
        ]
        r["vs_single_process"] = ratio(
            r, max(singles, key=lambda x: x["samples_per_second"], default=None)
        )
        key = dict(
            model=r["model"], impl="plain", num_workers=r["num_workers"], threads=r["threads"]
        )
        ref = find(**key, start_method=r["start_method"]) or find(**key, start_method="fork")
        framework = r["impl"] in ("framework", "framework-step")
        r["vs_plain"] = ratio(r, ref) if framework else None
        ddp = find(model=r["model"], impl="ddp", num_workers=r["num_workers"])
        r["vs_ddp"] = ratio(r, ddp) if framework else None


def print_table(rows: list[dict]) -> None:
    cols = [
        ("model", "model", "{}"),
        ("impl", "impl", "{}"),
        ("start", "start_method", "{}"),
        ("sharing", "sharing_strategy", "{}"),
        ("workers", "num_workers", "{}"),
        ("thr", "threads", "{}"),
        ("samples/s", "samples_per_second", "{:,.0f}"),
        ("speed-up", "speedup", "{:.2f}x"),
        ("vs 1proc", "vs_single_process", "{:.2f}x"),
        ("fw/plain", "vs_plain", "{:.2f}"),
        ("fw/ddp", "vs_ddp", "{:.2f}"),
        ("start-up s", "startup_seconds", "{:.2f}"),
        ("PSS MB", "pss_mb", "{:,.0f}"),
    ]
    cells = [[c[0] for c in cols]] + [
        [("-" if r.get(k) is None else f.format(r[k])) for _, k, f in cols] for r in rows
    ]
    print_cells(cells, left=4)
    for r in rows:
        if r.get("error"):
            print(
                f"FAILED {r['model']} {r['impl']} {r['start_method']}/{r['sharing_strategy']} "
                f"x{r['num_workers']}: {r['error']}"
            )


def pyplot(path) -> Any:
    """matplotlib.pyplot for writing files, or None (and a line saying so) when not installed."""
    try:
        import matplotlib
    except ImportError:
        print(
            f"no plot written to {path}: matplotlib is not installed (pip install 'hogwild[bench]')",
            file=sys.stderr,
        )
        return None
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt


STYLES = {
    "framework": "-s",
    "framework-step": "-.d",
    "plain": "--o",
    "ddp": ":^",
}  # bench.png: a line style per impl


def plot(rows: list[dict], path: str) -> None:
    plt = pyplot(path)
    if plt is None:
        return

    models = list(dict.fromkeys(r["model"] for r in rows))
    # the legend goes below each chart, never over its lines
    fig, axes = plt.subplots(1, len(models), figsize=(6 * len(models), 6.5), squeeze=False)
    for ax, model in zip(axes[0], models):
        mine = [r for r in rows if r["model"] == model and r["samples_per_second"]]
        settings = list(dict.fromkeys((r["start_method"], r["sharing_strategy"]) for r in mine))
        for kind in dict.fromkeys(
            (r["impl"], r["start_method"], r["sharing_strategy"]) for r in mine
        ):
            pts = sorted(
                (r["num_workers"], r["samples_per_second"])
                for r in mine
                if (r["impl"], r["start_method"], r["sharing_strategy"]) == kind
                and r["threads"] == 1
            )
            if pts:  # one colour per start method + strategy, one line style per implementation
                ax.plot(
                    *zip(*pts),
                    STYLES.get(kind[0], "-.x"),
                    label=" ".join(kind),
                    color=f"C{settings.index(kind[1:]) % 10}",
                )
        for r in (r for r in mine if r["threads"] > 1):
            ax.axhline(
                r["samples_per_second"],
                ls=(0, (6, 2, 1, 2)) if r["impl"] == "plain" else (0, (1, 1)),  # not a line's
                lw=1,
                color=f"C{settings.index((r['start_method'], r['sharing_strategy'])) % 10}",
                label=f"{r['impl']} {r['start_method']}: 1 process x {r['threads']} threads",
            )
        ax.set(title=model, xlabel="workers", ylabel="samples/s (steady state)", ylim=(0, None))
        ax.set_xticks(sorted({r["num_workers"] for r in mine}))
        ax.grid(alpha=0.3)
        ax.legend(fontsize=7, loc="upper center", bbox_to_anchor=(0.5, -0.14), ncol=2)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    print(f"wrote {path}")


def machine_info(cores: int, mode: str) -> dict:
    try:
        with open("/proc/cpuinfo") as f:
            cpu = next(line.split(":", 1)[1].strip() for line in f if line.startswith("model name"))
    except (OSError, StopIteration):
        cpu = platform.processor()
    return dict(
        cores=cores,
        cpu=cpu,
        torch=torch.__version__,
        python=platform.python_version(),
        platform=platform.platform(),
        load_average=os.getloadavg(),
        mode=mode,
        date=time.strftime("%Y-%m-%d %H:%M:%S"),
    )
