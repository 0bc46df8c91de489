"""Package-level promises: ops/mixers need only torch; `import vitmix` registers models in timm."""
import ast
import pathlib
import subprocess
import sys

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
            "print(len(mixers.list_mixers()), hasattr(vitmix, 'create_model'))\n").replace("vitmix, ", "sys.modules['vitmix'], ")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert out.returncode == 0, out.stderr[-1500:]
    assert out.stdout.split() == [str(len(vitmix.list_mixers())), "False"]


def test_import_vitmix_registers_models_in_timm():
    code = ("import timm, vitmix; "
            "print(all(timm.is_model(n) for n in ('vit_nano_patch4_32', 'soft_tiny', 'laplacianformer_tiny', "
            "'weightformer_tiny', 'vit_tiny_patch16_224_fibottention')))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert out.strip() == "True"
