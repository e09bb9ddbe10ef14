"""Every private torch name sparsebert touches (upstream/torch_ops.py) still exists and, where that is cheap to
check on CPU, still does what sparsebert relies on: an upgrade that renames or changes one fails here, by name."""

from __future__ import annotations

import importlib

import pytest
import torch

from sparsebert.upstream import torch_ops
from sparsebert.upstream.torch_ops import PRIVATE_NAMES

SEE = "see sparsebert/upstream/torch_ops.py"


def resolve(path: str):
    """The owner of the last part of a dotted ``path`` (the longest importable prefix, then attributes), and that
    part."""
    module_path, _, attribute = path.rpartition(".")
    parts = module_path.split(".")
    for cut in range(len(parts), 0, -1):
        try:
            owner = importlib.import_module(".".join(parts[:cut]))
        except ImportError:
            continue
        for part in parts[cut:]:
            owner = getattr(owner, part)
        return owner, attribute
    raise ImportError(path)


@pytest.mark.parametrize("path", PRIVATE_NAMES)
def test_the_torch_names_exist(path):
    owner, attribute = resolve(path)
    if attribute == "_orig_mod":  # an instance attribute of a compiled module
        owner = torch.compile(torch.nn.Linear(2, 2), backend="eager")
    if attribute == "_iterator":  # an instance attribute of a loader
        owner = torch.utils.data.DataLoader([1])
    assert hasattr(owner, attribute), f"{path} is gone: {SEE}"


def test_the_aliases_are_torchs_own_functions():
    # module-level aliases, not wrappers: the hot paths (masks after every step, the flat all-reduce's copies)
    # pay nothing for going through torch_ops
    for alias in ("foreach_norm", "foreach_mul_", "foreach_addcmul_", "foreach_copy_"):
        assert getattr(torch_ops, alias) is getattr(torch, "_" + alias), f"torch._{alias}: {SEE}"


def test_cslt_sparse_mm_is_looked_up_when_called(monkeypatch):
    calls = []
    monkeypatch.setattr(torch, "_cslt_sparse_mm", lambda *args, **kwargs: calls.append((args, kwargs)) or "out")
    assert torch_ops.cslt_sparse_mm(1, 2, alpha=3) == "out" and calls == [((1, 2), {"alpha": 3})]


def test_the_foreach_kernels_do_what_we_rely_on():
    a, b = torch.tensor([3.0, 4.0]), torch.tensor([[1.0, 2.0], [2.0, 4.0]])
    norms = torch_ops.foreach_norm([a, b], 2.0)
    assert torch.allclose(torch.stack(norms), torch.tensor([5.0, 5.0]))

    weights = [a.clone(), b.clone()]
    torch_ops.foreach_mul_(weights, [torch.tensor([True, False]), torch.tensor([[False, True], [True, False]])])
    assert weights[0].tolist() == [3.0, 0.0] and weights[1].tolist() == [[0.0, 2.0], [2.0, 0.0]]
    assert weights[0].dtype == torch.float32  # a bool mask multiplies a float weight in place

    scores = [torch.zeros(2)]
    torch_ops.foreach_addcmul_(scores, [torch.tensor([1.0, -2.0])], [torch.tensor([3.0, 1.0])], value=-1.0)
    assert scores[0].tolist() == [-3.0, 2.0]  # S -= grad * w

    target = [torch.zeros(2, dtype=torch.float32)]
    torch_ops.foreach_copy_(target, [torch.tensor([1.5, -2.0], dtype=torch.bfloat16)])  # a casting copy
    assert target[0].tolist() == [1.5, -2.0]


def test_the_semi_structured_limits_are_tables_per_dtype():
    from torch.sparse import SparseSemiStructuredTensorCUSPARSELT, SparseSemiStructuredTensorCUTLASS

    for cls in (SparseSemiStructuredTensorCUSPARSELT, SparseSemiStructuredTensorCUTLASS):
        limits = torch_ops.semi_structured_limits(cls)[torch.bfloat16]
        for field in ("sparse_min_rows", "sparse_min_cols", "dense_min_rows"):
            assert isinstance(getattr(limits, field), int), f"{cls.__name__} limits lost {field}: {SEE}"


def test_the_process_wide_settings_round_trip(monkeypatch):
    import torch._dynamo
    import torch._inductor.config as inductor

    monkeypatch.delenv("TORCHINDUCTOR_COORDINATE_DESCENT_TUNING", raising=False)
    # the configs' own patch() restores both afterwards (monkeypatch would delete what it did not find in the
    # module's __dict__, which hides a config entry)
    with torch._dynamo.config.patch(optimize_ddp=True), inductor.patch(coordinate_descent_tuning=False):
        for on in (False, True):
            torch_ops.set_dynamo_ddp_optimizer(on)
            assert torch._dynamo.config.optimize_ddp is on
            torch_ops.set_kernel_tuning(on)
            assert inductor.coordinate_descent_tuning is on


def test_the_graph_count_and_the_module_under_compile():
    linear = torch.nn.Linear(2, 2)
    compiled = torch.compile(linear, backend="eager")
    before = torch_ops.compiled_graphs()
    compiled(torch.ones(1, 2))
    assert torch_ops.compiled_graphs() == before + 1, f"Dynamo's unique_graphs counter: {SEE}"
    assert compiled._orig_mod is linear
    assert torch_ops.find_ddp(compiled) is None  # no DDP under it: the walk down _orig_mod ends


def test_stop_loader_workers_stops_a_persistent_loaders_workers_at_once():
    loader = torch.utils.data.DataLoader(list(range(8)), batch_size=4, num_workers=2, persistent_workers=True)
    assert [int(batch.sum()) for batch in loader] == [6, 22]
    workers = list(loader._iterator._workers)
    assert len(workers) == 2 and all(w.is_alive() for w in workers)
    torch_ops.stop_loader_workers(loader)
    assert not any(w.is_alive() for w in workers) and loader._iterator is None
    torch_ops.stop_loader_workers(loader)  # nothing left to stop
    torch_ops.stop_loader_workers(torch.utils.data.DataLoader([1]))  # no workers at all
