"""The compiled-kernel cache: a cached library is loaded only when it can be trusted.

Each refusal is forced here (tampered bytes, another owner, group/world-writable file or folder) on a
one-function library, so the checks run without building the large kernels.
"""
import os
import stat
import subprocess
import sys
import warnings

import pytest
import torch

from vitmix.ops import _cbuild
from vitmix.ops._cbuild import CKernel, find_compiler

if find_compiler() is None:
    pytest.skip("no C compiler", allow_module_level=True)


@pytest.fixture
def kernel(monkeypatch, tmp_path):
    """A tiny C library cached in a fresh folder (kept out of ``CKernel.instances``)."""
    monkeypatch.setenv("VITMIX_CACHE_DIR", str(tmp_path / "cache"))
    monkeypatch.delenv("VITMIX_DISABLE_C_KERNEL", raising=False)
    (tmp_path / "src").mkdir()
    (tmp_path / "src" / "answer.c").write_text("int answer(void) { return 42; }\n")
    lib = CKernel("answer_kernel", "answer.c", (), folder=str(tmp_path / "src"))
    CKernel.instances.remove(lib)
    return lib


def _fresh_load(kernel):
    kernel.reset()
    return kernel.load()


def _cached_library(kernel):
    record = kernel.record_path(find_compiler())
    digest = open(record).read()
    return f"{record[:-len('.sha256')]}_{digest[:16]}.so", digest


def _replace_bytes(path, data):
    """Rewrite a library as a new file (writing into a loaded one in place could crash this process)."""
    os.replace(path, path + ".old")
    with open(path, "wb") as fh:
        fh.write(data)
    os.chmod(path, 0o600)


def test_build_is_private_recorded_and_reused(kernel, tmp_path, monkeypatch):
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        assert kernel.load().answer() == 42
    folder = tmp_path / "cache"
    path, digest = _cached_library(kernel)
    assert _cbuild.sha256_file(path) == digest
    assert stat.S_IMODE(folder.stat().st_mode) == 0o700
    assert stat.S_IMODE(os.stat(path).st_mode) == 0o600
    assert sorted(p.name for p in folder.iterdir()) == sorted([os.path.basename(path),
                                                               os.path.basename(kernel.record_path(find_compiler()))])
    monkeypatch.setattr(_cbuild, "compile_shared", lambda *a: pytest.fail("a trusted cached library was rebuilt"))
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        assert _fresh_load(kernel).answer() == 42


def test_tampered_library_is_refused_and_rebuilt(kernel):
    kernel.load()
    path, digest = _cached_library(kernel)
    data = bytearray(open(path, "rb").read())
    data[-1] ^= 0xFF
    _replace_bytes(path, bytes(data))
    with pytest.warns(RuntimeWarning, match=f"not loading the cached answer_kernel: {path} does not match the SHA-256"):
        assert _fresh_load(kernel).answer() == 42
    assert _cbuild.sha256_file(path) == digest                # the fresh build replaced the tampered bytes


def test_truncated_library_is_refused_before_loading(kernel, monkeypatch):
    kernel.load()
    path, _ = _cached_library(kernel)
    _replace_bytes(path, b"\x7fELF" + bytes(96))
    loaded = []
    real_cdll = _cbuild.ctypes.CDLL
    monkeypatch.setattr(_cbuild.ctypes, "CDLL", lambda p: loaded.append(p) or real_cdll(p))
    with pytest.warns(RuntimeWarning, match="does not match the SHA-256"):
        assert _fresh_load(kernel).answer() == 42
    assert loaded == [path] and os.path.getsize(path) > 1000   # only the rebuilt library was opened


def test_library_of_another_owner_is_refused_and_rebuilt(kernel, monkeypatch):
    kernel.load()
    path, _ = _cached_library(kernel)
    real = os.lstat

    def other_owner(p):
        st = real(p)
        if os.fspath(p) != path:
            return st
        fields = list(st)
        fields[stat.ST_UID] = os.getuid() + 1
        return os.stat_result(fields)
    monkeypatch.setattr(_cbuild, "_lstat", other_owner)
    with pytest.warns(RuntimeWarning, match=f"{path} is owned by user id {os.getuid() + 1}, not by the current user"):
        assert _fresh_load(kernel).answer() == 42


@pytest.mark.parametrize("mode", [0o620, 0o602])
def test_group_or_world_writable_library_is_refused_and_rebuilt(kernel, mode):
    kernel.load()
    path, digest = _cached_library(kernel)
    os.chmod(path, mode)
    with pytest.warns(RuntimeWarning, match=f"{path} is writable by group or others"):
        assert _fresh_load(kernel).answer() == 42
    assert stat.S_IMODE(os.stat(path).st_mode) == 0o600 and _cbuild.sha256_file(path) == digest


def test_writable_record_is_refused(kernel):
    kernel.load()
    record = kernel.record_path(find_compiler())
    os.chmod(record, 0o666)
    with pytest.warns(RuntimeWarning, match=f"its record {record} is writable by group or others"):
        assert _fresh_load(kernel).answer() == 42


@pytest.mark.parametrize("mode", [0o770, 0o707, 0o1777])
def test_writable_cache_folder_is_not_used(kernel, tmp_path, mode):
    """A folder others may write to: not loaded from, not built into; the PyTorch path runs."""
    kernel.load()
    folder = tmp_path / "cache"
    before = sorted(folder.iterdir())
    os.chmod(folder, mode)
    with pytest.warns(RuntimeWarning, match=f"not using the kernel cache {folder} for the answer_kernel: it is "
                                            "writable by group or others.*PyTorch path"):
        assert _fresh_load(kernel) is None
    assert sorted(folder.iterdir()) == before


def test_cache_folder_of_another_owner_is_not_used(kernel, tmp_path, monkeypatch):
    folder = str(tmp_path / "cache")
    os.makedirs(folder, mode=0o700)
    real = os.lstat

    def other_owner(p):
        st = real(p)
        if os.fspath(p) != folder:
            return st
        fields = list(st)
        fields[stat.ST_UID] = os.getuid() + 1
        return os.stat_result(fields)
    monkeypatch.setattr(_cbuild, "_lstat", other_owner)
    with pytest.warns(RuntimeWarning, match="not using the kernel cache .* is owned by user id"):
        assert _fresh_load(kernel) is None
    assert os.listdir(folder) == []


def test_missing_c_sources_fall_back_with_one_warning(kernel, tmp_path):
    """A broken install without the package data: one warning naming the file, no build, the PyTorch path."""
    os.remove(tmp_path / "src" / "answer.c")
    with pytest.warns(RuntimeWarning, match="cannot read the C sources of the answer_kernel .*answer.c"):
        assert _fresh_load(kernel) is None
    assert not (tmp_path / "cache").exists()


def test_laplacian_runs_the_pytorch_path_with_an_unsafe_cache(monkeypatch, tmp_path):
    """The real fallback: a world-writable cache folder -> one warning, the eager path's numbers."""
    from vitmix.ops import laplacian_kernel, laplacian_kernel_reference
    from vitmix.ops.kernel import c as kernel_c

    folder = tmp_path / "shared"
    folder.mkdir()
    os.chmod(folder, 0o777)
    monkeypatch.setenv("VITMIX_CACHE_DIR", str(folder))
    monkeypatch.setattr(kernel_c.L1_KERNEL, "_lib", None)
    monkeypatch.setattr(kernel_c.L1_KERNEL, "_tried", False)
    monkeypatch.setattr(kernel_c, "_C_MIN_ELEMENTS", 0)
    x, y = torch.randn(3, 17, 8), torch.randn(3, 5, 8)
    with pytest.warns(RuntimeWarning, match="not using the kernel cache .* for the l1_kernel"):
        out = laplacian_kernel(x, y, 4.0)
    torch.testing.assert_close(out, laplacian_kernel_reference(x, y, 4.0), rtol=1e-5, atol=1e-6)
    assert list(folder.iterdir()) == []


def _asan_preload():
    """The runtimes that a Python process (not itself instrumented) preloads to load an ASan-built library:
    libasan first, then libstdc++ (ASan's __cxa_throw interceptor needs it loaded at start; Triton throws)."""
    libs = [subprocess.run([find_compiler(), f"-print-file-name={name}"], capture_output=True, text=True).stdout.strip()
            for name in ("libasan.so", "libstdc++.so")]
    return " ".join(libs) if all(os.path.isabs(p) for p in libs) else None


@pytest.mark.slow
def test_sanitized_build_reports_an_out_of_bounds_write(tmp_path):
    """VITMIX_C_SANITIZE=1 builds with ASan/UBSan (its own cache entry): a heap overflow in a library aborts
    the process with ASan's report, as CI's sanitizer run of the C op tests relies on."""
    preload = _asan_preload()
    if preload is None:
        pytest.skip("the compiler has no AddressSanitizer runtime")
    (tmp_path / "bad.c").write_text("#include <stdlib.h>\n"
                                    "int overflow(int n) { int *a = malloc(4 * n); a[n] = 1; int r = a[0]; free(a);"
                                    " return r; }\n")
    code = ("from vitmix.ops._cbuild import CKernel; import sys;"
            f"lib = CKernel('bad_kernel', 'bad.c', (), folder={str(tmp_path)!r}).load();"
            "assert lib is not None; lib.overflow(3); print('no report')")
    env = dict(os.environ, VITMIX_CACHE_DIR=str(tmp_path / "cache"), VITMIX_C_SANITIZE="1", LD_PRELOAD=preload,
               ASAN_OPTIONS="detect_leaks=0")
    env.pop("VITMIX_DISABLE_C_KERNEL", None)
    res = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=300)
    assert res.returncode != 0 and "heap-buffer-overflow" in res.stderr, res.stdout + res.stderr[-2000:]
    res = subprocess.run([sys.executable, "-c", code], env=dict(env, VITMIX_C_SANITIZE="0", LD_PRELOAD=""),
                         capture_output=True, text=True, timeout=300)
    assert "heap-buffer-overflow" not in res.stderr          # the ordinary build: no instrumentation
