"""The contributor docs match the tree: every relative link resolves (anchors included), and
``docs/architecture.md`` names only files and folders that exist, every top-level package of ``src/vitmix``
and every ``vitmix`` subcommand. Cheap checks that keep the map true when code moves."""
import re
import subprocess
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
ARCHITECTURE = ROOT / "docs" / "architecture.md"
LINK = re.compile(r"\]\(([^)\s]+)\)")
NAMED_AS_ABSENT = {"torch.py"}   # "named pytorch.py, not torch.py"
PATH = re.compile(r"(?<![\w./<-])((?:[\w-]+/)+(?:[\w-]+\.(?:py|md|yaml|sh))?|[\w-]+\.(?:py|md|yaml|sh))(?![\w<])")


def _doc_files():
    return [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md")), ROOT / "benchmarks" / "README.md",
            *sorted((ROOT / "experiments").rglob("README.md"))]


def _without_code_blocks(text: str) -> str:
    return re.sub(r"^```.*?^```", "", text, flags=re.S | re.M)


def _anchors(md: Path) -> set:
    """GitHub's heading ids: lower case, punctuation dropped, spaces to hyphens, repeats numbered."""
    seen = {}
    for heading in re.findall(r"^#+\s+(.*)$", _without_code_blocks(md.read_text()), flags=re.M):
        slug = re.sub(r"[^\w\- ]", "", heading.strip().lower()).replace(" ", "-")
        seen[slug] = seen.get(slug, -1) + 1
        yield slug if seen[slug] == 0 else f"{slug}-{seen[slug]}"


def _broken_links(doc: Path) -> list:
    broken = []
    for target in LINK.findall(_without_code_blocks(doc.read_text())):
        if re.match(r"[a-z]+:", target):  # https:, mailto:
            continue
        path, _, anchor = target.partition("#")
        dest = (doc.parent / path).resolve() if path else doc
        if not dest.exists():
            broken.append(target)
        elif anchor and dest.suffix == ".md" and anchor not in set(_anchors(dest)):
            broken.append(f"{target} (no such heading)")
    return broken


@pytest.mark.parametrize("doc", _doc_files(), ids=lambda p: p.relative_to(ROOT).as_posix())
def test_every_relative_link_resolves(doc):
    assert _broken_links(doc) == []


def test_the_link_check_sees_a_missing_file_and_heading(tmp_path):
    doc = tmp_path / "a.md"
    doc.write_text("# Title, here\n[ok](a.md#title-here) [gone](b.md) [bad](#nowhere)\n```\n[code](c.md)\n```\n")
    assert _broken_links(doc) == ["b.md", "#nowhere (no such heading)"]


def _tracked() -> list:
    out = subprocess.run(["git", "ls-files"], cwd=ROOT, capture_output=True, text=True)
    if out.returncode:  # not a git checkout (an sdist): every file under the root
        return [p.relative_to(ROOT).as_posix() for p in ROOT.rglob("*") if p.is_file()]
    return out.stdout.split()


def test_architecture_names_only_existing_paths():
    """A name such as ``mixers/base.py``, ``newton/c.py`` or ``ops/nystrom/`` must be the end of some
    file's or folder's path in the repository (the map abbreviates from ``src/vitmix`` or a package)."""
    files = _tracked()
    folders = {"/".join(f.split("/")[:i]) + "/" for f in files for i in range(1, f.count("/") + 1)}
    known = ["/" + p for p in (*files, *folders)]
    missing = sorted({name for name in PATH.findall(ARCHITECTURE.read_text())
                      if name not in NAMED_AS_ABSENT and not any(k.endswith("/" + name) for k in known)})
    assert not missing, f"docs/architecture.md names paths that do not exist: {missing}"


def test_architecture_lists_every_package_and_subcommand():
    from vitmix.cli import build_parser

    text = ARCHITECTURE.read_text()
    packages = sorted(p.name for p in (ROOT / "src" / "vitmix").iterdir()
                      if (p / "__init__.py").is_file())
    assert [p for p in packages if not re.search(rf"(^|[\s/`]){p}/", text, flags=re.M)] == []
    (listed,) = re.findall(r"the `vitmix` command: (.*)", text)
    subparsers = next(a for a in build_parser()._actions if a.dest == "command")
    assert sorted(c.strip() for c in listed.split("|")) == sorted(subparsers.choices)


#: what a measurement looks like in prose: a time, a throughput, the date it was taken, this project's machine
LAB_NOTE = re.compile(r"\d\s?(ms|µs|s per|img/s|images/s)\b|\b20\d\d-\d\d-\d\d\b|"
                      r"\b(January|February|March|April|May|June|July|August|September|October|November|December) "
                      r"\d\d?\b|this project's (AMD|Intel|CPU|machine)")


def test_docstrings_carry_no_measurements():
    """Docstrings say what a thing does and why; timings, dates and machines go to the docs pages that cite
    the results files (they would be stale after the next change of the code or the machine)."""
    import ast

    notes = []
    for path in sorted((ROOT / "src" / "vitmix").rglob("*.py")):
        tree = ast.parse(path.read_text())
        for node in ast.walk(tree):
            if isinstance(node, (ast.Module, ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef)):
                doc = ast.get_docstring(node) or ""
                notes += [f"{path.relative_to(ROOT)}:{getattr(node, 'name', '<module>')}: {m.group(0)!r}"
                          for m in LAB_NOTE.finditer(doc)]
    assert not notes, "measurements in docstrings (move them to docs/):\n" + "\n".join(notes)
