"""No import loop anywhere in ``src/vitmix``: the module import graph, read from the source, is acyclic,
and every package imports only the packages below its own row in the layer drawing of
``docs/architecture.md`` (a loop between packages, such as train/ -> dense/ -> train/, can pass the
module check: each module of it may import the other package's modules without importing back).

Every ``.py`` file is parsed and every ``import`` / ``from ... import`` counts, including the lazy ones
inside functions (a lazy import hides a loop from Python but not from a reader) and relative imports
resolved against the file's package; only ``if TYPE_CHECKING:`` blocks are skipped (they never run).
``from pkg import name`` is an edge to the submodule ``pkg.name`` when that is a module, else to ``pkg``.
The implicit import of a module's parent packages is not an edge (every submodule would loop with its
package's ``__init__``).
"""
import ast
import re
from pathlib import Path
from typing import Dict, Iterator, List, Optional, Set

import pytest

SRC = Path(__file__).resolve().parents[1] / "src"
ARCHITECTURE = SRC.parent / "docs" / "architecture.md"


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


# --- the package order of docs/architecture.md ---------------------------------------------------------

_LAYER_NAME = re.compile(r"[A-Za-z_]\w*(/|\.py),?")
#: Modules used by every layer (docs/architecture.md says so); they import only each other.
BASE = {"vitmix", "_util", "_lazy"}
#: ``python -m vitmix`` runs cli.py's main: it sits on cli.py's row.
SAME_ROW = {"__main__": "cli"}


def drawn_layers(text: str) -> Dict[str, int]:
    """The row of every package and top-level module in the first drawing of ``text``, 0 at the bottom.
    A row starts at column 0 with its names (``train/  bench/``, ``cli.py, listing.py``); the words after
    the names, and indented lines, describe it."""
    block = text.split("```", 2)[1].splitlines()[1:]
    rows = []
    for line in block:
        if not line or line[0].isspace():
            continue
        names = []
        for word in line.split():
            if not _LAYER_NAME.fullmatch(word):
                break
            names.append(re.sub(r"(/|\.py),?$", "", word))
        rows.append(names)
    return {name: level for level, names in enumerate(reversed(rows)) for name in names}


def layer_unit(module: str) -> str:
    """What the drawing names a module by: ``vitmix.ops.kernel.c`` -> ``ops``, ``vitmix.cli`` -> ``cli``;
    the package ``vitmix`` itself stays ``vitmix``."""
    parts = module.split(".")
    name = parts[1] if len(parts) > 1 else parts[0]
    return SAME_ROW.get(name, name)


def upward_imports(graph: Dict[str, Set[str]], layers: Dict[str, int]) -> List[str]:
    """Every import of a package or top-level module from a row not below the importer's (peers included;
    the :data:`BASE` modules import only each other), as ``"importer -> imported"``; a package missing
    from the drawing is reported as such."""
    units = {layer_unit(m) for m in graph} - BASE
    found = [f"{u} is not drawn in docs/architecture.md" for u in sorted(units - set(layers))]
    for module, deps in sorted(graph.items()):
        src = layer_unit(module)
        for dep in sorted(deps):
            dst = layer_unit(dep)
            if src == dst or dst in BASE or (src not in BASE and src not in layers):
                continue
            if src in BASE or dst not in layers or layers[dst] >= layers[src]:
                found.append(f"{module} -> {dep}")
    return found


def test_packages_import_only_the_layers_below():
    layers = drawn_layers(ARCHITECTURE.read_text())
    assert {"ops", "mixers", "runs", "train", "dense", "cli"} <= set(layers)            # the drawing was read
    assert layers["ops"] < layers["runs"] < layers["train"] == layers["dense"] < layers["cli"]
    upward = upward_imports(import_graph(), layers)
    assert upward == [], ("imports against the layer order of docs/architecture.md (move shared code down, "
                          "or dispatch through a table as runs/tasks.py does): " + "; ".join(upward))


def test_the_layer_check_sees_peer_and_lazy_imports(tmp_path):
    """train/ -> dense/ (a lazy import inside a function) between peers, and dense/ -> train/ upward of a
    drawing that puts train/ below dense/, are both reported: the test above can fail."""
    for package, body in {"train": "def run():\n    from ..dense import runner\n",
                          "dense": "from ..train.distributed import cleanup\n"}.items():
        (tmp_path / "vitmix" / package).mkdir(parents=True)
        (tmp_path / "vitmix" / package / "__init__.py").write_text("")
        (tmp_path / "vitmix" / package / "cli.py").write_text(body)
    (tmp_path / "vitmix" / "__init__.py").write_text("")
    (tmp_path / "vitmix" / "train" / "distributed.py").write_text("")
    (tmp_path / "vitmix" / "dense" / "runner.py").write_text("")
    graph = import_graph(tmp_path)
    peers = drawn_layers("```\ntrain/  dense/   jobs\n  (more)\nruns/   shared\n```\n")
    assert peers == {"train": 1, "dense": 1, "runs": 0}
    assert upward_imports(graph, peers) == ["vitmix.dense.cli -> vitmix.train.distributed",
                                            "vitmix.train.cli -> vitmix.dense.runner"]
    stacked = drawn_layers("```\ndense/   segmentation\ntrain/   jobs\n```\n")
    assert upward_imports(graph, stacked) == ["vitmix.train.cli -> vitmix.dense.runner"]
    assert upward_imports(graph, {"train": 0}) == ["dense is not drawn in docs/architecture.md",
                                                   "vitmix.train.cli -> vitmix.dense.runner"]
