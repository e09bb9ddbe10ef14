"""MLM pretraining experiments. A derived experiment states only what differs from its parent."""

EXPERIMENTS = {
    "bert_base": {
        "description": "BERT-base (12x768) MLM on Wikipedia, seq 128, batch 256, AdamW 1e-4, 10k warmup, 1M steps",
        "task": "mlm",
        # a bf16 residual stream and hash dropout: faster on a GPU, the same eval loss within seed noise in an
        # 8 000-step pair at two seeds (docs/performance.md); nothing changes in fp32 runs, hash dropout needs
        # compile, and fp16 runs keep an fp32 residual stream. fused_qkv: Q, K and V in one matrix product, the
        # same arithmetic in another order (docs/performance.md)
        "model": {"size": "base", "tokenizer": "minilm", "half_precision_residual": True, "fast_dropout": True,
                  "fused_qkv": True},
        # static_mask_count: a fixed number of MLM decoder rows per batch, so the compiled step is one CUDA graph
        "data": {"corpus": "wikipedia-enwiki-2015-wikiextractor", "format": "wikiextractor",
                 "max_seq_length": 128, "eval_documents": 130, "static_mask_count": True},
        "train": {
            "max_steps": 1_000_000,
            "global_batch_size": 256,
            "learning_rate": 1e-4,
            "warmup_steps": 10_000,
            "lr_scheduler": "linear",
            "weight_decay": 0.01,
            "eval_steps": 5_000,
            "save_steps": 5_000,
            "logging_steps": 100,
            # packed 128-token blocks: dropping each epoch's short last batch loses < 1 batch of text and keeps
            # every training batch one shape (a short one would recompile the compiled step once per run)
            "drop_last_batch": True,
            # the fast GPU path that leaves the arithmetic alone (docs/performance.md): compiled, replayed as CUDA
            # graphs
            "torch_compile": True,
            "torch_compile_mode": "reduce-overhead",
        },
    },
    "bert_100k": {
        "parent": "bert_base",
        "description": "BERT-base MLM, 100k steps: the run a GPU user starts from",
        "train": {"max_steps": 100_000},
    },
    "bert_small_wiki": {
        "parent": "bert_base",
        "description": "BERT-medium (8x512) MLM on the Wikipedia mirror, 8k steps: about 4 minutes on one H200",
        "model": {"size": "medium"},
        "train": {"max_steps": 8_000, "learning_rate": 5e-4, "warmup_steps": 800,
                  "eval_steps": 1_000, "save_steps": 2_000, "dataloader_workers": 4},
    },
    "bert_tiny_quick": {
        "parent": "bert_base",
        "description": "tiny BERT (2x128) on 2 Wikipedia files: a CPU smoke run, under 3 minutes on 2 cores",
        "model": {"size": "tiny"},
        "data": {"max_files": 2, "eval_documents": 8, "max_eval_samples": 256, "static_mask_count": False},
        "train": {"max_steps": 150, "global_batch_size": 32, "learning_rate": 1e-3, "warmup_steps": 15,
                  "eval_steps": 50, "save_steps": 50, "logging_steps": 10, "eval_batch_size": 64,
                  "dataloader_workers": 0, "torch_compile": False, "torch_compile_mode": "default"},
    },
}
