"""bench/scaling.py on CPU: every variant's config is built before any GPU process starts, so a refused one (a
RigL schedule without an update in the run, as the old 80-step default had) stops the bench in one line."""

from __future__ import annotations

from pathlib import Path
from types import SimpleNamespace

import pytest
from module_loading import load_module

BENCH = Path(__file__).resolve().parents[2] / "bench" / "scaling.py"


@pytest.fixture(scope="module")
def scaling():
    return load_module(BENCH)


def args(steps: int, variants: str) -> SimpleNamespace:
    return SimpleNamespace(variants=variants, steps=steps, per_gpu_batch="128,256", gpus="1,2", compile=True,
                           tokenizer="minilm", size="base")


def test_every_variant_builds_at_the_default_steps(scaling):
    steps = scaling.build_parser().parse_args([]).steps
    scaling.check_variants(args(steps, ",".join([*scaling.VARIANTS, scaling.PLAIN_DDP])))


def test_a_rigl_run_without_an_update_is_refused_before_launch(scaling):
    with pytest.raises(SystemExit, match="sparse_80_rigl: rigl would never update the masks"):
        scaling.check_variants(args(80, "bert_100k,sparse_80_rigl"))
