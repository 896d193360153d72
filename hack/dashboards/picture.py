#!/usr/bin/env python3
"""Draws docs/dashboard.png: the hoplink Grafana dashboard's panels, laid out
as the dashboard lays them out, over the series a real Prometheus answered
while it scraped a real local network (the dump TestDashboardQueriesReturnData
writes with HOPLINK_DASHBOARD_DUMP). No Grafana can be installed here, so
matplotlib draws what Grafana would.

    HOPLINK_DASHBOARD_DUMP=/tmp/dash.json go test -run TestDashboardQueriesReturnData -timeout 15m ./hack/dashboards
    python3 -m pip install matplotlib
    python3 hack/dashboards/picture.py /tmp/dash.json docs/dashboard.png
"""
import json
import sys
from datetime import datetime, timezone

import matplotlib

matplotlib.use("Agg")
import matplotlib.dates as mdates  # noqa: E402
import matplotlib.pyplot as plt  # noqa: E402

BG, PANEL, FG, GRID = "#111217", "#181b1f", "#ccccdc", "#2c3235"
COLORS = ["#73bf69", "#f2cc0c", "#5794f2", "#ff9830", "#f2495c", "#b877d9", "#8ab8ff", "#fade2a"]
SCALE = {"s": (1000, "ms"), "bytes": (1 / 2**20, "MiB"), "Bps": (8 / 1e6, "Mbit/s"),
         "percentunit": (100, "%"), "percent": (1, "%"), "d": (1, "days")}


def when(ts):
    return datetime.fromtimestamp(ts, tz=timezone.utc)


def draw(dump, out):
    panels = dump["panels"]
    rows = max(p["gridPos"]["y"] + p["gridPos"]["h"] for p in panels)
    fig = plt.figure(figsize=(20, rows * 0.34), facecolor=BG)
    # Route changes, as Grafana's annotation marks them: where the chains'
    # change counters step up (the annotation's own query holds for a
    # minute after each change, too long to place one).
    annotations = []
    for p in panels:
        if p["title"] == "Route changes":
            for ser in p["series"]:
                pts = ser["points"]
                annotations += [when(t) for (t, v), (_, u) in zip(pts[1:], pts) if v > u]
    for p in panels:
        g = p["gridPos"]
        left, width = g["x"] / 24, g["w"] / 24
        top, height = 1 - g["y"] / rows, g["h"] / rows
        if p["type"] == "row":
            fig.text(left + 0.005, top - height / 2, p["title"], color=FG, fontsize=13, weight="bold", va="center")
            continue
        ax = fig.add_axes([left + 0.03, top - height + 0.012, width - 0.036, height - 0.03], facecolor=PANEL)
        ax.set_title(p["title"], color=FG, fontsize=10, loc="left")
        for side in ax.spines.values():
            side.set_color(GRID)
        ax.tick_params(colors=FG, labelsize=7)
        if p["type"] == "table":
            ax.set_xticks([])
            ax.set_yticks([])
            lines = sorted({s["legend"].strip() for s in p["series"] if s["points"] and s["points"][-1][1] == 1})
            for i, line in enumerate(lines[:8]):
                ax.text(0.03, 0.85 - i * 0.12, line, color=FG, fontsize=9, transform=ax.transAxes, family="monospace")
            continue
        factor, unit = SCALE.get(p.get("unit") or "", (1, p.get("unit") or ""))
        for i, s in enumerate(p["series"][:8]):
            pts = s["points"]
            if not pts:
                continue
            ax.plot([when(t) for t, _ in pts], [v * factor for _, v in pts], color=COLORS[i % len(COLORS)],
                    linewidth=1.2, label=s["legend"][:40])
        for a in annotations:
            ax.axvline(a, color="#ff9830", linewidth=1, linestyle="--", alpha=0.8)
        ax.grid(color=GRID, linewidth=0.5)
        ax.xaxis.set_major_formatter(mdates.DateFormatter("%H:%M:%S"))
        ax.ticklabel_format(axis="y", useOffset=False, style="plain")
        if unit:
            ax.set_ylabel(unit, color=FG, fontsize=7)
        if p["series"]:
            ax.legend(fontsize=6, loc="upper left", facecolor=PANEL, edgecolor=GRID, labelcolor=FG, ncol=2)
    fig.savefig(out, dpi=80, facecolor=BG)


if __name__ == "__main__":
    with open(sys.argv[1]) as f:
        draw(json.load(f), sys.argv[2])
