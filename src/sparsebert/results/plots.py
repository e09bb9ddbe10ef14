"""Plots for docs and run directories (matplotlib, headless). Inputs are plain data: Trainer log histories."""

from __future__ import annotations

import os
from pathlib import Path


def plot_loss_curves(histories: dict[str, list[dict]], path: str | os.PathLike, title: str = "MLM loss") -> None:
    """Training loss (thin) and eval loss (markers) against optimizer steps, one colour per run."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(7, 4.2), dpi=120)
    for i, (name, history) in enumerate(histories.items()):
        color = f"C{i}"
        train = [(h["step"], h["loss"]) for h in history if "loss" in h and "step" in h]
        evals = [(h["step"], h["eval_loss"]) for h in history if "eval_loss" in h and "step" in h]
        if train:
            ax.plot(*zip(*train), color=color, alpha=0.45, linewidth=1, label=f"{name} train")
        if evals:
            ax.plot(*zip(*evals), color=color, marker="o", linewidth=1.8, label=f"{name} eval")
    ax.set_xlabel("optimizer step")
    ax.set_ylabel("loss")
    ax.set_yscale("log")
    ax.set_title(title)
    ax.grid(alpha=0.3)
    ax.legend(fontsize=8)
    fig.tight_layout()
    path = Path(path)
    tmp = path.with_name(f".{path.name}.tmp{path.suffix}")
    fig.savefig(tmp)
    plt.close(fig)
    os.replace(tmp, path)
