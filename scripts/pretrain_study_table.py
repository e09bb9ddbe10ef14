"""Tables of the sparse-pretraining study (scripts/pretrain_study.sh) from its output root's registry.

    python scripts/pretrain_study_table.py OUT_ROOT [--out FILE.md]

Prints the MLM table (every pretraining run: eval loss, perplexity, masked-token accuracy, steps, samples/s,
recompiles after warm-up) and the GLUE table (``run.py --table glue --agg mean`` over the study's runs). The study
finetunes each model on each task in a process of its own, named ``glue_from=RUN~TASK``; here those rows are
labelled ``glue_from=RUN`` again, so each pretrained model is one row.
"""

from __future__ import annotations

import argparse
import dataclasses
import math
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "src"))

from sparsebert.results import Registry, glue_table  # noqa: E402


def mlm_table(records) -> str:
    lines = ["| run | steps | MLM eval loss | perplexity | masked-token acc. | sparsity | samples/s | recompiles "
             "after warm-up |", "|---|---|---|---|---|---|---|---|"]
    for rec in sorted(records, key=lambda r: r.experiment):
        m = rec.metrics
        sparsity = "dense" if rec.sparsity is None else f"{rec.sparsity:.3f}"
        accuracy = m.get("masked_accuracy")
        recompiles = m.get("recompiles_after_warmup")  # the registry keeps numbers as floats
        lines.append(f"| `{rec.experiment}` | {m.get('global_step', 0):.0f} | {m['eval_loss']:.3f} | "
                     f"{math.exp(m['eval_loss']):.1f} | {'-' if accuracy is None else f'{100 * accuracy:.1f} %'} | "
                     f"{sparsity} | {m.get('train_samples_per_second', 0):.0f} | "
                     f"{'-' if recompiles is None else int(recompiles)} |")
    return "\n".join(lines)


def study_glue_records(registry: Registry):
    """The study's GLUE rows, each labelled with the pretraining run it started from."""
    records = registry.runs(task_prefix="glue:")
    return [dataclasses.replace(r, group=r.experiment.split("~")[0]) for r in records]


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("root", type=Path)
    parser.add_argument("--out", type=Path, help="also write the tables to this markdown file")
    args = parser.parse_args()
    registry = Registry.in_output_root(args.root, read_only=True)
    parts = ["## MLM", "", mlm_table(registry.runs(task_prefix="mlm")), ""]
    glue = study_glue_records(registry)
    if glue:
        parts += ["## GLUE (mean over seeds)", "", glue_table(glue, agg="mean"), ""]
    text = "\n".join(parts)
    print(text)
    if args.out:
        args.out.write_text(text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
