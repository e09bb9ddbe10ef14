"""The fast MLM path computes what the plain one does: BertForMaskedLMAtMasked (decoder at masked positions only)
against Hugging Face's BertForMaskedLM with the same weights, eager and under torch.compile (CPU, aot_eager:
graph capture without code generation, so it runs anywhere in seconds)."""

from __future__ import annotations

import pytest
import torch
from transformers import BertConfig, BertForMaskedLM

from sparsebert.data.mlm_data import cap_masked_tokens, static_prediction_rows
from sparsebert.models.bert import BertForMaskedLMAtMasked, scatter_masked_predictions

CONFIG = dict(vocab_size=90, hidden_size=32, num_hidden_layers=2, num_attention_heads=2, intermediate_size=64,
              max_position_embeddings=32, hidden_dropout_prob=0.0, attention_probs_dropout_prob=0.0)


def twins() -> tuple[BertForMaskedLM, BertForMaskedLMAtMasked]:
    torch.manual_seed(0)
    plain = BertForMaskedLM(BertConfig(**CONFIG))
    fast = BertForMaskedLMAtMasked(BertConfig(**CONFIG))
    fast.load_state_dict(plain.state_dict())
    return plain, fast


def batch(seed: int = 0) -> tuple[torch.Tensor, torch.Tensor]:
    g = torch.Generator().manual_seed(seed)
    ids = torch.randint(5, 90, (4, 16), generator=g)
    labels = torch.where(torch.rand(4, 16, generator=g) < 0.15, ids, torch.full_like(ids, -100))
    labels[0, 3] = ids[0, 3]  # at least one masked token
    return ids, labels


def test_same_loss_and_gradients_as_bert_for_masked_lm():
    plain, fast = twins()
    ids, labels = batch()
    loss_plain = plain(input_ids=ids, labels=labels).loss
    loss_fast = fast(input_ids=ids, labels=labels).loss
    torch.testing.assert_close(loss_fast, loss_plain, rtol=1e-5, atol=1e-6)
    loss_plain.backward()
    loss_fast.backward()
    for (name, p), (fast_name, q) in zip(plain.named_parameters(), fast.named_parameters(), strict=True):
        assert fast_name == name
        torch.testing.assert_close(q.grad, p.grad, rtol=1e-4, atol=1e-6, msg=name)


def test_same_loss_with_position_ids_token_types_and_input_embeddings():
    """The unmasked path runs the embeddings and layers itself: every input BertForMaskedLM takes still counts."""
    plain, fast = twins()
    ids, labels = batch()
    positions = torch.arange(15, -1, -1).expand(4, 16)
    types = (torch.arange(16) >= 8).long().expand(4, 16)
    for inputs in ({"input_ids": ids, "position_ids": positions}, {"input_ids": ids, "token_type_ids": types},
                   {"inputs_embeds": plain.bert.embeddings.word_embeddings(ids)}):
        torch.testing.assert_close(fast(**inputs, labels=labels).loss, plain(**inputs, labels=labels).loss,
                                   rtol=1e-5, atol=1e-6, msg=str(list(inputs)))


def test_hidden_states_are_bert_for_masked_lm_s_on_both_paths():
    """With output_hidden_states the fast path returns the embeddings' output and each layer's, as BertModel does
    (what kd.hidden_weight distils), on the unmasked path it runs itself and with an attention mask; the loss is
    the same with or without them."""
    plain, fast = twins()
    ids, labels = batch()
    padded = torch.ones_like(ids)
    padded[1, 12:] = 0
    for extra in ({}, {"attention_mask": padded}, {"position_ids": torch.arange(15, -1, -1).expand(4, 16)}):
        expected = plain(input_ids=ids, labels=labels, output_hidden_states=True, **extra)
        got = fast(input_ids=ids, labels=labels, output_hidden_states=True, **extra)
        assert len(got.hidden_states) == CONFIG["num_hidden_layers"] + 1
        for i, (g, e) in enumerate(zip(got.hidden_states, expected.hidden_states, strict=True)):
            torch.testing.assert_close(g, e, rtol=1e-5, atol=1e-6, msg=f"{list(extra)} state {i}")
        torch.testing.assert_close(got.loss, expected.loss, rtol=1e-5, atol=1e-6)
        assert fast(input_ids=ids, labels=labels, **extra).hidden_states is None


def test_num_items_in_batch_gives_the_token_weighted_loss():
    """Sum over this micro-batch divided by the step's masked-token count (the Trainer's DDP convention)."""
    _, fast = twins()
    ids, labels = batch()
    n = int((labels != -100).sum())
    mean = fast(input_ids=ids, labels=labels).loss
    torch.testing.assert_close(fast(input_ids=ids, labels=labels, num_items_in_batch=2 * n).loss, mean / 2)


def test_predictions_at_masked_positions_match_the_full_decoder():
    plain, fast = twins()
    ids, labels = batch(1)
    with torch.no_grad():
        full = scatter_masked_predictions(plain(input_ids=ids).logits, labels)
        masked = scatter_masked_predictions(fast(input_ids=ids, labels=labels).logits, labels)
    picked = labels != -100
    assert torch.equal(masked[picked], full[picked])
    assert (masked[~picked] == -100).all()


@pytest.mark.parametrize("seed", [0, 1])
def test_compiled_model_gives_the_eager_loss(seed):
    """The masked-row gather has a data-dependent size: torch.compile must still give the eager loss."""
    _, fast = twins()
    compiled = torch.compile(fast, backend="aot_eager")
    ids, labels = batch(seed)
    torch.testing.assert_close(compiled(input_ids=ids, labels=labels).loss,
                               fast(input_ids=ids, labels=labels).loss, rtol=1e-5, atol=1e-6)


def test_hidden_states_compile_to_one_graph_on_the_static_rows_path():
    """What a compiled KD step with kd.hidden_weight runs: the training path with fixed decoder rows, the layers'
    outputs returned, in one graph (CUDA graphs replay only whole graphs) and equal to eager."""
    _, fast = twins()
    fast.static_mlm_probability = 0.15
    ids, labels = batch(3)
    eager = fast(input_ids=ids, labels=labels, output_hidden_states=True)
    torch._dynamo.reset()
    compiled = torch.compile(fast, backend="aot_eager", fullgraph=True)(input_ids=ids, labels=labels,
                                                                          output_hidden_states=True)
    torch._dynamo.reset()
    torch.testing.assert_close(compiled.loss, eager.loss, rtol=1e-5, atol=1e-6)
    for c, e in zip(compiled.hidden_states, eager.hidden_states, strict=True):
        torch.testing.assert_close(c, e, rtol=1e-5, atol=1e-6)


def test_static_rows_give_the_same_loss_and_gradients():
    """data.static_mask_count: the decoder runs on a fixed number of rows (masked ones, then ignored fillers)."""
    plain, fast = twins()
    fast.static_mlm_probability = 0.15
    ids, labels = batch(2)
    loss_plain = plain(input_ids=ids, labels=labels).loss
    out = fast(input_ids=ids, labels=labels)
    assert out.logits.shape[0] == static_prediction_rows(ids.numel(), 0.15) > int((labels != -100).sum())
    torch.testing.assert_close(out.loss, loss_plain, rtol=1e-5, atol=1e-6)
    loss_plain.backward()
    out.loss.backward()
    for (name, p), (fast_name, q) in zip(plain.named_parameters(), fast.named_parameters(), strict=True):
        assert fast_name == name
        torch.testing.assert_close(q.grad, p.grad, rtol=1e-4, atol=1e-6, msg=name)
    n = int((labels != -100).sum())
    torch.testing.assert_close(fast(input_ids=ids, labels=labels, num_items_in_batch=2 * n).loss, out.loss / 2)


def test_static_rows_compile_to_one_graph_and_evaluation_stays_exact():
    """fullgraph=True fails on any graph break, which a data-dependent shape would cause."""
    _, fast = twins()
    fast.static_mlm_probability = 0.15
    ids, labels = batch(3)
    compiled = torch.compile(fast, backend="aot_eager", fullgraph=True)
    torch.testing.assert_close(compiled(input_ids=ids, labels=labels).loss,
                               fast(input_ids=ids, labels=labels).loss, rtol=1e-5, atol=1e-6)
    fast.eval()  # evaluation: one logits row per masked token, as scatter_masked_predictions expects
    with torch.no_grad():
        assert fast(input_ids=ids, labels=labels).logits.shape[0] == int((labels != -100).sum())


def test_static_row_count_is_far_above_the_expected_masked_count():
    rows = static_prediction_rows(256 * 128, 0.15)  # BERT-base batch 256 x seq 128: 4 915 masked expected
    assert rows % 64 == 0 and 4915 + 8 * 64 < rows < 4915 * 1.2
    assert static_prediction_rows(16, 0.15) == 16  # never more rows than tokens


def test_collator_caps_the_masked_count():
    ids = torch.arange(100, 140).reshape(2, 20)
    labels = torch.where(torch.arange(40).reshape(2, 20) % 2 == 0, ids, torch.full_like(ids, -100))  # 20 masked
    inputs = torch.where(labels != -100, torch.full_like(ids, 4), ids)  # 4 = [MASK]
    cap_masked_tokens(inputs, labels, 7, torch.Generator().manual_seed(0))
    assert int((labels != -100).sum()) == 7
    unmasked = labels == -100
    assert torch.equal(inputs[unmasked], ids[unmasked])  # every unmasked position holds its own token again
    assert (inputs[~unmasked] == 4).all()


def _sdpa_masks_under_compile(model, monkeypatch) -> list[str]:
    """The attn_mask of every attention call in the graph torch.compile captures of a training forward without
    an attention mask, with transformers made to build its mask while tracing as 5.17 does (it cannot skip an
    absent mask there)."""
    import transformers.masking_utils as masking_utils

    monkeypatch.setattr(masking_utils, "_ignore_bidirectional_mask_sdpa", lambda *args, **kwargs: False)
    masks = []

    def capture(gm, example_inputs):
        masks.extend(str(n.kwargs.get("attn_mask")) for n in gm.graph.nodes
                     if n.target is torch.nn.functional.scaled_dot_product_attention)
        return gm

    torch._dynamo.reset()
    ids, labels = batch()
    torch.compile(model.train(), backend=capture)(input_ids=ids, labels=labels)
    torch._dynamo.reset()
    return masks


def test_unpadded_blocks_reach_attention_without_a_mask_under_compile(monkeypatch):
    plain, fast = twins()
    plain.config._attn_implementation = fast.config._attn_implementation = "sdpa"
    assert _sdpa_masks_under_compile(fast, monkeypatch) == ["None", "None"]  # one call per layer, unmasked
    # the control: plain BERT under the same transformers behaviour hands every layer a built mask
    assert all(mask != "None" for mask in _sdpa_masks_under_compile(plain, monkeypatch))
