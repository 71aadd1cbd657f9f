"""Nsight Compute's details page (`ncu --import REPORT --page details`, text) as one markdown row a kernel launch:
what bounds each kernel of a step at a glance (session 20's table in docs/BENCHMARKS.md was made by hand from it).

Columns: the kernel, grid x threads, registers, duration, warp instructions executed, the issue slots used (the
schedulers' "One or More Eligible"), achieved occupancy, DRAM throughput, and the waves the grid takes. `--merge`
takes launches of the same kernel, grid and block together (the median of each column), in order of first launch.

Usage: python3 tools/device/ncu_table.py DETAILS.log [--merge]
   or: ncu --import step.ncu-rep --page details | python3 tools/device/ncu_table.py - --merge
"""

from __future__ import annotations

import argparse
import re
import statistics
import sys

HEADER = re.compile(r"^  (\S+) \(([\d, ]+)\)x\(([\d, ]+)\), Context")
METRICS = {  # column: the metric's name on the page
    "regs": "Registers Per Thread",
    "duration": "Duration",
    "instructions": "Executed Instructions",
    "issue": "One or More Eligible",
    "occupancy": "Achieved Occupancy",
    "dram": "DRAM Throughput",
    "waves": "Waves Per SM",
}
UNITS = {"duration": {"ns": 1e-3, "us": 1.0, "ms": 1e3}}  # to us


def _size(text: str) -> int:
    x, y, z = (int(v) for v in text.split(","))
    return x * y * z


def parse(text: str) -> list[dict]:
    """The page's launches in order: {name, grid, threads, and each of METRICS that the page has}."""
    launches: list[dict] = []
    for line in text.splitlines():
        head = HEADER.match(line)
        if head:
            launches.append({"name": head.group(1), "grid": _size(head.group(2)), "threads": _size(head.group(3))})
            continue
        if not launches:
            continue
        for column, metric in METRICS.items():
            found = re.match(rf"^\s+{re.escape(metric)}\s+(\S+)?\s+([\d,.]+)\s*$", line)
            if found and column not in launches[-1]:
                unit, value = found.group(1), float(found.group(2).replace(",", ""))
                launches[-1][column] = value * UNITS.get(column, {}).get(unit or "", 1.0)
    return launches


def merged(launches: list[dict]) -> list[dict]:
    """Launches of one kernel, grid and block as one row: each column's median, in order of first launch."""
    groups: dict[tuple, list[dict]] = {}
    for launch in launches:
        groups.setdefault((launch["name"], launch["grid"], launch["threads"]), []).append(launch)
    rows = []
    for (name, grid, threads), group in groups.items():
        row = {"name": name, "grid": grid, "threads": threads, "launches": len(group)}
        for column in METRICS:
            values = [g[column] for g in group if column in g]
            if values:
                row[column] = statistics.median(values)
        rows.append(row)
    return rows


def table(rows: list[dict]) -> str:
    def cell(row: dict, column: str, form: str) -> str:
        return form.format(row[column]) if column in row else "-"

    lines = ["| kernel | grid x threads | regs | duration | warp instructions | issue slots used | achieved occupancy "
             "| DRAM | waves |", "|---|---|---:|---:|---:|---:|---:|---:|---:|"]
    for row in rows:
        name = row["name"] + (f" ({row['launches']} launches)" if row.get("launches", 1) > 1 else "")
        lines.append(f"| {name} | {row['grid']} x {row['threads']} | {cell(row, 'regs', '{:.0f}')} | "
                     f"{cell(row, 'duration', '{:.2f} us')} | {cell(row, 'instructions', '{:,.0f}')} | "
                     f"{cell(row, 'issue', '{:.0f} %')} | {cell(row, 'occupancy', '{:.1f} %')} | "
                     f"{cell(row, 'dram', '{:.1f} %')} | {cell(row, 'waves', '{:.2f}')} |")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("details", help="the details page as text, or - for standard input")
    parser.add_argument("--merge", action="store_true", help="one row per kernel, grid and block (medians)")
    args = parser.parse_args(argv)
    text = sys.stdin.read() if args.details == "-" else open(args.details).read()
    launches = parse(text)
    if not launches:
        print(f"{args.details}: no kernel launches on this page (is it `ncu --page details` output?)",
              file=sys.stderr)
        return 1
    print(table(merged(launches) if args.merge else launches))
    return 0


if __name__ == "__main__":
    sys.exit(main())
