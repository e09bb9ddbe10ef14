"""Fixtures of the distributed tests: the tiny models of tests/sparsity_helpers.py."""

from sparsity_helpers import mlp, one_thread, tiny_bert  # noqa: F401
