"""sparsebert: sparse BERT pretraining and finetuning on Hugging Face transformers."""

__version__ = "0.1.0"
