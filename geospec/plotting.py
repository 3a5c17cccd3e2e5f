"""Figures written into a run directory's ``plots/``: headless matplotlib, atomic PNG writes."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from geospec.atomic import atomic_path


def pyplot() -> Any:
    """matplotlib.pyplot on the headless Agg backend (imported only when plotting)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt


class PlotDir:
    """Saves figures as ``plots/<name>`` and remembers their paths relative to the run directory."""

    def __init__(self, run_dir: str | Path) -> None:
        self.path = Path(run_dir) / "plots"
        self.path.mkdir(parents=True, exist_ok=True)
        self.written: list[str] = []
        self.plt = pyplot()

    def save(self, fig: Any, name: str) -> None:
        with atomic_path(self.path / name) as tmp:
            fig.savefig(tmp, format="png", dpi=110, bbox_inches="tight")
        self.plt.close(fig)
        self.written.append(f"plots/{name}")
