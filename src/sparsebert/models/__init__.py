"""Models: BERT from named sizes or checkpoints, its fast paths (MLM head at masked rows, hashed dropout), task
heads, and what `from_pretrained` gets from the experiment."""
