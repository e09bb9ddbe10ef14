"""The tables of docs/results.md "Sparse finetuning" from a study's output root (scripts/finetune_study.sh).

    python scripts/finetune_report.py ROOT [--json runs.json]

Reads every ``registry.sqlite`` under ROOT and prints markdown: the GLUE table (``--table glue --agg mean``), the
GLUE average over seeds, SQuAD and GAP, each variant against its dense baseline, and the issue's targets.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import re
import statistics
import sys
from pathlib import Path

from sparsebert.results import RunRecord, RunRegistry, glue_table
from sparsebert.results.stats import sample_std

# dense, dense + KD, downstream pruning to 80 / 90 % + KD, and the fixed-mask transfers from upstream pruning
# (scripts/upstream_study.sh), by magnitude or by the oBERT score: experiment suffix -> row label, in table order
LABELS = {
    "": "dense",
    "_fast": "dense, GPU fast path (minilm_glue_fast, at 2eca325)",
    "_eager": "dense, eager (minilm_glue_eager)",
    "_kd": "dense + KD",
    "_downstream80": "80 %, downstream GMP + KD",
    "_downstream80_obs": "80 %, downstream oBERT + KD",
    "_downstream90": "90 %, downstream GMP + KD",
    "_downstream90_obs": "90 %, downstream oBERT + KD",
    "_from_upstream80": "80 %, upstream GMP, transfer + KD",
    "_from_upstream80_obs": "80 %, upstream oBERT, transfer + KD",
    "_from_upstream80_obs_long": "80 %, upstream oBERT for 16k steps, transfer + KD",
    "_from_upstream80_obs_cap90": "80 %, upstream oBERT, no tensor past 90 %, transfer + KD",
    "_from_upstream80_obs_attn": "80 %, upstream oBERT + the attention term, transfer + KD",
    "_from_upstream80_obs_nodropout": "80 %, upstream oBERT without dropout, transfer + KD",
    "_from_upstream80_obs_lr2e4": "80 %, upstream oBERT, transfer + KD at lr 2e-4",
    "_from_upstream80_obs_hidden": "80 %, upstream oBERT, transfer + KD + the teacher's layers",
    "_from_upstream90": "90 %, upstream GMP, transfer + KD",
    "_from_upstream90_obs": "90 %, upstream oBERT, transfer + KD",
    "_from_upstream90_obs_nodropout": "90 %, upstream oBERT without dropout, transfer + KD",
    "_from_upstream90_obs_attn": "90 %, upstream oBERT + the attention term, transfer + KD",
}
VARIANTS = tuple(LABELS)
BERT_TASKS = ("cola", "mrpc", "rte", "sst2", "stsb")
# (GLUE average_bert, SQuAD F1, GAP accuracy) may lose at most this many points against dense
AT_80, AT_90 = (1.0, 2.0, 1.5), (2.5, 5.0, 3.0)
# the level is the number after "upstream" / "downstream": "_from_upstream80_obs_cap90" is an 80 % model
SPARSITY_LEVEL = re.compile(r"(?:upstream|downstream)(80|90)")
TARGETS = {suffix: AT_90 if level[1] == "90" else AT_80
           for suffix in VARIANTS if (level := SPARSITY_LEVEL.search(suffix))}


def records(root: Path) -> list[RunRecord]:
    found = []
    for path in sorted(root.glob("**/registry.sqlite")):
        found += RunRegistry(path, read_only=True).runs()
    return found


def variant(experiment: str, family: str) -> str | None:
    suffix = experiment.removeprefix(family)
    return suffix if experiment.startswith(family) and suffix in VARIANTS else None


def glue_average_by_seed(runs: list[RunRecord], suffix: str) -> dict[int, float]:
    """average_bert of each seed: that seed's run of every task; a task that ran once counts its one run for every
    seed (SST-2 runs seed 42 only).

    The seeds are those every task with several runs has (a seed that one of them lacks, e.g. a lane the deadline
    stopped, has no average), or, where every task ran once, their one common seed (the downstream recipes run
    seed 42 only). A variant without all five tasks has none.
    """
    by_task: dict[str, dict[int, float]] = {}
    for r in runs:
        task = r.task.removeprefix("glue:")
        if variant(r.experiment, "minilm_glue") == suffix and task in BERT_TASKS:
            by_task.setdefault(task, {})[r.seed] = r.metrics["score"]
    if set(by_task) != set(BERT_TASKS):
        return {}
    several = [set(scores) for scores in by_task.values() if len(scores) > 1]
    seeds = set.intersection(*several) if several else set.union(*(set(scores) for scores in by_task.values()))
    if not several and len(seeds) > 1:  # one run a task, at different seeds: no seed has all five
        return {}
    return {seed: 100 * statistics.fmean(scores[seed] if len(scores) > 1 else next(iter(scores.values()))
                                         for scores in by_task.values())
            for seed in sorted(seeds)}


def mean_std(values: list[float]) -> str:
    if not values:
        return "-"
    std = sample_std(values) if len(values) > 1 else 0.0
    return f"{statistics.fmean(values):.1f} ± {std:.1f}"


def single(runs: list[RunRecord], family: str, suffix: str, key: str, scale: float = 1.0) -> dict[int, float]:
    """The metric ``key`` of each seed's run of ``family + suffix``; two runs of one seed (a re-run in another
    output root) are an error naming both, since either could be the one meant."""
    by_seed: dict[int, RunRecord] = {}
    for r in runs:
        if variant(r.experiment, family) == suffix and key in r.metrics:
            if r.seed in by_seed:
                raise ValueError(f"two runs of {r.experiment} at seed {r.seed}: {by_seed[r.seed].run_dir} and "
                                 f"{r.run_dir}; report one output root at a time")
            by_seed[r.seed] = r
    return {seed: scale * r.metrics[key] for seed, r in by_seed.items()}


def paired_delta(mine: dict[int, float], dense: dict[int, float]) -> list[float]:
    """Each seed's score minus dense's at the same seed, over the seeds both ran (the docs' Δ)."""
    return [mine[seed] - dense[seed] for seed in sorted(mine) if seed in dense]


def delta_cell(deltas: list[float]) -> str:
    """``+0.4 ± 0.6 (n3)``; one seed: ``-3.3 (n1)``; none: ``-``."""
    if not deltas:
        return "-"
    spread = f" ± {sample_std(deltas):.1f}" if len(deltas) > 1 else ""
    return f"{statistics.fmean(deltas):+.1f}{spread} (n{len(deltas)})"


# the report's task families, each with its place in a TARGETS triple (GLUE, SQuAD, GAP)
FAMILIES = {"glue": 0, "squad": 1, "mul": 2, "concat": 2}


def family_scores(runs: list[RunRecord], suffix: str) -> dict[str, dict[int, float]]:
    """Each family's score by seed for the variant ``suffix`` ("" is dense): GLUE average_bert, SQuAD F1, GAP
    accuracy of each head."""
    return {"glue": glue_average_by_seed(runs, suffix), "squad": single(runs, "minilm_squad_v1", suffix, "f1"),
            "mul": single(runs, "minilm_gap_mul", suffix, "accuracy", 100),
            "concat": single(runs, "minilm_gap_concat", suffix, "accuracy", 100)}


def report(runs: list[RunRecord]) -> str:
    lines = ["### GLUE dev (mean over seeds; ± is the sample std of the task score)", ""]
    glue = [r for r in runs if r.task.startswith("glue:")]
    if glue:
        lines += [glue_table(glue, agg="mean"), ""]
    rows = [("| variant | GLUE average_bert (seeds) | Δ | SQuAD F1 | Δ | GAP mul acc | Δ | GAP concat acc | Δ |"),
            "|---|---|---|---|---|---|---|---|---|"]
    dense = family_scores(runs, "")
    checks = []
    for suffix in VARIANTS:
        mine = family_scores(runs, suffix)
        cells = []
        for key in FAMILIES:
            deltas = paired_delta(mine[key], dense[key]) if suffix else []
            cells += [mean_std(list(mine[key].values())), delta_cell(deltas)]
            if suffix in TARGETS and mine[key] and not deltas:
                checks.append(f"- {LABELS[suffix]}, {key}: no seed in common with dense")
            elif suffix in TARGETS and deltas:
                delta, limit = statistics.fmean(deltas), TARGETS[suffix][FAMILIES[key]]
                checks.append(f"- {LABELS[suffix]}, {key}: {delta:+.1f} (n{len(deltas)}) against a limit of −{limit}: "
                              f"{'met' if delta >= -limit else 'not met'}")
        if any(mine.values()):
            rows.append(f"| {LABELS[suffix]} | " + " | ".join(cells) + " |")
    lines += ["### Every task against dense (Δ: paired by seed, mean ± std over the seeds both ran; n of them)", "",
              *rows, "", "Targets:", *checks]
    return "\n".join(lines)


def main(argv: list[str]) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("root", type=Path)
    p.add_argument("--json", type=Path, help="also write every run (registry rows) to this JSON file")
    args = p.parse_args(argv)
    runs = records(args.root)
    if not runs:
        print(f"error: no finished runs in any registry.sqlite under {args.root}", file=sys.stderr)
        return 2
    try:
        print(report(runs))
    except ValueError as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    if args.json:
        args.json.write_text(json.dumps([dataclasses.asdict(r) for r in runs], indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
