"""Draw estimates: one stacked bar per strategy, its compute time split by
op kind and its communication by mesh axes, so one estimate shows where a
step goes and several compare side by side. Needs matplotlib (the `plot`
extra); the PNG is written private to the user."""

from __future__ import annotations

import io
from collections.abc import Mapping
from pathlib import Path

from partir.cost.estimate import Estimate
from partir.generated_files import write_private


def plot_estimates(estimates: Mapping[str, Estimate], path: str | Path) -> Path:
    """Write a PNG of `estimates` (label -> estimate) to `path`; returns it."""
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError as err:
        raise ImportError(
            "plotting an estimate needs matplotlib: pip install 'partir[plot]'"
        ) from err

    parts: dict[str, dict[str, float]] = {}
    for label, e in estimates.items():
        for kind, seconds in e.by_kind.items():
            parts.setdefault(f"compute: {kind}", {})[label] = seconds
        for axes, seconds in e.by_axes.items():
            parts.setdefault(f"comm: {'×'.join(axes)}", {})[label] = seconds
    labels = list(estimates)
    figure, axis = plt.subplots(figsize=(8, 1.2 + 0.6 * len(labels)))
    left = [0.0] * len(labels)
    for name, by_label in sorted(parts.items()):
        widths = [by_label.get(label, 0.0) * 1e3 for label in labels]
        axis.barh(labels, widths, left=left, label=name)
        left = [a + b for a, b in zip(left, widths, strict=True)]
    axis.set_xlabel(f"predicted step (ms) on {next(iter(estimates.values())).profile}")
    axis.invert_yaxis()
    axis.legend(fontsize="small", loc="upper left", bbox_to_anchor=(1.01, 1.0))
    figure.tight_layout()
    buffer = io.BytesIO()
    figure.savefig(buffer, format="png", dpi=100)
    plt.close(figure)
    return write_private(Path(path), buffer.getvalue())
