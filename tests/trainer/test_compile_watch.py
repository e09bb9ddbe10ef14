"""CompileWatch: graphs compiled after warm-up are counted (and the private Dynamo counter it reads still exists)."""

from __future__ import annotations

from types import SimpleNamespace

import torch

from sparsebert.trainer.compile_watch import CompileWatch, compiled_graphs


def _double(x: torch.Tensor) -> torch.Tensor:
    return x * 2 + 1


def test_the_dynamo_graph_counter_counts_a_new_shape():
    torch._dynamo.reset()
    compiled = torch.compile(_double, backend="eager", dynamic=False)
    before = compiled_graphs()
    compiled(torch.ones(3))
    compiled(torch.ones(3))  # same shape: no new graph
    assert compiled_graphs() == before + 1
    compiled(torch.ones(5))  # the short last batch of an epoch: a new graph
    assert compiled_graphs() == before + 2


def test_compile_watch_counts_only_graphs_after_the_first_evaluation_in_training():
    torch._dynamo.reset()
    compiled = torch.compile(_double, backend="eager", dynamic=False)
    watch = CompileWatch()
    compiled(torch.ones(2))
    watch.on_evaluate(None, SimpleNamespace(global_step=0), None)  # evaluation before training: still warm-up
    compiled(torch.ones(3))
    watch.on_evaluate(None, SimpleNamespace(global_step=50), None)  # warm-up ends here
    watch.on_log(None, SimpleNamespace(global_step=60), None, logs={"loss": 1.0})
    assert watch.recompiles == 0
    compiled(torch.ones(4))
    watch.on_log(None, SimpleNamespace(global_step=70), None, logs={"loss": 1.0})
    watch.on_train_end(None, SimpleNamespace(global_step=80), None)
    assert watch.recompiles == 1
