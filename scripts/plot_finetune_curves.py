"""The eval-score curves of docs/results.md "Sparse finetuning": one panel per task, x = share of training.

    python scripts/plot_finetune_curves.py curves.json curves.png   # the 02aa73c curves: docs/data/sparse_finetune/ at aabd373

The JSON maps "TASK LABEL" to the eval score after each epoch (from each run's epochs.json).
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402


def main(argv: list[str]) -> int:
    if len(argv) != 2:
        print(__doc__, file=sys.stderr)
        return 2
    curves = json.loads(Path(argv[0]).read_text())
    tasks = sorted({label.split()[0] for label in curves})
    variants = list(dict.fromkeys(label.split(" ", 1)[1] for label in curves))  # one colour per variant, all panels
    colours = {variant: f"C{i}" for i, variant in enumerate(variants)}
    fig, axes = plt.subplots(1, len(tasks), figsize=(5 * len(tasks), 3.8))
    for ax, task in zip(axes, tasks):
        for label, scores in curves.items():
            name, variant = label.split(" ", 1)
            if name == task:
                x = [(i + 1) / len(scores) for i in range(len(scores))]
                ax.plot(x, scores, marker="." if len(scores) > 8 else "o", color=colours[variant], label=variant)
        ax.set_title(task)
        ax.set_xlabel("share of training (epochs / all epochs)")
        ax.grid(alpha=0.3)
        ax.legend(fontsize=6, loc="lower right")
    axes[0].set_ylabel("dev score")
    fig.tight_layout()
    fig.savefig(argv[1], dpi=110)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
