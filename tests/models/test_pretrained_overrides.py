"""The model section reaches models loaded with from_pretrained, not only models built from scratch."""

from __future__ import annotations

from sparsebert.config.sections import ModelConfig
from sparsebert.models.pretrained import pretrained_kwargs
from sparsebert.trainer.finetune.glue import load_classifier


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
