"""Plots for the benchmark report: matplotlib without a display, one PNG per figure.

Only this module imports matplotlib (requirements-bench.txt), and only when a plot is drawn,
so the tools that draw nothing (`python -m bench.ab`, …) and the tests never need it.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any


def figure(width: float = 6.4, height: float = 4.0, ncols: int = 1) -> tuple[Any, Any]:
    """A new (figure, axes) pair on the headless Agg backend (axes: a list when ncols > 1)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, ncols, figsize=(width, height), dpi=100, squeeze=False)
    for ax in axes[0]:
        ax.grid(True, alpha=0.3)
    return fig, list(axes[0]) if ncols > 1 else axes[0][0]


def save(fig: Any, path: Path) -> str:
    """Write ``fig`` as a PNG, close it, return the file name (for ``report.Plot``)."""
    import matplotlib.pyplot as plt

    fig.tight_layout()
    fig.savefig(path, format="png")
    plt.close(fig)
    return path.name


# One colour per path in every figure; a path's second series (p99, non-stream) is dashed.
COLORS = {
    "direct": "tab:blue",
    "nginx-only": "tab:green",
    "floor": "tab:gray",
    "gateway": "tab:orange",
    "gateway+keys": "tab:red",
}


def color(label: str) -> str | None:
    return next((c for name, c in COLORS.items() if name in label.split()), None)


def cdf(ax: Any, series: dict[str, list[float]], xlabel: str, title: str) -> None:
    """One empirical CDF per series (values in ms) on ``ax``."""
    for label, values in series.items():
        ordered = sorted(values)
        if ordered:
            n = len(ordered)
            ys = [(i + 1) / n for i in range(n)]
            ax.step(ordered, ys, where="post", label=label, color=color(label))
    ax.set_xlabel(xlabel)
    ax.set_ylabel("fraction of calls")
    ax.set_title(title, fontsize=10)
    ax.legend(fontsize=8)


def lines(
    ax: Any,
    series: dict[str, tuple[list[float], list[float]]],
    xlabel: str,
    ylabel: str,
    title: str,
) -> None:
    """One line with markers per series of (x values, y values) on ``ax``."""
    for label, (xs, ys) in series.items():
        dashed = "p99" in label or "non-stream" in label
        ax.plot(xs, ys, "--" if dashed else "-", marker="o", label=label, color=color(label))
    ax.set_xlabel(xlabel)
    ax.set_ylabel(ylabel)
    ax.set_title(title, fontsize=10)
    ax.legend(fontsize=8)
