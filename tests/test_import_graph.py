"""No import loop anywhere in ``src/vitmix``: the module import graph, read from the source, is acyclic.

Every ``.py`` file is parsed and every ``import`` / ``from ... import`` counts, including the lazy ones
inside functions (a lazy import hides a loop from Python but not from a reader) and relative imports
resolved against the file's package; only ``if TYPE_CHECKING:`` blocks are skipped (they never run).
``from pkg import name`` is an edge to the submodule ``pkg.name`` when that is a module, else to ``pkg``.
The implicit import of a module's parent packages is not an edge (every submodule would loop with its
package's ``__init__``).
"""
import ast
from pathlib import Path
from typing import Dict, Iterator, List, Optional, Set

import pytest

SRC = Path(__file__).resolve().parents[1] / "src"


def module_name(path: Path, root: Path) -> str:
    parts = list(path.relative_to(root).with_suffix("").parts)
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def package_of(path: Path, root: Path) -> str:
    name = module_name(path, root)
    return name if path.name == "__init__.py" else name.rpartition(".")[0]


def _type_checking_only(node: ast.AST) -> bool:
    test = getattr(node, "test", None)
    return isinstance(node, ast.If) and isinstance(test, (ast.Name, ast.Attribute)) and (
        getattr(test, "id", None) == "TYPE_CHECKING" or getattr(test, "attr", None) == "TYPE_CHECKING")


def _import_nodes(node: ast.AST) -> Iterator[ast.AST]:
    for child in ast.iter_child_nodes(node):
        if _type_checking_only(child):
            continue
        if isinstance(child, (ast.Import, ast.ImportFrom)):
            yield child
        yield from _import_nodes(child)


def _absolute(node: ast.ImportFrom, package: str) -> str:
    if not node.level:
        return node.module or ""
    base = package.split(".")
    base = base[:len(base) - (node.level - 1)]
    return ".".join(base + ([node.module] if node.module else []))


def imports_of(path: Path, root: Path, modules: Set[str]) -> Set[str]:
    """The vitmix modules that ``path`` imports (anywhere in the file)."""
    found: Set[str] = set()
    for node in _import_nodes(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            targets = [alias.name for alias in node.names]
        else:
            base = _absolute(node, package_of(path, root))
            targets = [f"{base}.{a.name}" if f"{base}.{a.name}" in modules else base for a in node.names]
        found.update(t for t in targets if t in modules)
    return found


def import_graph(root: Path = SRC) -> Dict[str, Set[str]]:
    files = {module_name(p, root): p for p in sorted((root / "vitmix").rglob("*.py"))}
    return {name: imports_of(path, root, set(files)) - {name} for name, path in files.items()}


def find_cycle(graph: Dict[str, Set[str]]) -> Optional[List[str]]:
    """One import loop as ``[a, b, ..., a]``, or ``None`` (iterative depth-first search)."""
    state: Dict[str, int] = {}          # 1: on the current path, 2: done
    for start in sorted(graph):
        if state.get(start):
            continue
        path, stack = [start], [iter(sorted(graph[start]))]
        state[start] = 1
        while stack:
            nxt = next(stack[-1], None)
            if nxt is None:
                state[path.pop()] = 2
                stack.pop()
            elif state.get(nxt) == 1:
                return path[path.index(nxt):] + [nxt]
            elif not state.get(nxt):
                state[nxt] = 1
                path.append(nxt)
                stack.append(iter(sorted(graph[nxt])))
    return None


def test_src_has_no_import_loop():
    graph = import_graph()
    assert len(graph) > 50 and "vitmix.ops.diagonal.triton" in graph      # the walk saw the tree
    cycle = find_cycle(graph)
    assert cycle is None, "import loop: " + " -> ".join(cycle)


def test_the_check_sees_lazy_and_relative_imports(tmp_path):
    """The old ``ops/_triton_diagonal.py`` <-> ``ops/sparse_diagonal.py`` loop (one side a lazy import inside
    a function) is found, so the test above can fail."""
    ops = tmp_path / "vitmix" / "ops"
    ops.mkdir(parents=True)
    (tmp_path / "vitmix" / "__init__.py").write_text("")
    (ops / "__init__.py").write_text("from .sparse_diagonal import run\n")
    (ops / "sparse_diagonal.py").write_text("def run():\n    from . import _triton_diagonal\n")
    (ops / "_triton_diagonal.py").write_text("from .sparse_diagonal import run\n")
    cycle = find_cycle(import_graph(tmp_path))
    assert cycle[0] == cycle[-1] and sorted(cycle[:-1]) == ["vitmix.ops._triton_diagonal", "vitmix.ops.sparse_diagonal"]


@pytest.mark.parametrize("old, new", [("kernels", "kernel"), ("sparse_diagonal", "diagonal")])
def test_nothing_in_src_imports_a_deprecated_alias(old, new):
    users = [name for name, deps in import_graph().items() if f"vitmix.ops.{old}" in deps]
    assert users == [], f"{users} import vitmix.ops.{old}, a deprecated alias: import vitmix.ops.{new} instead"
