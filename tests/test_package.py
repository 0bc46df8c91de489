"""Package-level promises: ops/mixers need only torch; `import vitmix` is light and registers the
models in timm whichever of the two is imported first."""
import ast
import pathlib
import subprocess
import sys

import pytest

import vitmix

SRC = pathlib.Path(vitmix.__file__).parent


def _imported_roots(path: pathlib.Path):
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            yield from (a.name.split(".")[0] for a in node.names)
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            yield node.module.split(".")[0]


def test_ops_and_mixers_source_imports_no_timm_or_torchvision():
    for folder in ("ops", "mixers"):
        for path in (SRC / folder).glob("*.py"):
            assert not {"timm", "torchvision"} & set(_imported_roots(path)), path


def test_ops_and_mixers_work_without_timm_installed():
    code = ("import sys; sys.modules['timm'] = None; sys.modules['torchvision'] = None\n"
            "import torch, vitmix.ops\nfrom vitmix import mixers\n"
            "for name in mixers.list_mixers():\n"
            "    mixers.create(name, 64, 4)(torch.randn(1, 65, 64))\n"
            "print(len(mixers.list_mixers()), hasattr(vitmix, 'create_model'))\n"
            ).replace("vitmix, ", "sys.modules['vitmix'], ")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert out.returncode == 0, out.stderr[-1500:]
    assert out.stdout.split() == [str(len(vitmix.list_mixers())), "False"]


@pytest.mark.parametrize("imports", ["import timm, vitmix", "import vitmix, timm", "import torch, vitmix, timm"])
def test_import_vitmix_registers_models_in_timm(imports):
    code = (f"{imports}; "
            "print(all(timm.is_model(n) for n in ('vit_nano_patch4_32', 'soft_tiny', 'laplacianformer_tiny', "
            "'weightformer_tiny', 'vit_tiny_patch16_224_fibottention')))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert out.strip() == "True"


def test_cli_parser_and_import_vitmix_do_not_load_torch():
    """`vitmix --help` and one-line CLI errors stay fast: building the parser imports no torch/timm
    (seconds of start-up on a small machine)."""
    code = ("import sys, vitmix, vitmix.cli; vitmix.cli.build_parser(); "
            "print(sorted(m for m in ('torch', 'timm', 'torchvision') if m in sys.modules))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert out.strip() == "[]"


def test_lazy_names_resolve_and_list():
    code = ("import vitmix; names = dir(vitmix); m = vitmix.create_mixer('softmax', 32, 2); "
            "print(type(m).__name__, 'create_model' in names, callable(vitmix.list_models))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert out.split() == ["SoftmaxAttention", "True", "True"]
    with pytest.raises(AttributeError, match="no attribute 'nope'"):
        _ = vitmix.nope
