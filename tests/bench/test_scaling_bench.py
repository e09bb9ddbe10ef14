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
    configs = scaling.check_variants(args(steps, ",".join([*scaling.VARIANTS, scaling.PLAIN_DDP])))
    # every variant at each per-GPU batch (128, 256) and GPU count (1, 2); the plain DDP loop has no config
    assert sorted(configs) == sorted((v, b, g) for v in scaling.VARIANTS for b in (128, 256) for g in (1, 2))
    for (variant, batch, gpus), cfg in configs.items():
        assert (cfg.train.max_steps, cfg.train.global_batch_size) == (steps, batch * gpus)
        assert cfg.name == scaling.VARIANTS[variant][0]
        # a RigL variant updates its masks inside the timed run
        assert cfg.rigl is None or cfg.rigl.update_freq <= steps < cfg.rigl.end_step


def test_a_rigl_run_without_an_update_is_refused_before_launch(scaling):
    with pytest.raises(SystemExit, match="sparse_80_rigl: rigl would never update the masks"):
        scaling.check_variants(args(80, "bert_100k,sparse_80_rigl"))
