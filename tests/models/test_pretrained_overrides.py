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


def test_an_unfinished_run_directory_is_not_taken_for_a_model(tmp_path):
    import json

    import pytest

    from sparsebert.errors import SparseBertError
    from sparsebert.models.pretrained import resolve_pretrained

    run = tmp_path / "halfrun"  # what a run holds before it exports model/: the experiment's config and env
    run.mkdir()
    (run / "config.json").write_text(json.dumps({"name": "halfrun", "task": "mlm"}))
    (run / "env.json").write_text("{}")
    with pytest.raises(SparseBertError, match="halfrun has not finished"):
        resolve_pretrained("halfrun", tmp_path)


def test_a_name_is_a_run_an_org_id_or_a_mistake(tmp_path, monkeypatch):
    """A bare name that is no run is refused naming the close runs, not passed to the hub to fail as a network
    error; org/name ids, and legacy names the local hub cache holds, go to the hub."""
    import huggingface_hub
    import pytest

    from sparsebert.errors import SparseBertError
    from sparsebert.models.pretrained import resolve_pretrained

    runs = tmp_path / "runs"
    (runs / "bert_small_wiki").mkdir(parents=True)
    with pytest.raises(SparseBertError, match=rf"kd.teacher bert_smal_wiki: no run bert_smal_wiki exists under {runs} "
                                              r"\(close: bert_small_wiki\)") as e:
        resolve_pretrained("bert_smal_wiki", runs, "kd.teacher")
    assert "hub" not in str(e.value)
    assert resolve_pretrained("google-bert/bert-base-uncased", runs) == "google-bert/bert-base-uncased"
    cached = tmp_path / "hub" / "models--bert-base-uncased"
    (cached / "snapshots" / "abc").mkdir(parents=True)
    (cached / "snapshots" / "abc" / "config.json").write_text("{}")
    (cached / "refs").mkdir()
    (cached / "refs" / "main").write_text("abc")
    monkeypatch.setattr(huggingface_hub.constants, "HF_HUB_CACHE", str(tmp_path / "hub"))
    assert resolve_pretrained("bert-base-uncased", runs) == "bert-base-uncased"
