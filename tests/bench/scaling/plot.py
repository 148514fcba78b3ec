"""Plots run.sh's lines: sync time against workers, one panel per link
speed, measured (points) and the alpha-beta model (dashed lines).

    python3 plot.py scaling.txt scaling.png
"""
import re
import sys

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402

LINE = re.compile(
    r"^scaling method=(\S+) workers=(\d+) link_gbps=(\S+) sync_seconds=(\S+) model_seconds=(\S+)$")
STYLE = {"ring": ("tab:blue", "o"), "ps_one": ("tab:red", "s"), "ps_sharded": ("tab:green", "^")}


def main(src, dst):
    points = {}
    for line in open(src):
        m = LINE.match(line.strip())
        if m:
            method, n, gbps, sync, model = m.groups()
            points.setdefault(gbps, {}).setdefault(method, []).append(
                (int(n), float(sync), float(model)))
    if not points:
        sys.exit("plot.py: no 'scaling method=...' lines in %s" % src)
    fig, axes = plt.subplots(1, len(points), figsize=(5.5 * len(points), 4), squeeze=False)
    for ax, gbps in zip(axes[0], sorted(points, key=float)):
        for method, rows in sorted(points[gbps].items()):
            rows.sort()
            color, marker = STYLE.get(method, ("black", "x"))
            ns = [r[0] for r in rows]
            ax.plot(ns, [r[1] for r in rows], marker=marker, color=color, label=method + " measured")
            ax.plot(ns, [r[2] for r in rows], "--", color=color, alpha=0.6, label=method + " model")
        ax.set_title("link %s Gbit/s" % gbps)
        ax.set_xlabel("workers")
        ax.set_ylabel("seconds to synchronize one gradient")
        ax.set_xticks(sorted({r[0] for rows in points[gbps].values() for r in rows}))
        ax.grid(alpha=0.3)
        ax.legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(dst, dpi=100)


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2])
