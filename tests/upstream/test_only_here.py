"""Private names of torch, Transformers, tokenizers, datasets and optuna appear in src/sparsebert/upstream/ only.

Two checks over the source text of every other module (comments and docstrings included: they name what the
code touches): no name that upstream/ lists, nor any ``torch._...``; and, read from the syntax tree, no access
to an underscore attribute of another object (``x._name``, ``getattr(x, "_name")``, ``import a._b``) unless
sparsebert itself defines that name. A module that needs a new private name gets it from upstream/, where the
tests beside this one pin it.
"""

from __future__ import annotations

import ast
import re
from pathlib import Path

from sparsebert.upstream import libraries, torch_ops, transformers_trainer

PACKAGE = Path(__file__).resolve().parents[2] / "src" / "sparsebert"

# underscore names that are public API: namedtuple's methods, and os._exit (documented; a child that must not
# run its parent's atexit handlers)
PUBLIC_UNDERSCORE = {"_replace", "_asdict", "_fields", "_make", "_field_defaults", "_exit"}


def listed_names() -> tuple[set[str], set[str]]:
    """(names matched on any receiver, names matched on any receiver but self / cls): the Trainer's own private
    names are in the first set, since SparseBertTrainer's ``self`` is a Trainer."""
    on_trainer = {name for names in transformers_trainer.PRIVATE_NAMES.values() for name in names}
    others = {name for names in libraries.PRIVATE_NAMES.values() for name in names}
    # torch's private modules (torch._dynamo.config.optimize_ddp) are caught as ``torch._``; of the rest, the
    # private attributes (OptimizedModule._orig_mod)
    torch_attributes = {path.rpartition(".")[2] for path in torch_ops.PRIVATE_NAMES}
    others |= {name for name in torch_attributes if name.startswith("_")}
    return on_trainer, others - on_trainer


def listed_name_hits(text: str) -> set[str]:
    """The places in ``text`` that name a private upstream name listed in upstream/, or any ``torch._...``."""
    on_trainer, others = listed_names()
    hits = [m.group(0) for m in re.finditer(r"\btorch\._\w+", text)]
    for name in sorted(on_trainer | others):
        for m in re.finditer(rf"(\b\w+)?\.{re.escape(name)}\b|[\"']{re.escape(name)}[\"']", text):
            if name in others and m.group(1) in ("self", "cls"):  # our own attribute of that name
                continue
            hits.append(m.group(0))
    return set(hits)


def our_modules() -> list[Path]:
    return [p for p in sorted(PACKAGE.rglob("*.py")) if "upstream" not in p.relative_to(PACKAGE).parts[:1]]


def defined_private_names(paths: list[Path]) -> set[str]:
    """Underscore names sparsebert defines: functions, classes, assigned names, and ``self._x`` / ``cls._x``."""
    names = set()
    for path in paths:
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
                names.add(node.name)
            elif isinstance(node, ast.Name) and isinstance(node.ctx, ast.Store):
                names.add(node.id)
            elif isinstance(node, ast.Attribute) and isinstance(node.ctx, ast.Store) \
                    and isinstance(node.value, ast.Name) and node.value.id in ("self", "cls"):
                names.add(node.attr)
    return {n for n in names if n.startswith("_")}


def is_private(name: str) -> bool:
    return name.startswith("_") and not name.startswith("__") and name not in PUBLIC_UNDERSCORE


def foreign_private_accesses(source: str, ours: set[str]) -> list[str]:
    """Accesses in ``source`` to underscore names of other objects that sparsebert does not define itself."""
    found = []
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Attribute) and is_private(node.attr) and node.attr not in ours:
            if not (isinstance(node.value, ast.Name) and node.value.id in ("self", "cls")):
                found.append(ast.unparse(node))
        elif isinstance(node, ast.Call) and isinstance(node.func, ast.Name) \
                and node.func.id in ("getattr", "setattr", "hasattr", "delattr") and len(node.args) > 1 \
                and isinstance(node.args[1], ast.Constant) and isinstance(node.args[1].value, str) \
                and is_private(node.args[1].value) and node.args[1].value not in ours:
            found.append(ast.unparse(node))
        elif isinstance(node, (ast.Import, ast.ImportFrom)):
            modules = [alias.name for alias in node.names]
            if isinstance(node, ast.ImportFrom):
                modules = [node.module or ""] if node.level == 0 else []
            if any(is_private(part) for module in modules for part in module.split(".")[1:]):
                found.append(ast.unparse(node))
    return found


def test_the_checks_find_what_they_look_for():
    text = ("norms = torch._foreach_norm(g, 2.0)\nfrom torch._dynamo.utils import counters\n"
            "t = BertTokenizerFast(tokenizer_object=trainer._tokenizer)\nd = dataset._indices\n"
            "m = getattr(model, '_orig_mod', None)\nself._created_lr_scheduler = True\n")
    assert listed_name_hits(text) == {"torch._foreach_norm", "torch._dynamo", "'_orig_mod'", "dataset._indices",
                                      "trainer._tokenizer", "self._created_lr_scheduler"}
    assert listed_name_hits("tokenizer = self._tokenizer(source)\nnt._replace(a=1)\n") == set()
    found = foreign_private_accesses(text + "x = load_result._replace(a=1)\nos._exit(1)\n", {"_tokenizer"})
    assert set(found) == {"torch._foreach_norm", "dataset._indices", "getattr(model, '_orig_mod', None)",
                          "from torch._dynamo.utils import counters"}


def test_no_listed_private_name_outside_upstream():
    found = {str(p.relative_to(PACKAGE)): sorted(hits) for p in our_modules()
             if (hits := listed_name_hits(p.read_text()))}
    assert not found, f"private upstream names outside sparsebert/upstream/ (use or add one there): {found}"


def test_no_other_private_upstream_attribute_outside_upstream():
    modules = our_modules()
    ours = defined_private_names(modules)
    found = {str(p.relative_to(PACKAGE)): hits for p in modules
             if (hits := foreign_private_accesses(p.read_text(), ours))}
    assert not found, f"private names of other libraries outside sparsebert/upstream/: {found}"


def test_every_listed_name_is_touched_in_upstream():
    # the lists say what upstream/ touches, no more: a name no longer used there leaves its list
    touched = set()
    for path in (PACKAGE / "upstream").glob("*.py"):
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.Attribute):
                touched.add(node.attr)
            elif isinstance(node, ast.Call) and isinstance(node.func, ast.Name) and node.func.id == "getattr":
                touched.add(node.args[1].value)
            elif isinstance(node, ast.FunctionDef):  # an overridden Trainer method
                touched.add(node.name)
    on_trainer, others = listed_names()
    assert on_trainer | others <= touched, (on_trainer | others) - touched
