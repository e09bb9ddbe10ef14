"""Plots for docs and run directories (matplotlib, headless). Inputs are plain data: Trainer log histories."""

from __future__ import annotations

import os
from pathlib import Path

from sparsebert.errors import SparseBertError
from sparsebert.io import atomic_path
from sparsebert.sparsity.report import module_label


def _pyplot():
    """matplotlib's pyplot on the headless Agg backend, or the one-line error that names the extra to install
    (matplotlib is the optional ``plots`` extra: without it ``--plot`` would end in an import traceback)."""
    import importlib.util

    if importlib.util.find_spec("matplotlib") is None:
        raise SparseBertError("--plot needs matplotlib: pip install 'sparsebert[plots]'")
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt


def run_colors(n: int) -> list:
    """``n`` distinct colours: matplotlib's default cycle up to 10 runs, then tab20, then evenly spaced on a
    continuous map (the default cycle repeats after 10, which would give two runs of a study one colour)."""
    import matplotlib

    if n <= 10:
        return [f"C{i}" for i in range(n)]
    if n <= 20:
        return [matplotlib.colormaps["tab20"](i) for i in range(n)]
    return [matplotlib.colormaps["turbo"](i / (n - 1)) for i in range(n)]


def plot_loss_curves(histories: dict[str, list[dict]], path: str | os.PathLike, title: str = "MLM loss",
                     x: str = "step") -> None:
    """Training loss (thin) and eval loss (markers) against ``x`` (``"step"``: optimizer steps, or ``"epoch"``:
    a finetuning run's epochs.json rows), one colour per run."""
    plt = _pyplot()
    fig, ax = plt.subplots(figsize=(7, 4.2), dpi=120)
    for color, (name, history) in zip(run_colors(len(histories)), histories.items()):
        train = [(h[x], h["loss"]) for h in history if "loss" in h and x in h]
        evals = [(h[x], h["eval_loss"]) for h in history if "eval_loss" in h and x in h]
        if train:
            ax.plot(*zip(*train), color=color, alpha=0.45, linewidth=1, label=f"{name} train")
        if evals:
            ax.plot(*zip(*evals), color=color, marker="o", linewidth=1.8, label=f"{name} eval")
    ax.set_xlabel("optimizer step" if x == "step" else x)
    ax.set_ylabel("loss")
    ax.set_yscale("log")
    ax.grid(alpha=0.3)
    _finish(fig, ax, title, path)


def plot_density_per_layer(reports: dict[str, dict], path: str | os.PathLike,
                           title: str = "density per layer") -> None:
    """Density (1 - sparsity) of every masked tensor, in model order, one line per run.

    ``reports``: run name -> its ``sparsity.json`` (the ``layers`` list of name / type / sparsity). Vertical
    lines separate encoder layers, so a uniform distribution shows as a flat line and ERK as a profile.
    """
    import re

    plt = _pyplot()
    fig, ax = plt.subplots(figsize=(8, 4.2), dpi=120)
    for color, (name, report) in zip(run_colors(len(reports)), reports.items()):
        ax.plot(range(len(report["layers"])), [1.0 - layer["sparsity"] for layer in report["layers"]],
                color=color, marker=".", linewidth=1.2, label=name)
    # layer boundaries and a tick per tensor, named by module ("0 Q" ... "0 FFN out"), from the deepest model
    layers = max((report["layers"] for report in reports.values()), key=len)
    index = [re.search(r"layer\.(\d+)\.", layer["name"]) for layer in layers]
    starts = [k for k, m in enumerate(index) if m and (k == 0 or not index[k - 1]
                                                          or index[k - 1].group(1) != m.group(1))]
    for k in starts[1:]:
        ax.axvline(k - 0.5, color="grey", alpha=0.3, linewidth=0.8)
    ax.set_xticks(range(len(layers)), [module_label(layer["name"]).removeprefix("layer ") for layer in layers],
                  fontsize=6 if len(layers) <= 48 else 4, rotation=90)
    ax.set_xlabel("encoder layer and module (Q K V O: attention; FFN in / out)")
    ax.set_ylabel("density (fraction of weights kept)")
    ax.set_ylim(0, max(0.3, ax.get_ylim()[1]))
    ax.grid(alpha=0.3, axis="y")
    _finish(fig, ax, title, path)


def _finish(fig, ax, title: str, path: str | os.PathLike) -> None:
    """Title, legend, layout; then save atomically (temp file + rename) and close the figure."""
    import matplotlib.pyplot as plt

    ax.set_title(title)
    if len(ax.get_legend_handles_labels()[0]) > 8:  # many runs: the legend beside the plot, not over the curves
        fig.set_size_inches(fig.get_figwidth() + 4, fig.get_figheight())
        ax.legend(fontsize=7, loc="upper left", bbox_to_anchor=(1.01, 1.0))
    else:
        ax.legend(fontsize=8)
    fig.tight_layout()
    path = Path(path)
    try:
        # the temp file keeps the suffix and the format is explicit: savefig picks neither from ".tmp"
        with atomic_path(path, suffix=path.suffix) as tmp:
            fig.savefig(tmp, format=path.suffix.lstrip(".").lower())
    finally:
        plt.close(fig)
