#!/usr/bin/env python3
"""Draw BENCHMARKS.md's "At a glance" table as a bar chart of ratios (docs/glance.svg).

Python's standard library only (the machines here have no plotting package): it reads the table
itself, so the figure cannot say other than the table. Each row's bar is its ratio against the
peer (the first number of the ratio column; a range is drawn from its low end to its high end),
with the line at 1 (parity) and the issues' goal of 1.1.

    python3 bench/plot_glance.py [BENCHMARKS.md] [docs/glance.svg]

Exits 1 (writing nothing) when the table is missing or a row's ratio cannot be read.
"""

import html
import os
import re
import sys
import tempfile


def rows(text):
    """(label, low, high) for each row of the table under '## At a glance'."""
    m = re.search(r"^## At a glance.*?$(.*?)^## ", text, re.S | re.M)
    if not m:
        raise ValueError("no '## At a glance' section")
    out = []
    for line in m.group(1).splitlines():
        cells = [c.strip() for c in line.strip().strip("|").split("|")]
        if len(cells) < 5 or cells[0] in ("workload", "") or set(cells[0]) <= set("- "):
            continue
        ratio = cells[4]
        nums = re.findall(r"\*\*([0-9.]+)(?:[–-]([0-9.]+))?\*\*", ratio)
        if not nums:
            raise ValueError(f"row {cells[0]!r}: no bold ratio in {ratio!r}")
        lo, hi = nums[0]
        lo = float(lo)
        hi = float(hi) if hi else lo
        model = re.sub(r"[`*]", "", cells[1])
        out.append((f"{cells[0]} — {model}", lo, hi))
    if not out:
        raise ValueError("the table has no rows")
    return out


def svg(data):
    width, left, right, bar, gap, top = 980, 520, 40, 18, 10, 40
    height = top + len(data) * (bar + gap) + 40
    top_ratio = max(1.2, max(h for _, _, h in data) * 1.05)
    scale = (width - left - right) / top_ratio

    def x(v):
        return left + v * scale

    parts = [
        f'<svg xmlns="http://www.w3.org/2000/svg" width="{width}" height="{height}" '
        f'font-family="sans-serif" font-size="12">',
        f'<rect width="{width}" height="{height}" fill="white"/>',
        f'<text x="{left}" y="20" font-size="14">tarfa ÷ peer (above 1: tarfa faster), '
        "from BENCHMARKS.md's table</text>",
    ]
    for i, (label, lo, hi) in enumerate(data):
        y = top + i * (bar + gap)
        colour = "#2a7" if lo >= 1.1 else ("#c93" if hi >= 1.0 else "#c44")
        parts.append(
            f'<text x="{left - 8}" y="{y + bar - 5}" text-anchor="end">{html.escape(label[:80])}</text>'
        )
        parts.append(f'<rect x="{left}" y="{y}" width="{lo * scale:.1f}" height="{bar}" fill="{colour}"/>')
        if hi > lo:
            parts.append(
                f'<rect x="{x(lo):.1f}" y="{y}" width="{(hi - lo) * scale:.1f}" height="{bar}" '
                f'fill="{colour}" fill-opacity="0.4"/>'
            )
        text = f"{lo:.2f}" if hi == lo else f"{lo:.2f}–{hi:.2f}"
        parts.append(f'<text x="{x(hi) + 4:.1f}" y="{y + bar - 5}">{text}</text>')
    bottom = top + len(data) * (bar + gap)
    for v, dash, name in ((1.0, "", "parity"), (1.1, "4,3", "goal 1.1")):
        parts.append(
            f'<line x1="{x(v):.1f}" y1="{top - 6}" x2="{x(v):.1f}" y2="{bottom}" stroke="#333" '
            f'stroke-dasharray="{dash}"/>'
        )
        parts.append(f'<text x="{x(v):.1f}" y="{bottom + 16}" text-anchor="middle">{name}</text>')
    parts.append("</svg>")
    return "\n".join(parts) + "\n"


def main():
    src = sys.argv[1] if len(sys.argv) > 1 else "BENCHMARKS.md"
    dst = sys.argv[2] if len(sys.argv) > 2 else "docs/glance.svg"
    try:
        with open(src, encoding="utf-8") as f:
            data = rows(f.read())
    except (OSError, ValueError) as e:
        print(f"plot_glance: {src}: {e}", file=sys.stderr)
        return 1
    out = svg(data)
    d = os.path.dirname(os.path.abspath(dst))
    fd, tmp = tempfile.mkstemp(dir=d, prefix=".glance.")
    with os.fdopen(fd, "w", encoding="utf-8") as f:
        f.write(out)
    os.replace(tmp, dst)
    print(f"{dst}: {len(data)} rows")
    return 0


if __name__ == "__main__":
    sys.exit(main())
