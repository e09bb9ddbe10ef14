"""The experiment registry and typed config: derivation, deep update, --set parsing, validation, round trips."""

from __future__ import annotations

import json

import pytest

from sparsebert.config import (
    DEFAULT_SEED,
    ConfigError,
    DataConfig,
    ExperimentConfig,
    ExperimentRegistry,
    deep_update,
    from_dict,
    to_dict,
)
from sparsebert.config.experiment_registry import RESERVED_RUN_NAMES, check_run_name


@pytest.fixture(scope="module")
def registry() -> ExperimentRegistry:
    return ExperimentRegistry.builtin()


# --- the shipped experiments --------------------------------------------------------------------------------


def test_registry_finds_the_pretraining_experiments(registry):
    names = registry.names()
    assert names == sorted(names)
    assert {"bert_base", "bert_100k", "bert_small_wiki", "bert_tiny_quick"} <= set(names)


def test_every_experiment_builds_and_validates(registry):
    for name in registry.names():
        cfg = registry.build(name)
        assert isinstance(cfg, ExperimentConfig)
        assert cfg.name == name
        assert cfg.description, f"{name} has no description"
        assert registry.description(name) == cfg.description
        assert cfg.data.max_seq_length <= cfg.model.max_position_embeddings
        assert "parent" not in registry.resolve(name)


def test_bert_100k_is_bert_base_with_only_max_steps_changed(registry):
    base, derived = registry.resolve("bert_base"), registry.resolve("bert_100k")
    assert derived["train"]["max_steps"] == 100_000
    assert base["train"]["max_steps"] == 1_000_000
    expected = deep_update(base, {"description": derived["description"], "train": {"max_steps": 100_000}})
    assert derived == expected

    built_base, built_derived = to_dict(registry.build("bert_base")), to_dict(registry.build("bert_100k"))
    differing = {k for k in built_base if built_base[k] != built_derived[k]}
    assert differing == {"name", "description", "train"}
    train_diff = {k for k in built_base["train"] if built_base["train"][k] != built_derived["train"][k]}
    assert train_diff == {"max_steps"}


def test_derived_experiment_keeps_parent_values_it_does_not_restate(registry):
    tiny = registry.build("bert_tiny_quick")
    base = registry.build("bert_base")
    assert tiny.model.size == "tiny"
    assert tiny.data.max_files == 2
    # not restated by bert_tiny_quick: inherited from bert_base, not the dataclass defaults
    assert tiny.data.eval_documents == 8
    assert tiny.data.corpus == base.data.corpus
    assert tiny.train.weight_decay == base.train.weight_decay
    assert tiny.train.lr_scheduler == base.train.lr_scheduler


def test_resolve_does_not_mutate_the_registered_dicts(registry):
    first = registry.resolve("bert_100k")
    first["train"]["max_steps"] = 1
    first["model"]["size"] = "tiny"
    again = registry.resolve("bert_100k")
    assert again["train"]["max_steps"] == 100_000
    assert again["model"]["size"] == "base"
    assert registry.resolve("bert_base")["model"]["size"] == "base"


# --- deep_update ---------------------------------------------------------------------------------------------


def test_a_derived_experiment_replaces_free_form_mappings_and_merges_sections(registry):
    """Sections merge key by key, but finetune.runs_per_task is a value: tiny_glue_2to4's {} empties its parent's
    {"rte": 2, "stsb": 1} (merged, RTE would run twice)."""
    parent, child = registry.build("tiny_glue"), registry.build("tiny_glue_2to4")
    assert parent.finetune.runs_per_task == {"rte": 2, "stsb": 1}
    assert child.finetune.runs_per_task == {}
    assert child.finetune.max_train_samples == parent.finetune.max_train_samples == 128  # the section merged
    assert child.train.epochs == 1  # so did train
    out = deep_update({"sparsity": {"per_layer": {"a": 0.5, "b": 0.9}, "sparsity": 0.8}},
                      {"sparsity": {"per_layer": {"a": 0.7}}}, ExperimentConfig)
    assert out == {"sparsity": {"per_layer": {"a": 0.7}, "sparsity": 0.8}}


def test_deep_update_merges_nested_dicts_and_replaces_everything_else():
    base = {"a": {"x": 1, "y": {"p": 1, "q": 2}}, "lst": [1, 2, 3], "s": "keep", "d": {"k": 1}}
    update = {"a": {"y": {"q": 20, "r": 30}, "z": 3}, "lst": [9], "d": 5, "new": {"n": 1}}
    out = deep_update(base, update)
    assert out == {
        "a": {"x": 1, "y": {"p": 1, "q": 20, "r": 30}, "z": 3},
        "lst": [9],  # lists replace, never concatenate
        "s": "keep",
        "d": 5,  # a non-dict replaces a dict
        "new": {"n": 1},
    }


def test_deep_update_replaces_a_scalar_with_a_dict():
    assert deep_update({"a": 1}, {"a": {"b": 2}}) == {"a": {"b": 2}}


def test_deep_update_mutates_neither_input_and_shares_no_objects():
    base = {"a": {"x": [1, 2]}, "b": [1]}
    update = {"a": {"y": [3]}, "c": {"d": [4]}}
    base_before, update_before = json.loads(json.dumps(base)), json.loads(json.dumps(update))
    out = deep_update(base, update)
    assert base == base_before and update == update_before
    out["a"]["x"].append(99)
    out["a"]["y"].append(99)
    out["b"].append(99)
    out["c"]["d"].append(99)
    assert base == base_before and update == update_before


# --- registry errors -----------------------------------------------------------------------------------------


def test_parent_cycle_is_an_error():
    reg = ExperimentRegistry({"a": {"parent": "b"}, "b": {"parent": "c"}, "c": {"parent": "a"}})
    with pytest.raises(ConfigError, match="cycle") as e:
        reg.resolve("a")
    assert "a -> b -> c -> a (in <code>)" in str(e.value)  # the file that defines them: here none
    with pytest.raises(ConfigError, match="cycle"):
        reg.build("b")


def test_self_parent_is_a_cycle():
    with pytest.raises(ConfigError, match="cycle"):
        ExperimentRegistry({"a": {"parent": "a"}}).resolve("a")


def test_unknown_parent_is_an_error_naming_both():
    reg = ExperimentRegistry({"child": {"parent": "no_such_base", "train": {"max_steps": 1}}})
    with pytest.raises(ConfigError) as e:
        reg.build("child")
    assert "child" in str(e.value) and "no_such_base" in str(e.value)


def test_unknown_experiment_names_closest(registry):
    with pytest.raises(ConfigError) as e:
        registry.build("bert_tiny_quik")
    msg = str(e.value)
    assert "bert_tiny_quik" in msg and "bert_tiny_quick" in msg
    assert "\n" not in msg
    with pytest.raises(ConfigError, match="--list"):
        registry.build("zzzzzzzz")


def test_duplicate_names_across_files_is_an_error(tmp_path):
    (tmp_path / "one.py").write_text('EXPERIMENTS = {"dup": {"description": "first"}}\n')
    (tmp_path / "two.py").write_text('EXPERIMENTS = {"dup": {"description": "second"}, "other": {}}\n')
    with pytest.raises(ConfigError) as e:
        ExperimentRegistry.from_directory(tmp_path)
    msg = str(e.value)
    assert "'dup'" in msg
    assert str(tmp_path / "one.py") in msg and str(tmp_path / "two.py") in msg


def test_from_directory_skips_private_modules_and_files_without_experiments(tmp_path):
    (tmp_path / "_helpers.py").write_text('EXPERIMENTS = {"x": {"description": "private copy"}}\n')
    (tmp_path / "plain.py").write_text("VALUE = 1\n")
    (tmp_path / "real.py").write_text('EXPERIMENTS = {"x": {"description": "the real one"}}\n')
    reg = ExperimentRegistry.from_directory(tmp_path)
    assert reg.names() == ["x"]
    assert reg.description("x") == "the real one"


def test_missing_experiments_directory_is_an_error(tmp_path):
    with pytest.raises(ConfigError, match="not found"):
        ExperimentRegistry.from_directory(tmp_path / "nope")


def test_experiment_that_is_not_a_dict_is_an_error():
    with pytest.raises(ConfigError, match="'bad'.*must be a dict"):
        ExperimentRegistry({"bad": ["not", "a", "dict"]})


@pytest.mark.parametrize("name,problem", [
    (".", "cannot name a run directory"),  # --overwrite would delete the output root
    ("..", "cannot name a run directory"),  # ... or its parent
    ("/tmp/x/abs", "cannot name a run directory"),
    ("a/b", "cannot name a run directory"),
    ("a\\b", "cannot name a run directory"),
    ("-x", "cannot name a run directory"),  # would read as an option on the command line
    (".hidden", "cannot name a run directory"),  # or clash with a run's lock file, .NAME.lock
    ("", "cannot name a run directory"),
    ("search", "its search studies"),
    ("Search", "its search studies"),
    ("registry.sqlite", "its run registry"),
    ("registry.sqlite-wal", "its run registry"),
    ("a=b", "cannot hold '='"),  # NAME=RUN on the command line
])
def test_a_name_that_cannot_be_its_run_directory_is_refused_naming_its_file(tmp_path, name, problem):
    mine = tmp_path / "mine.yaml"
    mine.write_text(f"{json.dumps(name)}: {{parent: bert_tiny_quick}}\n")
    with pytest.raises(ConfigError) as e:
        ExperimentRegistry.builtin([mine])
    assert problem in str(e.value) and f"experiment {name!r} in {mine}" in str(e.value)


def test_names_of_letters_digits_and_punctuation_pass():
    reg = ExperimentRegistry({"a": {}, "my_exp-2.v1": {"parent": "a"}, "_x~1+2": {}})
    assert reg.names() == ["_x~1+2", "a", "my_exp-2.v1"]
    check_run_name("glue_from=bert_100k", "a NAME=RUN run")  # a run name may hold '=', as such runs do


def test_the_reserved_names_are_what_the_tool_keeps_in_the_output_root(tmp_path):
    """Spelled out in config (results and search import it, not the reverse): they must follow the real ones."""
    from sparsebert.results import REGISTRY_FILENAME
    from sparsebert.search.plan import SearchPlan

    plan = SearchPlan(experiment="e", space="s", distributions={}, space_params={}, trials=1, overrides=[],
                      metric="eval_loss", direction="min", parallel=1, gpus=[], study="study", seed=0,
                      output_root=tmp_path, data_dir=None, experiment_paths=[])
    kept = {plan.study_dir.relative_to(tmp_path).parts[0], REGISTRY_FILENAME, f"{REGISTRY_FILENAME}-wal",
            f"{REGISTRY_FILENAME}-shm", f"{REGISTRY_FILENAME}-journal"}
    assert kept == set(RESERVED_RUN_NAMES)


@pytest.mark.parametrize("text", ["p2: {parent: [tiny_glue]}\n", "p2: {parent: 3}\n"])
def test_a_parent_that_is_no_name_is_refused_when_loaded_naming_the_file(tmp_path, text):
    mine = tmp_path / "mine.yaml"
    mine.write_text(text)
    with pytest.raises(ConfigError, match="parent must be the name of one experiment") as e:
        ExperimentRegistry.builtin([mine])
    assert f"experiment 'p2' in {mine}" in str(e.value)


def test_unknown_parents_are_found_when_the_files_are_loaded_naming_the_file(tmp_path):
    """Before any experiment is resolved; a parent from a file loaded after its child's is no error."""
    (tmp_path / "a_child.yaml").write_text("child: {parent: base_of_mine}\n")
    (tmp_path / "b_base.yaml").write_text("base_of_mine: {parent: bert_tiny_quick}\n")
    assert ExperimentRegistry.builtin([tmp_path]).parents("child")[:3] == ["child", "base_of_mine", "bert_tiny_quick"]
    (tmp_path / "c_orphan.yaml").write_text("orphan: {parent: base_of_mne}\n")
    with pytest.raises(ConfigError) as e:
        ExperimentRegistry.builtin([tmp_path])
    assert str(e.value).startswith(f"experiment 'orphan' in {tmp_path / 'c_orphan.yaml'} names an unknown parent "
                                   "'base_of_mne'; closest: base_of_mine")


def test_a_module_that_exits_at_import_is_a_config_error_naming_it(tmp_path):
    (tmp_path / "exits.py").write_text("raise SystemExit(3)\n")
    with pytest.raises(ConfigError) as e:
        ExperimentRegistry.builtin([tmp_path / "exits.py"])
    assert str(e.value) == f"{tmp_path / 'exits.py'}: cannot load it: SystemExit: 3"


# --- --set overrides ----------------------------------------------------------------------------------------


@pytest.mark.parametrize("item,getter,expected", [
    ("train.max_steps=3", lambda c: c.train.max_steps, 3),
    ("train.max_steps=1_000", lambda c: c.train.max_steps, 1000),
    ("train.learning_rate=3e-4", lambda c: c.train.learning_rate, 3e-4),
    ("train.learning_rate=1", lambda c: c.train.learning_rate, 1.0),
    ("train.torch_compile=true", lambda c: c.train.torch_compile, True),
    ("train.torch_compile=Yes", lambda c: c.train.torch_compile, True),
    ("train.eval_at_start=false", lambda c: c.train.eval_at_start, False),
    ("train.eval_at_start=0", lambda c: c.train.eval_at_start, False),
    ("model.size=small", lambda c: c.model.size, "small"),
    ("description=a b = c", lambda c: c.description, "a b = c"),
    ("model.init_from=None", lambda c: c.model.init_from, None),
    ("data.max_files=none", lambda c: c.data.max_files, None),
    ("data.max_files=7", lambda c: c.data.max_files, 7),
    ("data.hub_config=null", lambda c: c.data.hub_config, None),
    ("train.per_device_batch_size=16", lambda c: c.train.per_device_batch_size, 16),
    ("train.report_to=tensorboard,wandb", lambda c: c.train.report_to, ["tensorboard", "wandb"]),
    ("train.report_to=wandb", lambda c: c.train.report_to, ["wandb"]),
    ('train.report_to=["wandb"]', lambda c: c.train.report_to, ["wandb"]),
    ("train.report_to=", lambda c: c.train.report_to, []),
    ("seed=7", lambda c: c.seed, 7),
])
def test_set_good_values(registry, item, getter, expected):
    cfg = registry.build("bert_tiny_quick", [item])
    value = getter(cfg)
    assert value == expected
    assert type(value) is type(expected)


def test_set_later_override_wins_and_others_untouched(registry):
    cfg = registry.build("bert_tiny_quick", ["train.max_steps=5", "train.max_steps=9", "model.size=mini"])
    plain = registry.build("bert_tiny_quick")
    assert cfg.train.max_steps == 9 and cfg.model.size == "mini"
    assert cfg.train.global_batch_size == plain.train.global_batch_size == 32
    assert cfg.data == plain.data


def test_set_does_not_leak_into_the_registry(registry):
    registry.build("bert_tiny_quick", ["train.max_steps=5"])
    assert registry.build("bert_tiny_quick").train.max_steps == 150
    assert registry.resolve("bert_base")["train"]["max_steps"] == 1_000_000


def test_max_steps_on_an_epoch_schedule_is_refused_not_ignored(registry):
    """minilm_glue trains 3 epochs; --set train.max_steps=2 alone used to train all of them (epochs win), and so
    did a user's experiment that set it under such a parent."""
    message = (r"minilm_glue: train.max_steps=2 would be ignored, since it trains by train.epochs=3; set "
               r"train.epochs=null \(--set train.epochs=null\) to train by steps")
    with pytest.raises(ConfigError, match=message):
        registry.build("minilm_glue", ["train.max_steps=2"])
    mine = ExperimentRegistry.builtin()  # not the module's: it would keep the user's experiments
    mine.add("my_quick_glue", {"parent": "minilm_glue", "train": {"max_steps": 5}})
    with pytest.raises(ConfigError, match="my_quick_glue: train.max_steps=5 would be ignored"):
        mine.build("my_quick_glue")
    # epochs set nearer than max_steps switch the schedule to epochs: no refusal
    mine.add("my_epochs", {"parent": "my_quick_glue", "train": {"epochs": 2}})
    assert mine.build("my_epochs").train.epochs == 2
    assert mine.build("my_quick_glue", ["train.epochs=1"]).train.epochs == 1
    by_steps = registry.build("minilm_glue", ["train.max_steps=2", "train.epochs=null"])
    assert (by_steps.train.max_steps, by_steps.train.epochs) == (2, None)
    assert registry.build("bert_tiny_quick", ["train.max_steps=2"]).train.max_steps == 2  # pretraining: steps


def test_set_unknown_key_names_full_key_and_suggests(registry):
    with pytest.raises(ConfigError) as e:
        registry.build("bert_tiny_quick", ["train.max_step=3"])
    msg = str(e.value)
    assert "'train.max_step'" in msg
    assert "did you mean 'train.max_steps'" in msg


def test_set_unknown_section_names_full_key(registry):
    with pytest.raises(ConfigError) as e:
        registry.build("bert_tiny_quick", ["trian.max_steps=3"])
    assert "'trian.max_steps'" in str(e.value)
    assert "'train'" in str(e.value)


@pytest.mark.parametrize("item,key", [
    ("train.max_steps=abc", "train.max_steps"),
    ("train.max_steps=3.5", "train.max_steps"),
    ("train.learning_rate=fast", "train.learning_rate"),
    ("train.torch_compile=maybe", "train.torch_compile"),
    ("data.max_files=two", "data.max_files"),
    ("train.max_steps=None", "train.max_steps"),  # not an optional field
])
def test_set_wrong_type_names_the_key(registry, item, key):
    with pytest.raises(ConfigError) as e:
        registry.build("bert_tiny_quick", [item])
    assert key in str(e.value)


def test_set_list_with_wrong_item_type_names_the_item(registry):
    with pytest.raises(ConfigError) as e:
        registry.build("bert_tiny_quick", ["train.report_to=[1]"])
    assert "train.report_to[0]" in str(e.value)


def test_set_sub_key_of_a_leaf_is_an_error(registry):
    with pytest.raises(ConfigError) as e:
        registry.build("bert_tiny_quick", ["train.max_steps.foo=1"])
    msg = str(e.value)
    assert "train.max_steps.foo" in msg and "no sub-keys" in msg


def test_set_name_is_refused(registry):
    with pytest.raises(ConfigError, match="name"):
        registry.build("bert_tiny_quick", ["name=other"])


def test_set_without_equals_is_an_error(registry):
    with pytest.raises(ConfigError, match="key.sub=value"):
        registry.build("bert_tiny_quick", ["train.max_steps"])


# --- validation ---------------------------------------------------------------------------------------------


@pytest.mark.parametrize("items,keys", [
    (["model.size=huge"], ["model.size"]),
    (["data.max_seq_length=1024"], ["data.max_seq_length", "model.max_position_embeddings"]),
    (["data.max_seq_length=4"], ["data.max_seq_length"]),
    (["data.mlm_probability=0"], ["data.mlm_probability"]),
    (["data.eval_documents=0"], ["data.eval_documents"]),
    (["data.max_files=0"], ["data.max_files"]),
    (["data.format=xml"], ["data.format"]),
    (["train.precision=fp4"], ["train.precision", "fp8"]),
    (["train.report_to=tensorboard,mlflow"], ["train.report_to", "mlflow"]),
    (["train.learning_rate=0"], ["train.learning_rate"]),
    (["train.learning_rate=nan"], ["train.learning_rate", "finite"]),
    # adam_epsilon 0 makes every masked weight NaN (0 / 0 in the Adam update); torch accepts it
    (["train.adam_epsilon=0"], ["train.adam_epsilon", "> 0"]),
    (["train.adam_beta2=1"], ["train.adam_beta2", "[0, 1)"]),
    (["train.adam_beta1=-0.1"], ["train.adam_beta1"]),
    (["train.weight_decay=-0.01"], ["train.weight_decay", ">= 0"]),
    (["train.max_grad_norm=inf"], ["train.max_grad_norm", "finite"]),
    (["task=glue", "train.epochs=inf"], ["train.epochs", "finite"]),
    (["task=squad_v1", "finetune.n_best_size=0"], ["finetune.n_best_size"]),
    (["task=squad_v1", "finetune.max_answer_length=0"], ["finetune.max_answer_length"]),
    (["task=glue", "finetune.pad_to_multiple_of=0"], ["finetune.pad_to_multiple_of"]),
    # a runs_per_task key that matches no task was silently ignored; GLUE names were checked only at data load
    (["task=glue", "model.init_from=minilm", 'finetune.runs_per_task={"rtee": 3}'],
     ["finetune.runs_per_task", "rtee", "sst2"]),
    (["task=glue", "model.init_from=minilm", 'finetune.glue_tasks=["rte", "sst"]'], ["finetune.glue_tasks", "'sst'"]),
    (["train.max_steps=0"], ["train.max_steps"]),
    (["model.hidden_dropout=1.0"], ["model.hidden_dropout"]),
    (["model.num_layers=2"], ["model.num_layers", "model.init_from"]),  # bert_tiny_quick builds from a size
    (["model.init_from=minilm", "model.num_layers=0"], ["model.num_layers"]),
    (["task=clm"], ["task"]),
    (["train.lr_scheduler=foo"], ["train.lr_scheduler", "'foo'", "cosine"]),
    (["train.optim=foo"], ["train.optim", "'foo'", "adamw_torch"]),
    (["onecycle.base_momentum=0.99"], ["onecycle.base_momentum", "onecycle.max_momentum"]),
])
def test_validation_errors_name_the_key(registry, items, keys):
    assert_refused_naming(registry, "bert_tiny_quick", items, keys)


def assert_refused_naming(registry, name: str, items: list[str], keys: list[str]) -> None:
    with pytest.raises(ConfigError) as e:
        registry.build(name, items)
    for key in keys:
        assert key in str(e.value)


def test_transformers_scheduler_and_optimizer_names_are_accepted(registry):
    cfg = registry.build("bert_tiny_quick", ["train.lr_scheduler=cosine_with_min_lr", "train.optim=adafactor"])
    assert (cfg.train.lr_scheduler, cfg.train.optim) == ("cosine_with_min_lr", "adafactor")
    assert registry.build("bert_tiny_quick", ["train.optim=auto"]).train.optim == "auto"


def test_onecycle_momentum_may_stay_flat(registry):
    cfg = registry.build("bert_tiny_quick", ["onecycle.base_momentum=0.9", "onecycle.max_momentum=0.9"])
    assert (cfg.onecycle.base_momentum, cfg.onecycle.max_momentum) == (0.9, 0.9)  # no refusal of an equal pair


@pytest.mark.parametrize("items,keys", [
    # sparse_tiny_rigl trains 150 steps: RigL ends at 0.75 x 150 = 112 unless told otherwise
    (["rigl.begin_step=200"], ["rigl.begin_step (200)", "optimizer steps (150)"]),
    (["rigl.begin_step=120"], ["rigl.end_step (resolved to 112", "rigl.begin_step (120)"]),
    # updates fall on multiples of update_freq, before 0.75 x 120 = 90: none
    (["train.max_steps=120", "rigl.update_freq=100"], ["never update the masks", "step 100", "before step 90"]),
    (["rigl=null", "gmp.begin_step=150"], ["gmp.begin_step (150)", "optimizer steps (150)"]),
    (["rigl=null", "gmp.end_step=151"], ["gmp.end_step (151)", "optimizer steps (150)"]),
    (["rigl=null", "gmp.initial_sparsity=0.5"], ["gmp.initial_sparsity", "sparsity.init=magnitude"]),
])
def test_sparsity_schedules_must_fit_the_run_length(registry, items, keys):
    assert_refused_naming(registry, "sparse_tiny_rigl", items, keys)


def test_rigl_and_gmp_together_build_but_not_with_movement_scores(registry):
    cfg = registry.build("sparse_tiny_rigl", ["gmp.end_fraction=0.5"])
    assert cfg.rigl.update_freq == 10 and cfg.gmp.end_fraction == 0.5
    assert_refused_naming(registry, "sparse_tiny_rigl", ["gmp.score=movement"], ['gmp.score "movement"'])
    assert_refused_naming(registry, "sparse_tiny_rigl", ["gmp.end_step=140", "rigl.global_ranking=true"],
                          ["rigl.global_ranking=true", "gmp.global_ranking=false"])
    # RigL ends at 0.75 x 150 = 112, before pruning begins
    assert_refused_naming(registry, "sparse_tiny_rigl", ["gmp.begin_step=120", "gmp.end_step=140"],
                          ["rigl.end_step (resolved to 112)", "gmp.begin_step (120)"])


def test_obs_settings_are_set_keys_and_obs_is_refused_with_rigl(registry):
    cfg = registry.build("sparse_tiny_rigl", ["rigl=null", "gmp.score=obs", "gmp.obs_block_size=64",
                                              "gmp.obs_num_grads=16", "gmp.obs_damping=1e-6",
                                              "gmp.obs_update_weights=false"])
    assert (cfg.gmp.score, cfg.gmp.obs_block_size, cfg.gmp.obs_num_grads, cfg.gmp.obs_damping,
            cfg.gmp.obs_update_weights) == ("obs", 64, 16, 1e-6, False)
    assert_refused_naming(registry, "sparse_tiny_rigl", ["rigl=null", "gmp.obs_block_size=0"],
                          ["gmp.obs_block_size must be a positive integer"])
    assert_refused_naming(registry, "sparse_tiny_rigl", ["gmp.score=obs"], ['rigl with gmp.score "obs"'])


def test_sparse_all_reduce_needs_masks(registry):
    assert_refused_naming(registry, "bert_tiny_quick", ["train.ddp.comm_hook=sparse"],
                          ["train.ddp.comm_hook=sparse", "sparsity section"])
    assert_refused_naming(registry, "bert_tiny_quick", ["train.ddp.comm_hook=active"],
                          ["none, bf16, fp16, flat, flat_bf16 or sparse", "'active'"])
    assert registry.build("sparse_tiny_rigl", ["train.ddp.comm_hook=sparse"]).train.ddp.comm_hook == "sparse"
    for hook in ("flat", "flat_bf16"):  # dense runs too
        assert registry.build("bert_tiny_quick", [f"train.ddp.comm_hook={hook}"]).train.ddp.comm_hook == hook
    assert registry.build("bert_tiny_quick", ["train.ddp.comm_hook=flat", "train.ddp.flat_pieces=4"]
                          ).train.ddp.flat_pieces == 4
    assert_refused_naming(registry, "bert_tiny_quick", ["train.ddp.flat_pieces=4"],
                          ["train.ddp.flat_pieces=4", "comm_hook=none"])
    assert_refused_naming(registry, "bert_tiny_quick", ["train.ddp.comm_hook=flat", "train.ddp.flat_pieces=0"],
                          ["train.ddp.flat_pieces must be >= 1"])
    for hook, experiment in (("sparse", "sparse_tiny_rigl"), ("flat", "bert_tiny_quick")):
        for key in ("static_graph", "find_unused_parameters", "broadcast_buffers"):  # they act through the reducer
            assert_refused_naming(registry, experiment, [f"train.ddp.comm_hook={hook}", f"train.ddp.{key}=true"],
                                  [f"train.ddp.{key}=true", f"comm_hook={hook}"])


def test_sparsity_schedules_counted_in_epochs_are_checked_against_the_data_later(registry):
    cfg = registry.build("sparse_tiny_rigl", ["rigl.begin_step=200", "task=glue", "model.init_from=minilm",
                                              "train.epochs=1"])
    assert cfg.rigl.begin_step == 200  # the run length is known once the training set is loaded


def test_longer_sequences_are_fine_with_more_positions(registry):
    cfg = registry.build("bert_tiny_quick",
                         ["data.max_seq_length=1024", "model.max_position_embeddings=1024"])
    assert cfg.data.max_seq_length == 1024


def test_init_from_lifts_the_size_check(registry):
    cfg = registry.build("bert_tiny_quick", ["model.size=huge", "model.init_from=minilm"])
    assert cfg.model.init_from == "minilm"


def test_from_dict_rejects_unknown_and_mistyped_keys_in_experiment_dicts():
    with pytest.raises(ConfigError) as e:
        ExperimentRegistry({"x": {"train": {"max_stpes": 1}}}).build("x")
    assert "'train.max_stpes'" in str(e.value) and "'train.max_steps'" in str(e.value)
    with pytest.raises(ConfigError, match="train.max_steps"):
        ExperimentRegistry({"x": {"train": {"max_steps": "10"}}}).build("x")
    with pytest.raises(ConfigError, match="train.max_steps"):
        ExperimentRegistry({"x": {"train": {"max_steps": True}}}).build("x")  # a bool is not an int here
    with pytest.raises(ConfigError, match="train.torch_compile"):
        ExperimentRegistry({"x": {"train": {"torch_compile": 1}}}).build("x")
    with pytest.raises(ConfigError, match="model"):
        ExperimentRegistry({"x": {"model": "base"}}).build("x")
    with pytest.raises(ConfigError, match="train.report_to"):
        ExperimentRegistry({"x": {"train": {"report_to": "wandb"}}}).build("x")


def test_from_dict_turns_ints_into_floats_for_float_fields():
    cfg = ExperimentRegistry({"x": {"train": {"learning_rate": 1}}}).build("x")
    assert cfg.train.learning_rate == 1.0 and isinstance(cfg.train.learning_rate, float)


# --- round trips and defaults -------------------------------------------------------------------------------


def test_to_dict_round_trips_through_from_dict(registry):
    for name in registry.names():
        cfg = registry.build(name)
        plain = to_dict(cfg)
        assert json.loads(json.dumps(plain)) == plain  # plain JSON data, as config.json holds
        again = from_dict(ExperimentConfig, json.loads(json.dumps(plain)))
        assert again == cfg
        assert to_dict(again) == plain


def test_to_dict_of_section_has_every_field():
    plain = to_dict(DataConfig())
    assert plain["corpus"] == "wikipedia-enwiki-2015-wikiextractor"
    assert from_dict(DataConfig, plain) == DataConfig()


def test_default_seed_is_fixed(registry):
    assert DEFAULT_SEED == 42
    assert ExperimentConfig(name="x").seed == 42
    for name in registry.names():
        assert registry.build(name).seed == 42
    assert ExperimentRegistry({"x": {}}).build("x").seed == 42


def test_static_mask_count_refuses_finetuning(registry):
    assert registry.build("bert_tiny_quick", ["data.static_mask_count=true"]).data.static_mask_count
    assert registry.build("bert_tiny_quick", ["data.static_mask_count=true", "kd.teacher=bert_tiny_quick"]).kd
    with pytest.raises(ConfigError, match="static_mask_count is for MLM pretraining"):
        registry.build("tiny_glue", ["data.static_mask_count=true"])


def test_config_knows_the_glue_tasks_the_data_package_reads():
    """config checks finetune.glue_tasks without importing the data package: its name list must match the task
    table the readers use."""
    from sparsebert.config.experiment import GLUE_TASK_NAMES, glue_task_key
    from sparsebert.data.glue import GLUE_TASKS, get_glue_task

    assert set(GLUE_TASK_NAMES) == set(GLUE_TASKS)
    assert get_glue_task("SST-2").name == glue_task_key("SST-2") == "sst2"


def test_stop_after_steps_must_cut_a_step_schedule_short(registry):
    assert registry.build("bert_tiny_quick", ["train.stop_after_steps=50"]).train.stop_after_steps == 50
    assert_refused_naming(registry, "bert_tiny_quick", ["train.stop_after_steps=150"],
                          ["train.stop_after_steps", "max_steps=150", "150"])
    assert_refused_naming(registry, "bert_tiny_quick", ["train.stop_after_steps=0"], ["train.stop_after_steps"])
    assert_refused_naming(registry, "tiny_glue", ["train.stop_after_steps=5", "train.epochs=null"],
                          ["train.stop_after_steps", "pretraining"])


def test_hidden_state_distillation_is_refused_where_the_model_returns_no_hidden_states(registry):
    kd = ["kd.teacher=minilm_gap_mul", "kd.hidden_weight=1.0"]
    with pytest.raises(ConfigError, match="kd.hidden_weight needs hidden states from the model: the GAP heads"):
        registry.build("minilm_gap_mul", kd)
    assert registry.build("tiny_glue", ["kd.teacher=minilm", "kd.hidden_weight=1.0"]).kd.hidden_weight == 1.0


def test_finetuning_reports_to_tensorboard_like_pretraining(registry):
    """Every shipped experiment, finetuning too, writes TensorBoard logs unless it says otherwise (the finetuning
    base once set report_to=[]: its runs logged nowhere)."""
    silent = [name for name in registry.names() if not registry.build(name).train.report_to]
    assert silent == []
    assert registry.build("tiny_glue").train.report_to == ["tensorboard"]
