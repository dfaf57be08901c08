"""Plots for the benchmark report: matplotlib without a display, one PNG per figure.

Only this module imports matplotlib (requirements-bench.txt), and only when a plot is drawn,
so `python -m bench relay` and the tests never need it.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any


def figure(width: float = 6.4, height: float = 4.0) -> tuple[Any, Any]:
    """A new (figure, axes) pair on the headless Agg backend."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(width, height), dpi=100)
    ax.grid(True, alpha=0.3)
    return fig, ax


def save(fig: Any, path: Path) -> str:
    """Write ``fig`` as a PNG, close it, return the file name (for ``report.Plot``)."""
    import matplotlib.pyplot as plt

    fig.tight_layout()
    fig.savefig(path, format="png")
    plt.close(fig)
    return path.name
