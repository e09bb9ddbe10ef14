"""Upstream pruning of the package MiniLM on Wikipedia, then fixed-mask transfer to each task (docs/results.md).

``minilm_upstream_sparse*``: global gradual pruning of the encoder's Linear weights to 80 / 90 % on the Wikipedia
mirror while the student distils the dense MiniLM's layers (task ``upstream``: it has no MLM head), then recovery
at fixed masks. ``*_obs``: the same, ranked by the Optimal BERT Surgeon's second-order score (with its weight
update) instead of |w|.

``minilm_<task>_from_upstream*``: finetune that model with its masks fixed (read from its zeros), distilled from
the same task's dense finetuned run (``minilm_glue``, ``minilm_squad_v1``, ``minilm_gap_*``), which must have
finished in the same output root first:

    python run.py minilm_upstream_sparse80_obs_nodropout minilm_glue minilm_glue_sparse80
"""

UPSTREAM = {
    "task": "upstream",
    "model": {"init_from": "minilm"},
    "data": {"corpus": "wikipedia-enwiki-2015-wikiextractor", "format": "wikiextractor", "max_seq_length": 128,
             "eval_documents": 130, "max_eval_samples": 2048},
    "train": {"max_steps": 8_000, "global_batch_size": 256, "learning_rate": 1e-4, "warmup_steps": 400,
              "lr_scheduler": "linear", "weight_decay": 0.01, "eval_steps": 1_000, "save_steps": 2_000,
              "logging_steps": 50, "drop_last_batch": True, "dataloader_workers": 2},
    "kd": {"teacher": "minilm", "hidden_weight": 1.0},
    "sparsity": {"sparsity": 0.8, "init": "magnitude"},
    # prune every 100 steps on the cubic ramp until 70 % of training, ranked over all layers; recover at fixed masks
    "gmp": {"initial_sparsity": 0.0, "begin_step": 0, "end_fraction": 0.7, "frequency": 100,
            "global_ranking": True},
}
# the Fisher of each prune: the 100 gradients since the previous one (gmp.frequency), each of a 256-block batch
OBS = {"score": "obs", "obs_num_grads": 100}
# transfer: the masks come with the model; the student does not start from its teacher (the dense finetuned run)
TRANSFER_KD = {"alpha": 1.0, "temperature": 2.0}
TRANSFER_TRAIN = {"epochs": 8, "learning_rate": 1e-4}
UPSTREAM_RUNS = {"80": "minilm_upstream_sparse80", "90": "minilm_upstream_sparse90",
                 "80_obs": "minilm_upstream_sparse80_obs", "90_obs": "minilm_upstream_sparse90_obs",
                 "80_obs_nodropout": "minilm_upstream_sparse80_obs_nodropout",
                 "90_obs_nodropout": "minilm_upstream_sparse90_obs_nodropout",
                 "80_obs_long": "minilm_upstream_sparse80_obs_long",
                 "80_obs_cap90": "minilm_upstream_sparse80_obs_cap90",
                 "80_obs_attn": "minilm_upstream_sparse80_obs_attn",
                 "90_obs_attn": "minilm_upstream_sparse90_obs_attn"}
# every transfer finetunes with MiniLM's own dropout, whatever the upstream run trained with (its config.json says)
TRANSFER_MODEL = {"hidden_dropout": 0.1, "attention_dropout": 0.1}
# task family -> (its dense experiment, which is the teacher, and what the transfer changes besides)
TRANSFER_TASKS = {
    # the eager path the transfers were measured with (minilm_glue itself takes the GPU fast path)
    "glue": ("minilm_glue", {"finetune": {"epochs_per_task": {"sst2": 1}, "gpu_fast_path": False}}),
    "squad_v1": ("minilm_squad_v1", {"train": {"epochs": 8}}),  # 8 beat 4 by 8.4 F1 (docs/results.md)
    "gap_mul": ("minilm_gap_mul", {}),
    "gap_concat": ("minilm_gap_concat", {}),
}

EXPERIMENTS = {
    "minilm_upstream_sparse80": {
        **UPSTREAM,
        "description": "package MiniLM pruned to 80% on Wikipedia (global GMP, 8k steps of 256), distilling its "
                       "dense self's layers",
    },
    "minilm_upstream_sparse90": {
        "parent": "minilm_upstream_sparse80",
        "description": "minilm_upstream_sparse80 at 90%",
        "sparsity": {"sparsity": 0.9},
    },
    "minilm_upstream_sparse80_obs": {
        "parent": "minilm_upstream_sparse80",
        "description": "minilm_upstream_sparse80 ranked by the oBERT score (block Fisher, OBS weight update)",
        "gmp": OBS,
    },
    "minilm_upstream_sparse90_obs": {
        "parent": "minilm_upstream_sparse90",
        "description": "minilm_upstream_sparse90 ranked by the oBERT score",
        "gmp": OBS,
    },
    # the student's dropout is noise on a deterministic target: at 80 % its training distance (0.042) is more than
    # the eval one (0.028), and the Fisher's gradients carry that noise
    **{
        f"minilm_upstream_sparse{level}_obs_nodropout": {
            "parent": f"minilm_upstream_sparse{level}_obs",
            "description": f"minilm_upstream_sparse{level}_obs with the student's dropout off",
            "model": {"hidden_dropout": 0.0, "attention_dropout": 0.0},
        }
        for level in (80, 90)
    },
    **{
        f"minilm_{family}_from_upstream{suffix}": {
            "parent": dense,
            "description": f"{upstream} finetuned on {family} with its masks fixed, distilled from {dense}",
            "model": {"init_from": upstream, **TRANSFER_MODEL},
            "train": TRANSFER_TRAIN,
            "kd": {**TRANSFER_KD, "teacher": dense},
            **changes,
        }
        for family, (dense, changes) in TRANSFER_TASKS.items()
        for suffix, upstream in UPSTREAM_RUNS.items()
    },
    # the long schedule: twice the steps, so pruning ends at step 11 200 and the recovery is 4 800 steps. Closer to
    # the teacher, but GLUE after transfer within seed noise of the 8 000-step run (docs/results.md, "tried")
    "minilm_upstream_sparse80_obs_long": {
        "parent": "minilm_upstream_sparse80_obs",
        "description": "minilm_upstream_sparse80_obs for 16k steps (pruning to 70 % of them, then recovery)",
        "train": {"max_steps": 16_000, "warmup_steps": 800, "eval_steps": 2_000, "save_steps": 4_000},
    },
    # no tensor past 90 %: oBERT leaves the last layer 1-10 % dense, which a task can barely adapt with its masks
    # fixed. Measured worse on GLUE than without the cap (docs/results.md, "tried"): kept as the named experiment
    "minilm_upstream_sparse80_obs_cap90": {
        "parent": "minilm_upstream_sparse80_obs",
        "description": "minilm_upstream_sparse80_obs with no tensor pruned past 90 %",
        "gmp": {"max_tensor_sparsity": 0.9},
    },
    # the attention term (MiniLM's own self-attention transfer): the KL between the two models' attention
    # distributions beside the layer distance, on the run without dropout (the shipped one at 80 %; eager attention
    # returns the distributions after dropout, so that must be off anyway). A slower upstream run
    **{
        f"minilm_upstream_sparse{level}_obs_attn": {
            "parent": f"minilm_upstream_sparse{level}_obs_nodropout",
            "description": f"minilm_upstream_sparse{level}_obs_nodropout also distilling the dense MiniLM's "
                           "attention distributions",
            "model": {"attn_implementation": "eager"},
            "kd": {"attention_weight": 1.0},
        }
        for level in (80, 90)
    },
    # the GLUE transfer's open settings (CoLA carries its gap, docs/results.md): a higher learning rate, which sparse
    # models wanted in the pretraining study, and the dense teacher's layer outputs distilled too (TinyBERT's task
    # distillation), on the 80 % oBERT model
    "minilm_glue_from_upstream80_obs_lr2e4": {
        "parent": "minilm_glue_from_upstream80_obs",
        "description": "minilm_glue_from_upstream80_obs at learning rate 2e-4",
        "train": {"learning_rate": 2e-4},
    },
    "minilm_glue_from_upstream80_obs_hidden": {
        "parent": "minilm_glue_from_upstream80_obs",
        "description": "minilm_glue_from_upstream80_obs also distilling the dense teacher's layer outputs",
        "kd": {"hidden_weight": 1.0},
    },
    # the best of 8 trials of `--space transfer` on CoLA from the shipped 80 % model (call I, docs/results.md; 3 seeds
    # a trial): half the loss on the labels, a sharper teacher, twice the epochs at a lower rate. Chosen on the
    # seeds it was scored on, so it is not the shipped recipe until every task and fresh seeds confirm it
    "minilm_glue_from_upstream80_obs_nodropout_searched": {
        "parent": "minilm_glue_from_upstream80_obs_nodropout",
        "description": "minilm_glue_from_upstream80_obs_nodropout with the CoLA search's best settings: lr 7e-5, "
                       "16 epochs, KD alpha 0.5 at temperature 1.2",
        "train": {"learning_rate": 7e-5, "epochs": 16},
        "kd": {"alpha": 0.5, "temperature": 1.2},
    },
    # The shipped recipes, the best measured per task family and sparsity (docs/results.md, "Sparse finetuning"):
    # upstream oBERT + transfer everywhere, one upstream run per level that every task starts from. At 80 % it is
    # the run without dropout: ahead on GAP, level with the run with dropout on GLUE and SQuAD (3 seeds each)
    **{
        f"minilm_{family}_sparse{level}": {
            "parent": parent,
            "description": f"the {level}% recipe of {family} to start from: {parent} (best measured)",
        }
        for family in ("glue", "squad_v1", "gap_mul", "gap_concat")
        for level, parent in ((80, f"minilm_{family}_from_upstream80_obs_nodropout"),
                              (90, f"minilm_{family}_from_upstream90_obs"))
    },
    # CPU smoke runs (tests): MiniLM's first 2 layers, 2 Wikipedia files, 40 steps
    "tiny_upstream": {
        "parent": "minilm_upstream_sparse80",
        "description": "minilm_upstream_sparse80 on MiniLM's first 2 layers, 2 Wikipedia files, 40 steps: CPU smoke",
        "model": {"num_layers": 2},
        "data": {"max_files": 2, "eval_documents": 8, "max_eval_samples": 64},
        "train": {"max_steps": 40, "global_batch_size": 16, "warmup_steps": 4, "eval_steps": 20, "save_steps": 20,
                  "logging_steps": 10, "eval_batch_size": 32, "dataloader_workers": 0},
        "gmp": {"frequency": 5},
    },
    "tiny_glue_from_upstream": {
        "parent": "tiny_glue",
        "description": "tiny_upstream finetuned on RTE with its masks fixed, distilled from tiny_glue: CPU smoke",
        "model": {"init_from": "tiny_upstream", **TRANSFER_MODEL},
        "finetune": {"glue_tasks": ["rte"], "runs_per_task": {}},
        "kd": {**TRANSFER_KD, "teacher": "tiny_glue"},
    },
}
