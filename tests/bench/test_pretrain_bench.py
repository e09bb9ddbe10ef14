"""bench/pretrain_throughput.py on CPU: the row table and --only parsing, the FLOP count behind MFU, the ratios
and the slower-baseline warning, and the plain user loop and the baseline at tiny size (uncompiled)."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
from module_loading import load_module
from transformers import BertConfig

BENCH = Path(__file__).resolve().parents[2] / "bench" / "pretrain_throughput.py"


@pytest.fixture(scope="module")
def bench():
    return load_module(BENCH)


def keys(bench) -> list[str]:
    return [bench.PLAIN, *(key for key, *_ in bench.BASELINES), *(key for key, *_ in bench.OURS)]


def tiny() -> BertConfig:
    return BertConfig(vocab_size=10, hidden_size=8, num_hidden_layers=2, num_attention_heads=2, intermediate_size=16,
                      max_position_embeddings=16, attn_implementation="sdpa")


def test_rows_are_unique_and_the_headline_exists(bench):
    known = keys(bench)
    assert len(known) == len(set(known))
    assert set(bench.HEADLINE) <= set(known)
    assert bench.HEADLINE[:2] == ("plain", "compiled-mask")  # the references run first, in the fresh process
    assert "ours-static-half-residual-fast-dropout-fused-qkv" in bench.HEADLINE
    assert "ours-sparse-static-half-residual-fast-dropout-fused-qkv" in bench.HEADLINE
    # a row's patches name a row and what they set exists (else the row fails only on the GPU)
    assert set(bench.INDUCTOR_PATCHES) | set(bench.SDPA_BACKENDS) <= set(known)
    from torch.nn.attention import SDPBackend
    assert all(hasattr(SDPBackend, name) for names in bench.SDPA_BACKENDS.values() for name in names)


@pytest.mark.parametrize("size", ["base", "large"])
def test_every_ours_row_is_a_config_the_registry_accepts(bench, size):
    """What each row sets (FP8 recipes and layers included) is checked here, not after minutes on a GPU."""
    from sparse_overhead import timing_overrides, variant_config

    from sparsebert.config import ExperimentRegistry

    registry = ExperimentRegistry.builtin()
    for key, experiment, compiled, extra, _ in bench.OURS:
        overrides = [*timing_overrides(120, 256, "minilm", size), f"train.torch_compile={str(compiled).lower()}",
                     *extra]
        cfg = variant_config(registry, experiment, overrides)
        assert cfg.model.size == size, key
        assert (cfg.train.precision == "fp8") == ("fp8" in key), key
        if "fp8" in key:
            assert cfg.model.fused_qkv == ("fused-qkv" in key), key


def test_the_references_are_the_named_sizes(bench):
    assert bench.bert_config("base", 30522).to_dict() == BertConfig(vocab_size=30522).to_dict()
    large = bench.bert_config("large", 30522, "sdpa")
    assert (large.num_hidden_layers, large.hidden_size, large.num_attention_heads, large.intermediate_size) == \
        (24, 1024, 16, 4096)
    assert large._attn_implementation == "sdpa"


def test_select_rows(bench):
    known = keys(bench)
    assert bench.select_rows("", "", known) == list(bench.HEADLINE)
    assert bench.select_rows("headline", "", known) == list(bench.HEADLINE)
    assert bench.select_rows("all", "", known) == known
    dense, sparse = "ours-static-half-residual-fast-dropout", "ours-sparse-static-half-residual-fast-dropout"
    # the listed order, spaces and repeats tolerated
    assert bench.select_rows(f"{sparse}, plain,compiled,plain,{dense}", "", known) == \
        [sparse, "plain", "compiled", dense]
    assert bench.select_rows("plain,compiled-mask", "compiled-mask", known) == ["plain"]
    assert bench.select_rows("", "plain", known) == list(bench.HEADLINE[1:])
    for only, skip in (("plain,nope", ""), ("", "nope")):
        with pytest.raises(SystemExit, match="nope"):
            bench.select_rows(only, skip, known)


def test_train_flops_per_step_by_hand(bench):
    cfg = BertConfig(vocab_size=10, hidden_size=8, num_hidden_layers=2, intermediate_size=16)
    # encoder per sample: 2*S*L*(4*H^2 + 2*H*I) = 2*4*2*(256 + 256) = 8192, attention 4*L*S^2*H = 4*2*16*8 = 1024;
    # head per decoder row: 2*(H^2 + H*V) = 2*(64 + 80) = 288; step: 3 * (3 * 9216 + 5 * 288) = 87264
    assert bench.train_flops_per_step(cfg, batch=3, seq=4, decoder_rows=5) == 87264


def test_full_decoder_flops_are_the_usual_per_token_count(bench):
    cfg = BertConfig(vocab_size=30522)  # BERT-base
    h, layers, inter, seq = 768, 12, 3072, 128
    per_token = 6 * (layers * (4 * h * h + 2 * h * inter) + h * h + h * 30522) + 12 * layers * h * seq
    assert bench.train_flops_per_step(cfg, 256, seq, 256 * seq) == pytest.approx(256 * seq * per_token)
    # the decoder at the masked rows only: fewer FLOPs, the encoder's unchanged
    static = bench.decoder_rows(256, seq, 0.15, static_mask_count=True)
    assert static == 5440  # 4915.2 expected + 8 standard deviations, up to a multiple of 64
    assert bench.decoder_rows(256, seq, 0.15, static_mask_count=False) == pytest.approx(0.15 * 256 * 126)
    ours = bench.train_flops_per_step(cfg, 256, seq, static)
    full = bench.train_flops_per_step(cfg, 256, seq, 256 * seq)
    assert full - ours == pytest.approx(3 * (256 * seq - static) * 2 * (h * h + h * 30522))


def test_ratios_mfu_and_the_slower_baseline_warning(bench):
    cfg = tiny()
    rows = [{"key": "plain", "samples_per_second": 100.0, "decoder_rows": 64},
            {"key": "compiled-mask", "samples_per_second": 97.0, "decoder_rows": 64},
            {"key": "ours-static", "samples_per_second": 150.0, "decoder_rows": 10}]
    warnings = bench.add_metrics(rows, cfg, batch=4, peak_tflops=1.0)
    assert [r["ratio_vs_plain"] for r in rows] == pytest.approx([1.0, 0.97, 1.5])
    assert [r["ratio_vs_baseline"] for r in rows] == pytest.approx([100 / 97, 1.0, 150 / 97])
    assert len(warnings) == 1 and "3.0 % slower" in warnings[0]
    flops = bench.train_flops_per_step(cfg, 4, bench.SEQ, 10)
    assert rows[2]["model_tflops_per_step"] == pytest.approx(flops / 1e12)
    assert rows[2]["mfu"] == pytest.approx(flops / 1e12 * 150 / 4)
    assert rows[2]["mfu"] < rows[2]["mfu_baseline_flops"]  # ours executes fewer FLOPs than the baseline's count
    rows[1]["samples_per_second"] = 99.0  # within 2 %: no warning
    assert bench.add_metrics(rows, cfg, batch=4, peak_tflops=1.0) == []
    alone = [{"key": "ours-static", "samples_per_second": 150.0, "decoder_rows": 10}]
    assert bench.add_metrics(alone, cfg, batch=4, peak_tflops=1.0) == []
    assert alone[0]["ratio_vs_plain"] is None and alone[0]["ratio_vs_baseline"] is None


def test_plain_loop_and_baseline_run_on_cpu(bench):
    torch.manual_seed(0)
    r = bench.plain_loop(tiny(), batch=2, seq=8, steps=3, warmup=1, device="cpu", compile=False)
    assert r["samples_per_second"] > 0 and r["decoder_rows"] == 16 and r["peak_memory_gb"] is None
    assert r["variant"].startswith("plain user loop")
    for mask in (False, True):
        r = bench.baseline(tiny(), batch=2, seq=8, steps=3, warmup=1, compiled=False, mask=mask, device="cpu")
        assert r["samples_per_second"] > 0 and ("all-ones mask" in r["variant"]) == mask


def test_report_json(bench, tmp_path, capsys):
    import argparse
    import json

    rows = [{"key": key, "variant": key, "samples_per_second": sps, "decoder_rows": rows, "peak_memory_gb": None}
            for key, sps, rows in (("plain", 100.0, 4 * 128), ("compiled-mask", 90.0, 4 * 128), ("ours", 150.0, 80))]
    args = argparse.Namespace(batch=4, size="base", peak_tflops=2.0, peak_source="--peak-tflops",
                              out=tmp_path / "r.json")
    bench.report(rows, 10, args)
    out = json.loads(args.out.read_text())
    assert out["size"] == "base"
    assert out["plain"] == "plain" and out["baseline"] == "compiled-mask" and len(out["warnings"]) == 1
    assert {"samples_per_second", "ratio_vs_plain", "ratio_vs_baseline", "model_tflops_per_step", "mfu",
            "mfu_baseline_flops"} <= set(out["runs"][2])
    assert "WARNING" in capsys.readouterr().out
