"""The model section reaches models loaded with from_pretrained, not only models built from scratch."""

from __future__ import annotations

from sparsebert.config.sections import ModelConfig
from sparsebert.jobs.finetune.glue import load_classifier
from sparsebert.models.pretrained import pretrained_kwargs


def test_dropouts_and_attention_reach_a_pretrained_classifier(minilm_path):
    model = load_classifier(minilm_path, 2, regression=False,
                            **pretrained_kwargs(ModelConfig(hidden_dropout=0.0, attention_dropout=0.05,
                                                            attn_implementation="eager")))
    assert model.config.hidden_dropout_prob == 0.0 and model.config.attention_probs_dropout_prob == 0.05
    assert model.bert.encoder.layer[0].output.dropout.p == 0.0
    assert model.config._attn_implementation == "eager"


def test_unset_dropouts_keep_the_checkpoints_own(minilm_path):
    default = load_classifier(minilm_path, 2, regression=False, **pretrained_kwargs(ModelConfig()))
    plain = load_classifier(minilm_path, 2, regression=False)
    assert default.config.hidden_dropout_prob == plain.config.hidden_dropout_prob
    assert default.config.attention_probs_dropout_prob == plain.config.attention_probs_dropout_prob


def test_num_layers_keeps_the_checkpoints_first_layers(minilm_path):
    """model.num_layers=2 on the 6-layer MiniLM: a 2-layer model whose layers and embeddings are the checkpoint's
    first two layers and its embeddings, weight for weight."""
    full = load_classifier(minilm_path, 2, regression=False)
    short = load_classifier(minilm_path, 2, regression=False,
                            **pretrained_kwargs(ModelConfig(init_from="minilm", num_layers=2)))
    assert full.config.num_hidden_layers == 6
    assert short.config.num_hidden_layers == 2 and len(short.bert.encoder.layer) == 2
    kept = full.state_dict()
    shared = [k for k in short.state_dict() if not k.startswith("classifier.")]
    assert any(k.startswith("bert.encoder.layer.1.") for k in shared)
    assert all(short.state_dict()[k].equal(kept[k]) for k in shared)


def test_a_layer_cut_is_one_line_and_other_unexpected_keys_are_still_reported(tmp_path, caplog, monkeypatch):
    """model.num_layers below the checkpoint's: one INFO line, not a table row per tensor of the dropped layers; a
    checkpoint key the model has nowhere still reaches transformers' report."""
    from safetensors.torch import load_file, save_file
    from transformers import BertConfig, BertForSequenceClassification

    import sparsebert.models.pretrained as pretrained

    config = BertConfig(vocab_size=64, hidden_size=16, num_hidden_layers=3, num_attention_heads=2,
                        intermediate_size=32, max_position_embeddings=32)
    BertForSequenceClassification(config).save_pretrained(tmp_path)
    weights = load_file(tmp_path / "model.safetensors")
    save_file({**weights, "bert.stray.weight": weights["bert.pooler.dense.weight"].clone()}, tmp_path / "model.safetensors",
              metadata={"format": "pt"})
    reported = []
    monkeypatch.setattr(pretrained, "_original_report", lambda model, source, ignore, info, logger=None:
                        reported.append(set(info.unexpected_keys)))
    with caplog.at_level("INFO", logger="sparsebert.models.pretrained"):
        model = load_classifier(str(tmp_path), 2, regression=False,
                                **pretrained_kwargs(ModelConfig(num_layers=1)))
    assert len(model.bert.encoder.layer) == 1
    assert reported == [{"bert.stray.weight"}]  # layers 1 and 2 left out of the report, the stray key kept
    lines = [r.getMessage() for r in caplog.records if r.name == "sparsebert.models.pretrained"]
    assert lines == [f"{tmp_path}: the first 1 of its 3 layers kept (num_hidden_layers=1)"]
    assert pretrained.layers_cut({"bert.encoder.layer.0.x", "bert.stray"}, 1) == ({"bert.encoder.layer.0.x",
                                                                                  "bert.stray"}, 1)
