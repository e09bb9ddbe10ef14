"""Hyperparameter search spaces for ``python run.py --search EXPERIMENT --space SPACE --trials N``.

Each space maps experiment keys (as ``--set`` names them) to a spec: ``float`` (low, high, log), ``int`` (low,
high, step) or ``categorical`` (choices); see ``sparsebert/search.py``.
"""

SEARCH_SPACES = {
    "sparse_glue": {
        "description": "GMP-pruned, distilled GLUE finetuning (minilm_glue_sparse80): learning rate, epochs, when "
                       "pruning ends, distillation weight and temperature",
        "params": {
            "train.learning_rate": {"type": "float", "low": 2e-5, "high": 2e-4, "log": True},
            "train.epochs": {"type": "categorical", "choices": [3, 6, 10]},
            "gmp.end_fraction": {"type": "float", "low": 0.3, "high": 0.8},
            "kd.alpha": {"type": "float", "low": 0.5, "high": 1.0},
            "kd.temperature": {"type": "float", "low": 1.0, "high": 4.0},
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
