"""Sparse training overhead: the real Trainer step, dense (bert_100k) vs sparse_80_rigl, same call, same card.

Both variants are the registry's experiments with only the step count, logging and data changed: BERT-base,
seq 128, global batch 256, bf16 on GPU, the MLM collator on random full-length sequences. The timed window
(steps warmup..steps) contains RigL updates in proportion (update_freq 100 -> one per 100 timed steps), so the
ratio is averaged over update and non-update steps. Variants alternate over repeats to spread clock drift.

    python bench/sparse_overhead.py --tokenizer minilm --out docs/sparse_overhead.json

``--upkeep`` times the controller's own work outside the Trainer instead, each part synchronized at both ends:
masking the gradients before a step, re-applying the masks (which AdamW steps no longer need, see
SparsityController._optimizer_keeps_zeros; timed for other optimizers), and one whole RigL update step (dense
gradient kept and masked, masks moved, optimizer state reset, masks re-applied). ``per_step_amortized_ms`` is what
the sparse AdamW step pays on top of the dense one over ``rigl.update_freq`` steps: gradient masking on the
others, plus the update step.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import tempfile
import time
from datetime import date
from pathlib import Path

import torch
from transformers import TrainerCallback

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "src"))

from sparsebert.config import ExperimentRegistry  # noqa: E402
from sparsebert.data.mlm_data import MLMCollator  # noqa: E402
from sparsebert.data.tokenizer import load_tokenizer  # noqa: E402
from sparsebert.env_info import git_commit  # noqa: E402
from sparsebert.models.bert import build_mlm_model, scatter_masked_predictions  # noqa: E402
from sparsebert.models.prepare import prepare_model  # noqa: E402
from sparsebert.sparsity.rigl import rigl_update_due  # noqa: E402
from sparsebert.trainer.arguments import training_arguments  # noqa: E402
from sparsebert.trainer.hooks import build_hooks  # noqa: E402
from sparsebert.trainer.profiling import HostSyncCounter  # noqa: E402
from sparsebert.trainer.trainer import SparseBertTrainer  # noqa: E402


class StepTimer(TrainerCallback):
    """Wall time of optimizer steps warmup+1..end, synchronized only at the two ends of the window."""

    def __init__(self, warmup: int):
        self.warmup = warmup
        self.start: float | None = None
        self.end: float | None = None

    def on_step_end(self, args, state, control, **kwargs):
        if state.global_step in (self.warmup, state.max_steps):
            if torch.cuda.is_available():
                torch.cuda.synchronize()
            if state.global_step == self.warmup:
                self.start = time.perf_counter()
            else:
                self.end = time.perf_counter()


def random_blocks(n: int, seq: int, vocab: int, tokenizer, seed: int):
    import datasets

    g = torch.Generator().manual_seed(seed)
    ids = torch.randint(1000, vocab, (n, seq), generator=g)
    ids[:, 0], ids[:, -1] = tokenizer.cls_token_id, tokenizer.sep_token_id
    return datasets.Dataset.from_dict({"input_ids": ids.tolist()})


# the benches' variants start with the pretraining defaults that came after their first rows off, and name what
# they turn on: the numerics pair's two (defaults since it, 2860a3e) and fused QKV (5334a9a)
NAMED_SETTINGS_OFF = ("model.half_precision_residual=false", "model.fast_dropout=false", "model.fused_qkv=false")


def timing_overrides(steps: int, global_batch: int, tokenizer: str, size: str = "base") -> list[str]:
    """The registry experiment as it is, but for ``steps`` steps at ``global_batch``, with no evaluation,
    checkpoint or tracker inside the timed window, and the settings each row names off (``NAMED_SETTINGS_OFF``)."""
    return [f"train.max_steps={steps}", "train.warmup_steps=10", f"train.global_batch_size={global_batch}",
            "train.eval_at_start=false", "train.eval_steps=100000", "train.save_steps=100000",
            "train.logging_steps=50", "train.report_to=[]", "train.dataloader_workers=4",
            f"model.tokenizer={tokenizer}", f"model.size={size}", *NAMED_SETTINGS_OFF]


def variant_config(registry: ExperimentRegistry, name: str, overrides: list[str]):
    """The config a timed run of experiment ``name`` trains with (a ConfigError if the registry refuses it)."""
    if registry.resolve(name).get("rigl") is not None:
        # a real run updates masks through its first 75 %; this short one must too, inside the timed window
        # (and a RigL range without an update step is refused)
        steps = next(int(item.split("=", 1)[1]) for item in overrides if item.startswith("train.max_steps="))
        overrides = [*overrides, f"rigl.end_step={steps + 1}"]
    return registry.build(name, overrides)


def time_variant(registry: ExperimentRegistry, name: str, overrides: list[str], tokenizer, data, warmup: int,
                 callbacks: list | None = None) -> dict:
    cfg = variant_config(registry, name, overrides)
    torch.manual_seed(cfg.seed)
    model = prepare_model(build_mlm_model(cfg.model, tokenizer, cfg.data), cfg)
    hooks = build_hooks(cfg, model, cfg.train.max_steps, cfg.seed)
    timer = StepTimer(warmup)
    # host-GPU synchronizations in warm-up steps warmup-5 .. warmup-1 (compiled and recorded by then; untimed,
    # as the sync debug mode's warnings cost host time)
    syncs = HostSyncCounter(start=warmup - 6, steps=5) if warmup >= 7 else None
    with tempfile.TemporaryDirectory() as tmp:
        trainer = SparseBertTrainer(
            model=model,
            args=training_arguments(cfg.train, Path(tmp), cfg.seed, name),
            train_dataset=data,
            eval_dataset=data.select(range(8)),  # never reached: eval_steps is past the last step
            data_collator=MLMCollator.for_data(cfg.data, tokenizer),
            processing_class=tokenizer,
            preprocess_logits_for_metrics=scatter_masked_predictions,
            callbacks=[timer, *([syncs] if syncs else []), *(callbacks or [])],
            tokens_per_sample=cfg.data.max_seq_length,
            **hooks,
        )
        if torch.cuda.is_available():
            torch.cuda.reset_peak_memory_stats()
        trainer.train()
    steps = cfg.train.max_steps - warmup
    seconds = (timer.end - timer.start) / steps
    out = {
        "variant": name,
        "step_ms": 1000 * seconds,
        "samples_per_second": cfg.train.global_batch_size / seconds,
        "peak_memory_gb": torch.cuda.max_memory_allocated() / 2**30 if torch.cuda.is_available() else None,
        "window": (timer.start, timer.end),  # perf_counter ends of the timed steps (for samplers in this process)
    }
    # the weights' bits summed, after timing: equal on every rank of a run whose ranks stayed in step
    out["weights_fingerprint"] = int(sum(p.detach().float().view(torch.int32).long().sum() for p in model.parameters()))
    if syncs is not None and syncs.result is not None:
        out["host_syncs_per_step"] = syncs.result["per_step"]
        out["host_sync_sites"] = syncs.result["sites"][:3]
    if "sparsity" in hooks:
        out["sparsity"] = hooks["sparsity"].report()["selected"]["sparsity"]
        controller = hooks["sparsity"]
        out["rigl_updates_in_window"] = sum(rigl_update_due(step, cfg.rigl, controller.rigl_end_step)
                                            for step in range(warmup + 1, cfg.train.max_steps + 1)) if cfg.rigl else 0
    return out


def time_upkeep(registry: ExperimentRegistry, tokenizer, size: str, repeats: int = 5) -> dict:
    """ms of each part of the mask upkeep of ``sparse_80_rigl`` on BERT-``size`` (median of ``repeats``)."""
    cfg = registry.build("sparse_80_rigl", [f"model.size={size}", "train.max_steps=100000"])
    device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
    torch.manual_seed(cfg.seed)
    model = build_mlm_model(cfg.model, tokenizer, cfg.data).to(device)
    controller = build_hooks(cfg, model, cfg.train.max_steps, cfg.seed)["sparsity"]
    opt = torch.optim.AdamW(model.parameters(), lr=1e-4, fused=device.type == "cuda")
    controller.attach_optimizer(opt)
    g = torch.Generator(device=device).manual_seed(0)

    def fill_grads() -> None:
        for p in model.parameters():
            p.grad = torch.randn(p.shape, device=device, generator=g)

    fill_grads()
    opt.step()  # creates the AdamW state that a RigL update resets

    def timed(fn) -> float:
        if device.type == "cuda":
            torch.cuda.synchronize()
        start = time.perf_counter()
        fn()
        if device.type == "cuda":
            torch.cuda.synchronize()
        return 1000 * (time.perf_counter() - start)

    def rigl_step() -> None:
        controller.step = cfg.rigl.update_freq * (controller.step // cfg.rigl.update_freq + 1) - 1  # next is due
        controller.before_optimizer_step()
        controller.on_optimizer_step()

    runs: dict[str, list[float]] = {"grad_masking_ms": [], "mask_reapply_ms": [], "rigl_update_step_ms": []}
    for _ in range(repeats):
        fill_grads()
        controller.step = 1  # not an update step
        runs["grad_masking_ms"].append(timed(controller.before_optimizer_step))
        runs["mask_reapply_ms"].append(timed(controller.apply_masks))
        fill_grads()
        runs["rigl_update_step_ms"].append(timed(rigl_step))
    out: dict = {k: statistics.median(v) for k, v in runs.items()}
    out["rigl_update_every"] = cfg.rigl.update_freq
    freq = cfg.rigl.update_freq
    out["per_step_amortized_ms"] = ((freq - 1) * out["grad_masking_ms"] + out["rigl_update_step_ms"]) / freq
    out["sparse_params"] = sum(p.numel() for p in controller.params.values())
    out["runs"] = runs
    return out


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--tokenizer", default="minilm")
    p.add_argument("--steps", type=int, default=230)
    p.add_argument("--warmup", type=int, default=30)
    p.add_argument("--repeats", type=int, default=2)
    p.add_argument("--batch", type=int, default=256)
    p.add_argument("--size", default="base", help="model size (tiny for a CPU smoke run)")
    p.add_argument("--upkeep", action="store_true", help="time the mask upkeep parts alone (see above)")
    p.add_argument("--out", type=Path, default=None)
    args = p.parse_args()

    registry = ExperimentRegistry.builtin()
    tokenizer = load_tokenizer(args.tokenizer)
    if args.upkeep:
        r = time_upkeep(registry, tokenizer, args.size)
        r.update({"card": torch.cuda.get_device_name(0) if torch.cuda.is_available() else "cpu",
                  "date": date.today().isoformat(), "commit": git_commit(ROOT), "torch": torch.__version__})
        print(json.dumps(r, indent=1))
        if args.out:
            args.out.parent.mkdir(parents=True, exist_ok=True)
            args.out.write_text(json.dumps(r, indent=2) + "\n")
        return
    overrides = timing_overrides(args.steps, args.batch, args.tokenizer, args.size)
    data = random_blocks(args.steps * args.batch, 128, len(tokenizer), tokenizer, seed=0)
    results = []
    for rep in range(args.repeats):
        for name in ("bert_100k", "sparse_80_rigl"):
            r = time_variant(registry, name, overrides, tokenizer, data, args.warmup)
            r.pop("window")
            r["repeat"] = rep
            results.append(r)
            print(json.dumps(r), flush=True)

    dense = statistics.median(r["step_ms"] for r in results if r["variant"] == "bert_100k")
    sparse = statistics.median(r["step_ms"] for r in results if r["variant"] == "sparse_80_rigl")
    summary = {
        "card": torch.cuda.get_device_name(0) if torch.cuda.is_available() else "cpu",
        "date": date.today().isoformat(),
        "commit": git_commit(ROOT),
        "torch": torch.__version__,
        "dense_step_ms": dense,
        "sparse_step_ms": sparse,
        "ratio_sparse_over_dense": sparse / dense,
        "target": "<= 1.03",
        "runs": results,
    }
    print(f"\n| card | dense ms/step | sparse_80_rigl ms/step | ratio |\n|---|---|---|---|\n"
          f"| {summary['card']} | {dense:.1f} | {sparse:.1f} | {sparse / dense:.3f} |")
    if args.out:
        args.out.parent.mkdir(parents=True, exist_ok=True)
        args.out.write_text(json.dumps(summary, indent=2) + "\n")


if __name__ == "__main__":
    main()
