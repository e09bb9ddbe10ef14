"""Run lookup: a name is a finished run of ours, a model directory, a hub id, or a mistake named as one."""

from __future__ import annotations


def test_an_unfinished_run_directory_is_not_taken_for_a_model(tmp_path):
    import json

    import pytest

    from sparsebert.errors import SparseBertError
    from sparsebert.results.runs import resolve_pretrained

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
    from sparsebert.results.runs import resolve_pretrained

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


def finetuning_experiment(root, finished_runs: list[str]):
    """What a finetuning experiment leaves in the output root: its config, env and DONE, and per task and run a
    directory with the exported model/ (none of its own)."""
    import json

    experiment = root / "tiny_glue"
    experiment.mkdir(parents=True)
    (experiment / "config.json").write_text(json.dumps({"name": "tiny_glue", "task": "glue"}))
    (experiment / "env.json").write_text("{}")
    (experiment / "DONE").write_text("x\n")
    for run in finished_runs:
        (experiment / run / "model").mkdir(parents=True)
        (experiment / run / "model" / "config.json").write_text("{}")
        (experiment / run / "DONE").write_text("x\n")
    return experiment


def test_a_finetuning_experiment_is_no_model_and_the_error_names_one_of_its_runs(tmp_path):
    """glue_from=tiny_glue after a finished tiny_glue: not 'has not finished', but where its models are."""
    import pytest

    from sparsebert.errors import SparseBertError
    from sparsebert.results.runs import resolve_pretrained

    experiment = finetuning_experiment(tmp_path, ["glue_stsb/run0", "glue_rte/run1", "glue_rte/run0"])
    with pytest.raises(SparseBertError, match=rf"^model.init_from tiny_glue: {experiment} is a finetuning experiment, "
                                              r"whose models are those of its runs: name one, e\.g\. "
                                              r"tiny_glue/glue_rte/run0$"):
        resolve_pretrained("tiny_glue", tmp_path, "model.init_from")
    with pytest.raises(SparseBertError, match=rf"e\.g\. {experiment}/glue_rte/run0$"):  # named by its path
        resolve_pretrained(f"{experiment}/", None, "kd.teacher")
    assert resolve_pretrained("tiny_glue/glue_rte/run0", tmp_path) == str(experiment / "glue_rte" / "run0" / "model")


def test_a_finetuning_experiment_without_an_exported_model_says_so(tmp_path):
    import pytest

    from sparsebert.errors import SparseBertError
    from sparsebert.results.runs import resolve_pretrained

    finetuning_experiment(tmp_path, [])
    with pytest.raises(SparseBertError, match=r"kd.teacher tiny_glue: .* is a finetuning experiment, whose models are "
                                              r"those of its runs \(<task>/run<k>\), and none of them has finished"):
        resolve_pretrained("tiny_glue", tmp_path, "kd.teacher")
