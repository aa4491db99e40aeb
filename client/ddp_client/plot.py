"""Metrics against the step, one panel per metric, to a PNG (matplotlib, no display needed)."""

from __future__ import annotations

from pathlib import Path

from .downsample import largest_triangles
from .metricrecords import Series

POINTS_PER_PANEL = 2000  # more than the panel has pixels across: a long run's curve looks the same


def plot_series(series: Series, path: Path, title: str = "", width_in: float = 8.0, panel_in: float = 2.5,
                dpi: int = 100) -> Series:
    """One panel per metric (loss first), sharing the step axis, at most POINTS_PER_PANEL points each
    (largest_triangles); the PNG is width_in x panels*panel_in inches. Returns what the figure's lines
    hold, read back from them."""
    import matplotlib

    matplotlib.use("Agg", force=False)
    from matplotlib.figure import Figure

    if not series:
        raise ValueError("no metrics to plot: the job's ranks logged none (log_metrics), submitted none as "
                         "dask-pytorch-ddp's workers do (results/worker/<rank>/*.json), and printed no metric line")
    names = sorted(series, key=lambda name: (name != "loss", name))
    figure = Figure(figsize=(width_in, panel_in * len(names)), dpi=dpi)
    axes = figure.subplots(len(names), 1, sharex=True, squeeze=False)[:, 0]
    drawn: Series = {}
    for axis, name in zip(axes, names, strict=True):
        steps, values = zip(*largest_triangles(series[name], POINTS_PER_PANEL), strict=True)
        (line,) = axis.plot(steps, values, label=name, marker="." if len(steps) < 50 else None)
        drawn[name] = [(int(x), float(y)) for x, y in line.get_xydata()]
        axis.set_ylabel(name)
        axis.grid(True, alpha=0.3)
    axes[-1].set_xlabel("step")
    if title:
        axes[0].set_title(title)
    figure.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    figure.savefig(path, format="png")
    return drawn
