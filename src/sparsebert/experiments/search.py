"""Hyperparameter search spaces for ``python run.py --search EXPERIMENT --space SPACE --trials N``.

Each space maps experiment keys (as ``--set`` names them) to a spec: ``float`` (low, high, log), ``int`` (low,
high, step) or ``categorical`` (choices); see ``sparsebert/search.py``.
"""

SEARCH_SPACES = {
    "sparse_finetune": {
        "description": "the sparse finetuning recipe (minilm_glue_downstream80, search_glue_downstream80): learning rate, "
                       "epochs, when pruning ends, score, global or per-layer ranking, LR rewinding, KD temperature",
        "params": {
            "train.learning_rate": {"type": "float", "low": 2e-5, "high": 2e-4, "log": True},
            "train.epochs": {"type": "categorical", "choices": [4, 6, 8, 12]},
            "gmp.end_fraction": {"type": "float", "low": 0.2, "high": 0.8},
            "gmp.score": {"type": "categorical", "choices": ["magnitude", "movement", "obs"]},
            "gmp.global_ranking": {"type": "categorical", "choices": [False, True]},
            "gmp.rewind_lr": {"type": "categorical", "choices": [False, True]},
            "kd.temperature": {"type": "float", "low": 1.0, "high": 4.0},
        },
    },
    "sparse_schedule": {
        "description": "how long and how fast to prune (search_glue_downstream80 on MRPC and RTE): epochs, when pruning "
                       "ends, learning rate, global or per-layer ranking",
        "params": {
            "train.epochs": {"type": "categorical", "choices": [6, 12, 20]},
            "gmp.end_fraction": {"type": "float", "low": 0.3, "high": 0.7},
            "train.learning_rate": {"type": "float", "low": 3e-5, "high": 2e-4, "log": True},
            "gmp.global_ranking": {"type": "categorical", "choices": [False, True]},
        },
    },
    "transfer": {
        "description": "fixed-mask transfer from an upstream-pruned model (minilm_glue_sparse80 and the other "
                       "*_from_upstream* recipes): learning rate, epochs, KD temperature and weight",
        "params": {
            "train.learning_rate": {"type": "float", "low": 3e-5, "high": 3e-4, "log": True},
            "train.epochs": {"type": "categorical", "choices": [4, 8, 12, 16]},
            "kd.temperature": {"type": "float", "low": 1.0, "high": 4.0},
            "kd.alpha": {"type": "categorical", "choices": [0.5, 0.8, 1.0]},
        },
    },
    "glue_lr": {
        "description": "dense GLUE finetuning (minilm_glue and relatives): learning rate and epochs",
        "params": {
            "train.learning_rate": {"type": "float", "low": 1e-5, "high": 2e-4, "log": True},
            "train.epochs": {"type": "categorical", "choices": [2, 3, 5]},
        },
    },
    "tiny": {
        "description": "CPU test space for tiny_search: the learning rate alone",
        "params": {"train.learning_rate": {"type": "float", "low": 1e-5, "high": 1e-4, "log": True}},
    },
}
