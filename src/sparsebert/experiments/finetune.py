"""Finetuning experiments: GLUE, SQuAD, GAP and CSV classification, from the package MiniLM or our runs.

``glue_from=<run>`` finetunes any finished pretraining run on every GLUE task present (a sparse run keeps
its masks fixed: see ``run.py``'s handling of ``*_from=`` names).
"""

MINILM_FINETUNE = {
    "model": {"init_from": "minilm"},
    "train": {
        "epochs": 3, "global_batch_size": 32, "learning_rate": 5e-5, "warmup_steps": 0, "weight_decay": 0.01,
        "lr_scheduler": "linear", "logging_steps": 50, "eval_batch_size": 256,
        "eval_at_start": False, "dataloader_workers": 2,
    },
    "finetune": {"max_seq_length": 128},
}

# Downstream pruning (docs/results.md, "Sparse finetuning"): the student starts from the dense finetuned run of the
# same task, which is also its teacher (distillation only: alpha 1.0). GMP prunes the 36 encoder Linear weights on a
# cubic ramp, ranked by magnitude over all of them together, until 60 % of training; the rest recovers at fixed
# masks, the learning rate rewound to its peak when pruning ends. The dense + KD runs are the same recipe without
# pruning. A long schedule and global ranking were what the search (space sparse_schedule) and the 16-epoch runs
# favoured; docs/results.md says which settings each measured row used.
SPARSE_KD = {"teacher": "", "alpha": 1.0, "temperature": 2.0, "student_from_teacher": True}
GMP = {"initial_sparsity": 0.0, "begin_step": 0, "end_fraction": 0.6, "frequency": 10, "rewind_lr": True,
       "global_ranking": True}
SPARSE80 = {"sparsity": 0.8, "init": "magnitude"}
SPARSE90 = {"sparsity": 0.9, "init": "magnitude"}
# The small GLUE tasks vary a lot from seed to seed: three runs each.
THREE_SEEDS = {"rte": 3, "mrpc": 3, "stsb": 3, "cola": 3, "wnli": 3}

EXPERIMENTS = {
    "minilm_glue": {
        **MINILM_FINETUNE,
        "description": "package MiniLM finetuned on every GLUE task present (3 runs for the small tasks)",
        "task": "glue",
        # on a GPU: one shape, compiled, CUDA graphs; faster end to end than a plain Trainer, and GLUE within seed
        # noise of the eager path (3 seeds; docs/performance.md)
        "finetune": {"max_seq_length": 128, "runs_per_task": THREE_SEEDS, "gpu_fast_path": True},
    },
    "minilm_glue_eager": {
        "parent": "minilm_glue",
        "description": "minilm_glue without the GPU fast path: eager, dynamic padding (the bench's comparison row)",
        "finetune": {"gpu_fast_path": False},
    },
    "minilm_glue_kd": {
        "parent": "minilm_glue",
        "description": "dense MiniLM distilled from minilm_glue, starting from it (the control for the sparse runs)",
        "train": {"epochs": 16, "learning_rate": 1e-4},
        # the sparse and distilled recipes keep the eager path their results were measured with
        "finetune": {"epochs_per_task": {"sst2": 1}, "gpu_fast_path": False},
        "kd": {**SPARSE_KD, "teacher": "minilm_glue"},
    },
    "minilm_glue_downstream80": {
        "parent": "minilm_glue_kd",
        "description": "minilm_glue pruned to 80% sparse encoder layers (global GMP, recovery, LR rewound), distilled from it",
        "sparsity": SPARSE80,
        "gmp": GMP,
    },
    "minilm_glue_downstream90": {
        "parent": "minilm_glue_downstream80",
        "description": "minilm_glue_downstream80 at 90% sparse encoder layers",
        "sparsity": SPARSE90,
    },
    "search_glue_downstream80": {
        "parent": "minilm_glue_downstream80",
        "description": "minilm_glue_downstream80 on CoLA, MRPC, RTE and STS-B, one seed: what --search tunes",
        "finetune": {"glue_tasks": ["cola", "mrpc", "rte", "stsb"], "runs_per_task": {}},
    },
    "minilm_glue_2to4": {
        "parent": "minilm_glue",
        "description": "MiniLM with 2:4 semi-structured encoder layers (magnitude, fixed) finetuned on GLUE",
        "finetune": {"gpu_fast_path": False},
        "sparsity": {"sparsity": 0.5, "pattern": "2:4", "init": "magnitude"},
    },
    "minilm_squad_v1": {
        **MINILM_FINETUNE,
        "description": "package MiniLM on SQuAD v1.1 (dev file split by article 80/20), seq 384, stride 128",
        "task": "squad_v1",
        "train": {**MINILM_FINETUNE["train"], "epochs": 2, "learning_rate": 1e-4},
        "finetune": {"max_seq_length": 384, "doc_stride": 128, "squad_eval_fraction": 0.2},
    },
    "minilm_squad_v2": {
        "parent": "minilm_squad_v1",
        "description": "package MiniLM on SQuAD v2.0 (the reconstructed dev file split by article 80/20): unanswerable "
                       "questions too, EM/F1 at the fixed and at the best null threshold",
        "task": "squad_v2",
        "finetune": {"squad_file": "squad/dev-v2.0.reconstructed.json"},
    },
    "minilm_squad_v1_kd": {
        "parent": "minilm_squad_v1",
        "description": "dense MiniLM on SQuAD v1.1 distilled from minilm_squad_v1, starting from it",
        "train": {"epochs": 4},
        "kd": {**SPARSE_KD, "teacher": "minilm_squad_v1"},
    },
    "minilm_squad_v1_downstream80": {
        "parent": "minilm_squad_v1_kd",
        "description": "minilm_squad_v1 pruned to 80% sparse (GMP, recovery, LR rewound), distilled from it",
        "sparsity": SPARSE80,
        "gmp": {**GMP, "end_fraction": 0.5, "global_ranking": False},  # the long global schedule never ran on SQuAD
    },
    "minilm_squad_v1_downstream90": {
        "parent": "minilm_squad_v1_downstream80",
        "description": "minilm_squad_v1_downstream80 at 90% sparse",
        "sparsity": SPARSE90,
    },
    "minilm_gap_mul": {
        **MINILM_FINETUNE,
        "description": "package MiniLM on GAP (train gap-development, eval gap-validation), mul head",
        "task": "gap",
        "train": {**MINILM_FINETUNE["train"], "epochs": 4, "learning_rate": 5e-5, "global_batch_size": 16},
        "finetune": {"max_seq_length": 256, "gap_head": "mul"},
    },
    "minilm_gap_concat": {"parent": "minilm_gap_mul", "description": "GAP with the concat head",
                          "finetune": {"gap_head": "concat"}},
    "minilm_gap_segment": {"parent": "minilm_gap_mul", "description": "GAP with the segment head",
                           "finetune": {"gap_head": "segment"}},
    **{
        name: experiment
        for head in ("mul", "concat")
        for name, experiment in {
            f"minilm_gap_{head}_kd": {
                "parent": f"minilm_gap_{head}",
                "description": f"dense MiniLM on GAP ({head} head) distilled from minilm_gap_{head}, starting from it",
                "train": {"epochs": 16, "learning_rate": 1e-4},
                "kd": {**SPARSE_KD, "teacher": f"minilm_gap_{head}"},
            },
            f"minilm_gap_{head}_downstream80": {
                "parent": f"minilm_gap_{head}_kd",
                "description": f"minilm_gap_{head} pruned to 80% sparse (GMP, recovery, LR rewound), distilled from it",
                "sparsity": SPARSE80,
                "gmp": GMP,
            },
            f"minilm_gap_{head}_downstream90": {
                "parent": f"minilm_gap_{head}_downstream80",
                "description": f"minilm_gap_{head}_downstream80 at 90% sparse",
                "sparsity": SPARSE90,
            },
        }.items()
    },
    # the downstream recipe ranked by the oBERT score (the upstream study's "downstream obs" rows): the Fisher of the
    # 10 gradients since the previous prune (gmp.frequency), each of one batch
    **{
        f"{dense}_downstream80_obs": {
            "parent": f"{dense}_downstream80",
            "description": f"{dense}_downstream80 ranked by the oBERT score (block Fisher, OBS weight update)",
            "gmp": {"score": "obs", "obs_num_grads": 10},
        }
        for dense in ("minilm_glue", "minilm_squad_v1", "minilm_gap_mul", "minilm_gap_concat")
    },
    **{
        f"{dense}_downstream90_obs": {
            "parent": f"{dense}_downstream80_obs",
            "description": f"{dense}_downstream80_obs at 90% sparse",
            "sparsity": SPARSE90,
        }
        for dense in ("minilm_glue", "minilm_squad_v1", "minilm_gap_mul", "minilm_gap_concat")
    },
    "glue_from": {
        **MINILM_FINETUNE,
        "description": "finetune a finished pretraining run on every GLUE task (default bert_small_wiki; "
                       "any run: python run.py glue_from=<run>)",
        "task": "glue",
        "model": {"init_from": "bert_small_wiki"},
        "finetune": {"max_seq_length": 128, "runs_per_task": THREE_SEEDS},
    },
    # tiny CPU variants (CI): the real MiniLM's first two layers (a third of its encoder's cost) on small slices,
    # one epoch
    "tiny_glue": {
        "parent": "minilm_glue",
        "description": "MiniLM's first 2 layers on 128 examples of RTE and STS-B, 1 epoch: CPU smoke run",
        "model": {"num_layers": 2},
        "train": {"epochs": 1, "global_batch_size": 16, "logging_steps": 4, "dataloader_workers": 0},
        # eager on a GPU too: the GPU tests built on it set what they compare
        "finetune": {"glue_tasks": ["rte", "stsb"], "max_train_samples": 128, "max_eval_samples": 64,
                     "runs_per_task": {"rte": 2, "stsb": 1}, "gpu_fast_path": False},
    },
    "tiny_search": {
        "parent": "tiny_glue",
        "description": "tiny_glue on 64 RTE examples (eval 32), seq 64, no model export: one CPU search trial",
        "finetune": {"glue_tasks": ["rte"], "runs_per_task": {}, "max_train_samples": 64, "max_eval_samples": 32,
                     "max_seq_length": 64, "save_model": False},
    },
    "tiny_glue_2to4": {
        "parent": "tiny_glue",
        "description": "tiny_glue with 2:4 semi-structured encoder layers: CPU smoke run",
        "sparsity": {"sparsity": 0.5, "pattern": "2:4", "init": "magnitude"},
        "finetune": {"glue_tasks": ["rte"], "runs_per_task": {}},
    },
    "tiny_glue_sparse80": {
        "parent": "tiny_glue",
        "description": "the minilm_glue_downstream80 recipe on RTE, 2 epochs, from the finished tiny_glue run: CPU smoke run",
        "train": {"epochs": 2},
        "finetune": {"glue_tasks": ["rte"], "runs_per_task": {}},
        "kd": {**SPARSE_KD, "teacher": "tiny_glue"},
        "sparsity": SPARSE80,
        "gmp": {**GMP, "frequency": 1},
    },
    "tiny_squad": {
        "parent": "minilm_squad_v1",
        "description": "MiniLM's first 2 layers on 96 SQuAD questions, seq 192, 1 epoch: CPU smoke run",
        "model": {"num_layers": 2},
        "train": {"epochs": 1, "global_batch_size": 16, "logging_steps": 4, "dataloader_workers": 0},
        "finetune": {"max_seq_length": 192, "doc_stride": 64, "max_train_samples": 96, "max_eval_samples": 48},
    },
    "tiny_gap": {
        "parent": "minilm_gap_mul",
        "description": "MiniLM's first 2 layers on 96 GAP rows, 1 epoch: CPU smoke run",
        "model": {"num_layers": 2},
        "train": {"epochs": 1, "logging_steps": 4, "dataloader_workers": 0},
        "finetune": {"max_seq_length": 128, "max_train_samples": 96, "max_eval_samples": 48},
    },
    "tiny_csv": {
        **MINILM_FINETUNE,
        "description": "CSV/TSV classification example: SST-2 dev as a labelled TSV, folded at 32 tokens, 1 epoch, "
                       "MiniLM's first 2 layers",
        "task": "csv",
        "model": {"init_from": "minilm", "num_layers": 2},
        "csv": {"path": "glue/SST-2/dev.tsv", "text_column": "sentence", "label_column": "label",
                "val_fraction": 0.15, "test_fraction": 0.15},
        "train": {**MINILM_FINETUNE["train"], "epochs": 1, "global_batch_size": 16, "logging_steps": 4,
                  "dataloader_workers": 0},
        "finetune": {"max_seq_length": 32, "max_train_samples": 192},
    },
    "tiny_gap_kd": {
        "parent": "tiny_gap",
        "description": "tiny_gap distilled from the finished tiny_gap run (its teacher): CPU smoke run",
        "kd": {"teacher": "tiny_gap", "alpha": 0.5, "temperature": 2.0},
    },
    "tiny_squad_kd": {
        "parent": "tiny_squad",
        "description": "tiny_squad distilled from the finished tiny_squad run (its teacher): CPU smoke run",
        "kd": {"teacher": "tiny_squad", "alpha": 0.5, "temperature": 2.0},
    },
}
