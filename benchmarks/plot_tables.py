"""Plots of the measured benchmark tables in ``docs/benchmarks.md``: ``python benchmarks/plot_tables.py``.

Each benchmark prints its figures and they are pasted, as printed, into ``docs/benchmarks.md``; this
script reads those printed tables back (nothing is re-measured or typed in twice) and draws one figure per
benchmark into ``docs/benchmarks_<name>.png``, with the targets drawn as lines. Re-run it after pasting new
figures. Needs matplotlib (the ``[bench]`` extra).
"""

from __future__ import annotations

import argparse
import re
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]


def fenced_blocks(markdown: str) -> dict[str, list[list[str]]]:
    """The fenced blocks of each ``## `` section, as lists of lines, keyed by the heading's first word(s)."""
    sections: dict[str, list[list[str]]] = {}
    heading = ""
    block: list[str] | None = None
    for line in markdown.splitlines():
        if block is None and line.startswith("## "):
            heading = line[3:].split(" — ")[0].strip()
            sections.setdefault(heading, [])
        elif line.startswith("```"):
            if block is None:
                block = []
            else:
                sections.setdefault(heading, []).append(block)
                block = None
        elif block is not None:
            block.append(line)
    return sections


def rows(blocks: list[list[str]], first: re.Pattern[str]) -> list[list[str]]:
    """The whitespace-split lines whose first field matches ``first``, from every block of a section."""
    return [line.split() for block in blocks for line in block if line.split() and first.fullmatch(line.split()[0])]


def plot_triggerer(blocks: list[list[str]], plt: Any) -> Any:
    table = [r for r in rows(blocks, re.compile(r"triggers|to_thread")) if len(r) == 11 and r[1].isdigit()]
    fig, (reads_ax, rss_ax) = plt.subplots(1, 2, figsize=(9, 3.6))
    for pattern, style in (("triggers", "o-"), ("to_thread", "s--")):
        mine = [r for r in table if r[0] == pattern]
        n = [int(r[1]) for r in mine]
        reads_ax.plot(n, [float(r[7]) for r in mine], style, label=pattern)
        rss_ax.plot(n, [float(r[2]) for r in mine], style, label=pattern)
    top = max(int(r[1]) for r in table)
    reads_ax.plot([0, top], [0, top], ":", color="grey", label="one GET per job")
    reads_ax.set(xlabel="concurrent waits", ylabel="ARM reads per poll interval", yscale="symlog")
    rss_ax.axhline(400, color="red", linestyle=":", label="target 400 MB")
    rss_ax.set(xlabel="concurrent waits", ylabel="peak RSS (MB)", ylim=(0, 450))
    for ax in (reads_ax, rss_ax):
        ax.legend(fontsize=8)
    fig.suptitle("Triggerer scale: one process, N waits")
    return fig


def plot_resubmit(blocks: list[list[str]], plt: Any) -> Any:
    table = [r for r in rows(blocks, re.compile(r"(polling|deferred)(_fixed_backoff)?")) if len(r) == 6]
    bound = next(
        float(m.group(1)) for block in blocks for line in block if (m := re.search(r"bound = .*= ([\d.]+)s", line))
    )
    fig, ax = plt.subplots(figsize=(6.5, 3.4))
    names = [r[0] for r in table]
    x = range(len(names))
    ax.bar([i - 0.2 for i in x], [float(r[2]) for r in table], width=0.4, label="p50")
    ax.bar([i + 0.2 for i in x], [float(r[3]) for r in table], width=0.4, label="max")
    ax.axhline(bound, color="red", linestyle=":", label=f"bound {bound:g} s")
    ax.set_xticks(list(x), [n.replace("_fixed_backoff", "\nold back-off") for n in names], fontsize=8)
    ax.set(ylabel="preempted job ended -> next job created (s)")
    ax.legend(fontsize=8)
    fig.suptitle("Resubmission latency (old back-off: the baseline)")
    return fig


def plot_dag_parse(blocks: list[list[str]], plt: Any) -> Any:
    blocks = blocks[:1]  # the section's first block is the latest run; the later ones are older runs, for comparison
    table = [r for r in rows(blocks, re.compile(r"[a-z_]+_scoring")) if len(r) == 8]
    control = {
        m.group(2): float(m.group(1))
        for block in blocks
        for line in block
        if (m := re.search(r"control .* x([\d.]+) over the baseline; (\S+) x", line))
    }
    target = next(
        float(m.group(1)) for block in blocks for line in block if (m := re.search(r"target <= x([\d.]+)", line))
    )
    fig, ax = plt.subplots(figsize=(6.5, 3.4))
    names = [r[0] for r in table]
    x = range(len(names))
    ax.bar(
        [i - 0.2 for i in x], [control.get(n, float("nan")) for n in names], width=0.4, label="control (Airflow alone)"
    )
    ax.bar([i + 0.2 for i in x], [float(r[4]) for r in table], width=0.4, label="example DAG")
    ax.axhline(target, color="red", linestyle=":", label=f"target x{target:g}")
    ax.set_xticks(list(x), names, fontsize=8)
    ax.set(ylabel="CPU over `import airflow.sdk`", ylim=(1.0, max(1.15, *(float(r[4]) for r in table)) + 0.02))
    ax.legend(fontsize=8)
    fig.suptitle("DAG parse: CPU ratio, median of the triples")
    return fig


def plot_emulator_load(blocks: list[list[str]], plt: Any) -> Any:
    table = [r for r in rows(blocks, re.compile(r"baseline|load")) if len(r) == 11 and r[1].isdigit()]
    fig, ax = plt.subplots(figsize=(6.5, 3.4))
    percentiles = ("p50", "p95", "p99")
    x = range(len(percentiles))
    for offset, row in zip((-0.2, 0.2), table, strict=False):
        ax.bar([i + offset for i in x], [float(v) for v in row[4:7]], width=0.4, label=f"{row[0]} ({row[1]} pollers)")
    ax.set_xticks(list(x), percentiles)
    ax.set(ylabel="request latency (ms)", yscale="log")
    ax.legend(fontsize=8)
    fig.suptitle("Emulator under load: one poller against 200")
    return fig


def backfill_table(blocks: list[list[str]]) -> tuple[list[list[str]], float]:
    """The rows of ``benchmarks/backfill.py``'s table (first block that has them) and its ratio target.

    Tables before the ``ahead`` column (the capacity pool's ``queue_ahead``) have 13 columns: they ran with 0.
    """
    for block in blocks:
        table = [r if len(r) == 14 else [*r, "0"] for r in rows([block], re.compile(r"\d+")) if len(r) in (13, 14)]
        if table:
            target = next(
                float(m.group(1)) for line in block if (m := re.search(r"ratio to the ideal .*\(>= ([\d.]+)\)", line))
            )
            return table, target
    raise ValueError("no backfill table")


def plot_backfill(blocks: list[list[str]], plt: Any) -> Any:
    table, target = backfill_table(blocks)
    table.sort(key=lambda r: int(r[0]))
    fig, (wall_ax, ratio_ax) = plt.subplots(1, 2, figsize=(9, 3.6))
    for ahead in sorted({r[13] for r in table}, key=int):
        part = [r for r in table if r[13] == ahead]
        sizes = [int(r[0]) for r in part]
        label = f" (queue_ahead {ahead})"
        wall_ax.plot(sizes, [float(r[5]) / 60 for r in part], "o-", label="wall" + label)
        wall_ax.plot(sizes, [float(r[7]) / 60 for r in part], "s--", label="cluster-bound ideal" + label)
        ratio_ax.plot(sizes, [float(r[8]) for r in part], "o-", label="ideal / wall" + label)
    wall_ax.set(xlabel="intervals in the backfill", ylabel="minutes", ylim=(0, None))
    ratio_ax.axhline(target, color="red", linestyle=":", label=f"target {target:g}")
    ratio_ax.set(xlabel="intervals in the backfill", ylabel="ratio to the ideal", ylim=(0, 1.05))
    for ax in (wall_ax, ratio_ax):
        ax.legend(fontsize=8)
    fig.suptitle("Backfill on the Celery deployment, 4 partitions an interval")
    return fig


def draw_backfill(blocks: list[list[str]], path: Path) -> None:
    """``plot_backfill`` into ``path``: what ``benchmarks/backfill.py --plot`` writes from its own printed table."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig = plot_backfill(blocks, plt)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


PLOTS: dict[str, tuple[str, Callable[[list[list[str]], Any], Any]]] = {
    "triggerer": ("Triggerer scale", plot_triggerer),
    "resubmit_latency": ("Resubmission latency", plot_resubmit),
    "dag_parse": ("DAG parse", plot_dag_parse),
    "emulator_load": ("Emulator under load", plot_emulator_load),
    "backfill": ("Backfills", plot_backfill),
}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--doc", type=Path, default=ROOT / "docs" / "benchmarks.md")
    parser.add_argument("--out", type=Path, default=ROOT / "docs")
    args = parser.parse_args()
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        print("matplotlib is not installed (pip install -e '.[bench]')", file=sys.stderr)
        return 1
    sections = fenced_blocks(args.doc.read_text(encoding="utf-8"))
    for name, (heading, plot) in PLOTS.items():
        if heading not in sections:
            print(f"no section {heading!r} in {args.doc}: benchmarks_{name}.png not drawn", file=sys.stderr)
            continue
        fig = plot(sections[heading], plt)
        fig.tight_layout()
        path = args.out / f"benchmarks_{name}.png"
        fig.savefig(path, dpi=110)
        plt.close(fig)
        print(f"wrote {path}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
