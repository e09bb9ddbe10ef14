"""No host-GPU synchronization in the static MLM training step (CPU checks of what would sync on a GPU).

A step that reads GPU data on the host (``.item()``, ``bool(tensor)``, boolean-mask indexing, ``nonzero``) waits
for the GPU there, so the host cannot queue the next step ahead. On CPU nothing waits, but the operators that
would are visible to a dispatch mode, which is what these tests count. The batch copy to the GPU and the count of
real synchronizations on a GPU are checked by ``tests/gpu/test_host_syncs_gpu.py`` and reported by the benches.
"""

from __future__ import annotations

import warnings
from collections import Counter
from types import SimpleNamespace

import pytest
import torch
from torch.utils._python_dispatch import TorchDispatchMode
from transformers import BertConfig

from sparsebert.data.mlm_data import MLMCollator
from sparsebert.models.bert import BertForMaskedLMAtMasked
from sparsebert.trainer import profiling
from sparsebert.trainer.profiling import SYNC_WARNING, HostSyncCounter

# operators whose result on a GPU needs GPU data on the host first
READS_BACK = {"_local_scalar_dense", "nonzero", "masked_select", "unique", "_unique2", "repeat_interleave"}


class HostReads(TorchDispatchMode):
    def __init__(self):
        super().__init__()
        self.ops: Counter[str] = Counter()

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        name = func.__name__.split(".")[0]
        bool_index = name in ("index", "index_put", "index_put_") and any(
            isinstance(i, torch.Tensor) and i.dtype == torch.bool for i in (args[1] or ()))
        if name in READS_BACK or bool_index:
            self.ops[name] += 1
        return func(*args, **(kwargs or {}))


def _model_and_batch(tokenizer, static: bool):
    torch.manual_seed(0)
    model = BertForMaskedLMAtMasked(BertConfig(vocab_size=len(tokenizer), hidden_size=32, num_hidden_layers=2,
                                               num_attention_heads=2, intermediate_size=64,
                                               max_position_embeddings=64)).train()
    if static:
        model.static_mlm_probability = 0.15
    collator = MLMCollator(tokenizer, mlm_probability=0.15, mask_seed=0, static_mask_count=static)
    blocks = torch.randint(1000, len(tokenizer), (8, 64), generator=torch.Generator().manual_seed(0))
    blocks[:, 0], blocks[:, -1] = tokenizer.cls_token_id, tokenizer.sep_token_id
    return model, collator([{"input_ids": row} for row in blocks.tolist()])


@pytest.mark.parametrize("static", [True, False])
def test_static_training_step_reads_nothing_back(tokenizer, static):
    model, batch = _model_and_batch(tokenizer, static)
    with HostReads() as reads:
        out = model(**batch, num_items_in_batch=(batch["labels"] != -100).sum())
        out.loss.backward()
    if static:
        assert reads.ops == Counter()
    else:  # the exact decoder selects the masked rows with a boolean mask: the detector sees it
        assert reads.ops["index"] >= 1


def test_packed_blocks_carry_no_attention_mask_and_padded_rows_keep_it(tokenizer):
    collator = MLMCollator(tokenizer, mlm_probability=0.15, mask_seed=0)
    full = collator([{"input_ids": [101, *range(2000, 2010), 102]} for _ in range(3)])
    assert "attention_mask" not in full  # an all-ones mask would cost a sync (eager) or a dense mask (compiled)
    ragged = collator([{"input_ids": [101, 2000, 2001, 102]}, {"input_ids": [101, 2000, 102]}])
    assert ragged["attention_mask"].tolist() == [[1, 1, 1, 1], [1, 1, 1, 0]]


def test_host_sync_counter_counts_the_window_and_names_the_site(monkeypatch):
    """The counter's bookkeeping, with torch's sync warning issued by hand (CPU has no CUDA sync debug mode):
    only steps start+1..start+steps count, sites are file:line of the caller, and warnings behave as before
    afterwards."""
    modes = []
    monkeypatch.setattr(profiling.torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(profiling.torch.cuda, "get_sync_debug_mode", lambda: 0)
    monkeypatch.setattr(profiling.torch.cuda, "set_sync_debug_mode", modes.append)
    counter = HostSyncCounter(start=2, steps=3)

    def step(n: int, syncs: int) -> None:
        for _ in range(syncs):
            warnings.warn(SYNC_WARNING, UserWarning, stacklevel=1)  # the line every count should name
        counter.on_step_end(None, SimpleNamespace(global_step=n), None)

    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        before = (warnings.showwarning, list(warnings.filters))
        step(1, 4)
        step(2, 4)  # steps up to `start` are before the window
        assert modes == ["warn"]
        step(3, 2)
        step(4, 2)
        with pytest.warns(UserWarning, match="other"):  # other warnings pass through while counting
            warnings.warn("other", UserWarning, stacklevel=1)
        step(5, 2)
        assert (warnings.showwarning, list(warnings.filters)) == before  # the window closed: all as it was
        step(6, 9)  # after the window
    assert modes == ["warn", 0]
    assert counter.result["steps"] == 3 and counter.result["syncs"] == 6 and counter.result["per_step"] == 2
    (site,) = counter.result["sites"]
    assert site["site"].endswith(f"test_host_syncs.py:{step.__code__.co_firstlineno + 2}")
    assert site["count"] == 6 and any("in step" in frame or " step" in frame for frame in site["stack"])


def test_a_window_left_open_by_a_crashed_run_is_closed_before_the_next(monkeypatch):
    modes = []
    monkeypatch.setattr(profiling.torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(profiling.torch.cuda, "get_sync_debug_mode", lambda: 0)
    monkeypatch.setattr(profiling.torch.cuda, "set_sync_debug_mode", modes.append)
    with warnings.catch_warnings():
        before = (warnings.showwarning, list(warnings.filters))
        crashed = HostSyncCounter(start=1, steps=3)
        crashed.on_step_end(None, SimpleNamespace(global_step=1), None)  # the run raises after this step
        assert modes == ["warn"] and warnings.showwarning is not before[0]
        crashed.on_train_begin(None, None, None)  # the same callback in the next run
        assert modes == ["warn", 0] and (warnings.showwarning, list(warnings.filters)) == before
        other = HostSyncCounter(start=1, steps=1)
        crashed.on_step_end(None, SimpleNamespace(global_step=1), None)  # open again, then crashes
        other.on_step_end(None, SimpleNamespace(global_step=1), None)  # another counter starts
        other.on_step_end(None, SimpleNamespace(global_step=2), None)
        assert modes == ["warn", 0, "warn", 0, "warn", 0] and other.result["syncs"] == 0
        assert (warnings.showwarning, list(warnings.filters)) == before
    with pytest.raises(ValueError, match="start >= 1"):
        HostSyncCounter(start=0)
