#!/usr/bin/env python3
"""Puts several reports of bench/data-plane/run side by side: for each measure of the reports' two
median tables, every run's median, the median of those, and their spread (min - max), for ours,
haproxy, direct and ours / haproxy. It reads the generated Markdown (what report.py wrote), so the
measures are exactly the reports' own.

    bench/data-plane/across_runs.py RUN1.md RUN2.md RUN3.md > table.md
"""
import re
import statistics
import sys


def tables(path):
    """The report's generated tables (above its hand-written part), each a list of rows of cells."""
    text = open(path).read().split("<!-- Everything below this line")[0]
    found, current = [], []
    for line in text.splitlines():
        if line.startswith("|"):
            current.append([c.strip() for c in line.strip("|").split("|")])
        elif current:
            found.append(current)
            current = []
    if current:
        found.append(current)
    return found


def number(cell):
    """A cell's value (`1.07×`, `7.94`, `–`), or None."""
    match = re.match(r"^\*{0,2}(-?[0-9.]+)", cell.replace(",", ""))
    return float(match.group(1)) if match else None


def median_tables(path):
    """The two tables of medians (latency/throughput and proxy CPU), as {measure: {column: value}}."""
    out = {}
    for table in tables(path):
        header = table[0]
        if not header[0].startswith("measure (median"):
            continue
        for row in table[2:]:
            out[row[0]] = {column: number(cell) for column, cell in zip(header[1:], row[1:])}
    return out


def fmt(v):
    if v is None:
        return "–"
    return f"{v:.2f}" if abs(v) < 100 else f"{v:.0f}"


def main(paths):
    runs = [median_tables(p) for p in paths]
    columns = ["ours", "haproxy", "direct", "ours / haproxy"]
    print(f"| measure (median of each run's medians; min – max over {len(runs)} runs) | "
          + " | ".join(columns) + " |")
    print("| --- |" + " ---: |" * len(columns))
    for measure in runs[0]:
        cells = []
        for column in columns:
            values = [r.get(measure, {}).get(column) for r in runs]
            values = [v for v in values if v is not None]
            if not values:
                cells.append("–")
                continue
            cells.append(f"{fmt(statistics.median(values))} ({fmt(min(values))} – {fmt(max(values))})")
        print(f"| {measure} | " + " | ".join(cells) + " |")


if __name__ == "__main__":
    main(sys.argv[1:])
