"""The C sources (``vitmix/ops/csrc``, ``vitmix/mixers/fused/csrc``): shipped as package data, one prototype
table per library that matches its header, every file compiling without warnings."""
import ctypes
import importlib.resources
import os
import re
import shutil
import subprocess

import pytest

from vitmix.mixers.fused import library as layers_c
from vitmix.ops import _cbuild
from vitmix.ops._cbuild import CSRC, DTYPES, CKernel, bind, includes, split_prototype
from vitmix.ops.diagonal import c as diagonal_c
from vitmix.ops.kernel import c as kernel_c
from vitmix.ops.newton import c as newton_c
from vitmix.ops.nystrom import c as nystrom_c

LIBRARIES = [newton_c.NS_KERNEL, kernel_c.L1_KERNEL, diagonal_c._DIAGONAL, nystrom_c.NYSTROM_KERNEL,
             layers_c.LAYERS_KERNEL]
FOLDERS = {"vitmix.ops": CSRC, "vitmix.mixers.fused": layers_c.LAYERS_KERNEL.folder}
SOURCES = {package: sorted(f for f in os.listdir(folder) if f.endswith((".c", ".h")))
           for package, folder in FOLDERS.items()}


def _normal(prototype: str) -> str:
    return re.sub(r"\s*\*\s*", " *", " ".join(prototype.replace(";", "").split()))


def _header_prototypes(header: str) -> set:
    with open(header) as fh:
        text = re.sub(r"/\*.*?\*/", "", fh.read(), flags=re.S)
    return {_normal(p) for p in re.findall(r"^\s*(?:int64_t|void|int|float|double)\s+vitmix_\w+\s*\([^)]*\)\s*;",
                                           text, re.M)}


def test_every_library_of_the_package_is_checked_here():
    assert {k.source for k in CKernel.instances} == {k.source for k in LIBRARIES}
    assert {os.path.join(FOLDERS[p], f) for p, names in SOURCES.items() for f in names if f.endswith(".c")} == {
        os.path.join(k.folder, k.source) for k in LIBRARIES}


@pytest.mark.parametrize("kernel", LIBRARIES, ids=lambda k: k.name)
def test_prototype_table_matches_the_header(kernel):
    """The Python table, instantiated for each dtype, is exactly the header's prototypes (the compiler checks
    the header against the definitions: the .c includes it)."""
    header = os.path.join(kernel.folder, kernel.source[:-2] + ".h")
    assert header in includes(kernel.source, kernel.folder, kernel.include_dirs)
    table = set()
    for prototype in kernel.prototypes:
        ret, name, _ = split_prototype(prototype)
        for sfx, c_type, _ in DTYPES:
            typed = re.sub(r"\bTYPE\b", c_type, prototype).replace(f"{name}(", f"{name}_{sfx}(", 1)
            table.add(_normal(typed))
    assert table == _header_prototypes(header)


def test_argtypes_are_generated_from_the_prototypes():
    class Lib:
        def __getattr__(self, name):
            fn = type("Fn", (), {})()
            setattr(self, name, fn)
            return fn
    lib = Lib()
    bind(lib, ["int64_t vitmix_f(const TYPE *x, TYPE s, int64_t n, int k, double d, void **p)"])
    f32, f64 = lib.vitmix_f_f32, lib.vitmix_f_f64
    assert f32.argtypes == [ctypes.c_void_p, ctypes.c_float, ctypes.c_int64, ctypes.c_int, ctypes.c_double,
                            ctypes.c_void_p]
    assert f64.argtypes[1] is ctypes.c_double and f32.restype is ctypes.c_int64
    bind(lib, ["void vitmix_g(void)"])
    assert lib.vitmix_g_f32.argtypes == [] and lib.vitmix_g_f32.restype is None


@pytest.mark.parametrize("package", FOLDERS)
def test_every_c_source_is_package_data(package):
    """Found through importlib.resources (as an installed package reads them); the wheel's contents are
    checked in tests/test_packaging.py."""
    shipped = importlib.resources.files(package) / "csrc"
    assert SOURCES[package] and all((shipped / name).is_file() for name in SOURCES[package])
    assert sorted(p.name for p in shipped.iterdir() if p.name.endswith((".c", ".h"))) == SOURCES[package]


def test_cache_key_ignores_headers_not_included_and_covers_the_flags(monkeypatch, tmp_path):
    """A header the library does not include leaves its cache entry alone; the build flags are part of the key
    (each included file is: the test below)."""
    for name in SOURCES["vitmix.ops"]:
        shutil.copy(os.path.join(CSRC, name), tmp_path / name)
    kernel = CKernel("ns_kernel", "newton.c", newton_c.PROTOTYPES, folder=str(tmp_path))
    CKernel.instances.remove(kernel)
    assert "vitmix_exp.h" not in [os.path.basename(p) for p in includes("newton.c", str(tmp_path))]
    before = kernel.record_path("cc")
    with open(tmp_path / "vitmix_exp.h", "a") as fh:
        fh.write("/* edited */\n")
    assert kernel.record_path("cc") == before
    monkeypatch.setenv("VITMIX_C_SANITIZE", "1")
    assert kernel.record_path("cc") != before


@pytest.mark.parametrize("kernel", LIBRARIES, ids=lambda k: k.name)
def test_cache_key_covers_every_file_a_library_includes(kernel, tmp_path):
    """Each file a library is built from, included by its .c or through another header (vec_typed.h through
    dtype_f32.h; the landmark layers' shared headers from ops/csrc), gives a new cache entry when edited."""
    folders = []
    for i, folder in enumerate((kernel.folder, *kernel.include_dirs)):
        shutil.copytree(folder, tmp_path / str(i))
        folders.append(str(tmp_path / str(i)))
    copy = CKernel(kernel.name, kernel.source, kernel.prototypes, folder=folders[0], include_dirs=folders[1:])
    CKernel.instances.remove(copy)
    paths = includes(kernel.source, folders[0], folders[1:])
    assert {"vec_typed.h", "dtype_end.h", kernel.source[:-2] + ".h"} <= {os.path.basename(p) for p in paths}
    keys = [copy.record_path("cc")]
    for path in paths:
        with open(path, "a") as fh:
            fh.write("/* edited */\n")
        keys.append(copy.record_path("cc"))
    assert len(set(keys)) == len(paths) + 1


def test_a_missing_header_is_one_clear_error(tmp_path):
    (tmp_path / "lib.c").write_text('#include "nowhere.h"\n')
    with pytest.raises(FileNotFoundError, match="lib.c includes nowhere.h, found in none of"):
        includes("lib.c", str(tmp_path), (CSRC,))


@pytest.mark.skipif(_cbuild.find_compiler() is None, reason="no C compiler")
@pytest.mark.parametrize("kernel", LIBRARIES, ids=lambda k: k.name)
def test_c_file_compiles_without_warnings(kernel):
    """What ``make lint`` checks, with and without OpenMP (the build's fallback)."""
    dirs = [flag for d in (kernel.folder, *kernel.include_dirs) for flag in ("-I", d)]
    for omp in (["-fopenmp"], []):
        cmd = [_cbuild.find_compiler(), "-std=c99", "-fsyntax-only", "-Wall", "-Wextra", "-Werror",
               "-Wno-unknown-pragmas", "-D_POSIX_C_SOURCE=200809L", *omp, *dirs,
               os.path.join(kernel.folder, kernel.source)]
        res = subprocess.run(cmd, capture_output=True, text=True)
        assert res.returncode == 0, res.stderr


@pytest.mark.skipif(_cbuild.find_compiler() is None, reason="no C compiler")
@pytest.mark.parametrize("sfx", [s for s, _, _ in DTYPES])
def test_every_work_item_that_cannot_allocate_is_counted(sfx):
    """An item whose buffers cannot be allocated is counted whichever thread ran it (the count the Python callers
    raise MemoryError for): 2^50 tokens ask for more memory than an address space holds, and no item reads its
    inputs before its allocation (d = 0 keeps the Nystrom slices' input offsets at 0)."""
    layers, nystrom = layers_c.LAYERS_KERNEL.load(), nystrom_c.NYSTROM_KERNEL.load()
    if layers is None or nystrom is None:
        pytest.skip("the C libraries did not build")
    huge, B, heads = 1 << 50, 3, 2
    buf = (ctypes.c_double * 8)()
    lap = getattr(layers, f"vitmix_laplacian_mix_{sfx}")
    assert lap(buf, None, None, buf, B, huge, 0, 1, 1, heads, 1, 1, 1, 1.0, 1e-3, 1, 0, 1e-4, 1.0, None, 0, None,
               2) == B * heads
    lap_bwd = getattr(layers, f"vitmix_laplacian_mix_backward_{sfx}")
    assert lap_bwd(buf, buf, None, None, buf, buf, buf, buf, buf, B, huge, 0, 1, 1, heads, 1, 1, 1, 1.0, 1e-4, 1.0,
                   0, 2) == B * heads
    soft = getattr(layers, f"vitmix_soft_mix_{sfx}")
    assert soft(buf, buf, None, None, None, 1e-5, None, buf, B, huge, 0, 1, 1, heads, 1, 1, 1, 1, 0, 1.0, 1e-3, 1, 0,
                0, 0, None, 2) == B * heads
    soft_bwd = getattr(layers, f"vitmix_soft_mix_backward_{sfx}")
    assert soft_bwd(buf, buf, None, None, None, 1e-5, None, buf, buf, buf, buf, buf, buf, buf, buf, B, huge, 0, 1, 1,
                    heads, 1, 1, 1, 1, 0, 1.0, 0, 0, 2) == B * heads
    forward = getattr(nystrom, f"vitmix_nystrom_forward_{sfx}")
    assert forward(buf, buf, buf, buf, buf, buf, 5, huge, 0, 1, 0, 0, 1, 1.0, 1, 1e-3, 1, 0, 0, 1e-4, 2) == 5
