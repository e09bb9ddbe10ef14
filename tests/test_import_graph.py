"""No import cycles between sparsebert's packages: every import statement, lazy ones inside functions included, read
from the source (an AST walk, nothing imported), folded to packages (``sparsebert.data.glue`` -> ``data``)."""

from __future__ import annotations

import ast
from pathlib import Path

SRC = Path(__file__).resolve().parents[1] / "src"


def unit(module: str) -> str:
    """The package a module belongs to (``sparsebert.data.glue`` -> ``data``; a top-level module is its own)."""
    parts = module.split(".")
    return parts[1] if len(parts) > 1 else parts[0]


def source_of(module: str) -> Path | None:
    """The file of one of our modules (a package: its ``__init__.py``), or None if there is none."""
    base = SRC.joinpath(*module.split("."))
    for path in (base.with_suffix(".py"), base / "__init__.py"):
        if path.is_file():
            return path
    return None


def imported_modules(path: Path, module: str) -> set[str]:
    """Our modules that ``path`` imports; ``from package import name`` counts ``package.name`` too where that is
    a module."""
    package = module if path.name == "__init__.py" else module.rpartition(".")[0]
    found = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            found |= {alias.name for alias in node.names}
        elif isinstance(node, ast.ImportFrom):
            if node.level:  # relative: from the package, up level - 1
                base = package.split(".")[: len(package.split(".")) - node.level + 1]
                source = ".".join([*base, node.module] if node.module else base)
            elif node.module:
                source = node.module
            else:
                continue
            found.add(source)
            found |= {f"{source}.{alias.name}" for alias in node.names if source_of(f"{source}.{alias.name}")}
    return {m for m in found if m == "sparsebert" or m.startswith("sparsebert.")}


def module_name(path: Path) -> str:
    return ".".join(path.relative_to(SRC).with_suffix("").parts).removesuffix(".__init__")


def package_graph() -> dict[str, set[str]]:
    graph: dict[str, set[str]] = {}
    for path in sorted((SRC / "sparsebert").rglob("*.py")):
        module = module_name(path)
        here = unit(module)
        graph.setdefault(here, set())
        graph[here] |= {unit(m) for m in imported_modules(path, module) if m != "sparsebert"} - {here}
    return graph


def find_cycle(graph: dict[str, set[str]]) -> list[str] | None:
    """A cycle of ``graph`` as its nodes in order, or None (depth-first search with colours)."""
    state: dict[str, int] = {}  # 1: on the current path, 2: done
    path: list[str] = []

    def visit(node: str) -> list[str] | None:
        state[node] = 1
        path.append(node)
        for nxt in sorted(graph.get(node, ())):
            if state.get(nxt) == 1:
                return path[path.index(nxt):] + [nxt]
            if nxt not in state and (cycle := visit(nxt)):
                return cycle
        path.pop()
        state[node] = 2
        return None

    for node in sorted(graph):
        if node not in state and (cycle := visit(node)):
            return cycle
    return None


def test_find_cycle_finds_one_and_only_one():
    assert find_cycle({"a": {"b"}, "b": {"c"}, "c": {"a"}}) == ["a", "b", "c", "a"]
    assert find_cycle({"a": {"b", "c"}, "b": {"c"}, "c": set()}) is None


def test_the_packages_import_each_other_without_cycles():
    graph = package_graph()
    assert {"config", "data", "distributed", "export", "models", "sparsity", "trainer", "results"} <= set(graph)
    assert find_cycle(graph) is None, " -> ".join(find_cycle(graph))


def sparsity_modules() -> list[Path]:
    return sorted((SRC / "sparsebert" / "sparsity").rglob("*.py"))


def test_the_sparsity_core_imports_no_other_package_of_ours_but_its_helpers():
    # the mask core only: the all-reduce (distributed/) and the 2:4 inference export (export/) build on it, not it
    # on them; it may use the I/O helpers, its one error type and torch's private kernels (upstream/torch_ops.py,
    # torch only), nothing else
    assert package_graph()["sparsity"] <= {"io", "errors", "upstream"}
    for path in sparsity_modules():
        upstream = {m for m in imported_modules(path, module_name(path)) if unit(m) == "upstream"}
        assert upstream <= {"sparsebert.upstream", "sparsebert.upstream.torch_ops"}, module_name(path)


def third_party_imports(path: Path) -> set[str]:
    found = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            found |= {alias.name.split(".")[0] for alias in node.names}
        elif isinstance(node, ast.ImportFrom) and node.module and not node.level:
            found.add(node.module.split(".")[0])
    return found


def test_the_sparsity_core_is_plain_pytorch():
    # no transformers import in sparsity/, nor in any module of ours that importing it loads (the modules it
    # imports, theirs in turn, and every package above each of them: importing a module runs its packages first)
    seen: set[str] = set()
    todo = [module_name(path) for path in sparsity_modules()]
    while todo:
        module = todo.pop()
        if module in seen or (path := source_of(module)) is None:
            continue
        seen.add(module)
        parts = module.split(".")
        todo += [".".join(parts[:cut]) for cut in range(1, len(parts))]
        todo += imported_modules(path, module)
        assert "transformers" not in third_party_imports(path), f"{module}, loaded by sparsebert.sparsity"
    assert "sparsebert.upstream.torch_ops" in seen  # the walk does reach past sparsity/
