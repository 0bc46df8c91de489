"""Small C kernels compiled on first use with the system C compiler and loaded with ctypes (private).

The sources are plain C99 with OpenMP (no torch headers), so a build takes about a second, and the
library is cached under ``VITMIX_CACHE_DIR`` (default ``~/.cache/vitmix``) keyed by the source, the
flags, the compiler and the CPU: later processes load it without compiling. Writes are atomic
(``os.replace``), so processes that build at the same time (torchrun, pytest-xdist) are safe.

``VITMIX_DISABLE_C_KERNEL=1`` turns every C kernel off (the PyTorch paths are used); a missing or
failing compiler gives one ``RuntimeWarning`` and the same fallback.
"""
from __future__ import annotations

import ctypes
import hashlib
import os
import platform
import shutil
import subprocess
import tempfile
import threading
import warnings
from typing import Callable, List, Optional

CFLAGS = ["-O3", "-fPIC", "-shared", "-std=c99", "-fno-math-errno", "-fno-trapping-math", "-fno-signed-zeros",
          "-fassociative-math", "-D_POSIX_C_SOURCE=200809L"]


def cpu_tag() -> str:
    """Machine and CPU model/flags: part of the cache key (the build uses -march=native)."""
    tag = platform.machine()
    try:
        with open("/proc/cpuinfo") as fh:
            for line in fh:
                if line.startswith(("model name", "flags")):
                    tag += line
                if line.startswith("flags"):
                    break
    except OSError:
        pass
    return tag


def compile_shared(source: str, target: str, cc: str) -> str:
    """Compile ``source`` into the shared library ``target``; returns "" on success, else the error."""
    error = ""
    with tempfile.TemporaryDirectory() as tmp:
        src = os.path.join(tmp, "kernel.c")
        with open(src, "w") as fh:
            fh.write(source)
        out = os.path.join(tmp, "kernel.so")
        # OpenMP first: the library then shares PyTorch's libgomp (same soname, already loaded) and so
        # its thread pool; without OpenMP the kernel runs single-threaded or on its own pthreads.
        for arch in (["-fopenmp", "-march=native"], ["-march=native"], ["-fopenmp"], []):
            cmd = [cc, *CFLAGS, *arch, src, "-o", out, "-lm", "-lpthread"]
            try:
                res = subprocess.run(cmd, capture_output=True, text=True, timeout=120)
            except (OSError, subprocess.TimeoutExpired) as err:
                error = str(err)
                continue
            if res.returncode == 0:
                tmp_target = f"{target}.{os.getpid()}.tmp"
                shutil.copyfile(out, tmp_target)
                os.replace(tmp_target, target)  # atomic: safe with parallel builders
                return ""
            error = (res.stderr or res.stdout).strip()[-500:]
    return error or "unknown error"


def find_compiler() -> Optional[str]:
    return os.environ.get("CC") or shutil.which("cc") or shutil.which("gcc") or shutil.which("clang")


def disabled() -> bool:
    return os.environ.get("VITMIX_DISABLE_C_KERNEL", "") not in ("", "0")


class CKernel:
    """A lazily built C library: ``load()`` returns the ``ctypes.CDLL`` or ``None`` (with one warning).

    Args:
        name: file-name stem and the name used in warnings (e.g. ``"l1_kernel"``).
        source: a callable returning the C source (imported lazily).
        declare: ``declare(lib)`` sets ``argtypes``/``restype`` of the exported functions.
    """

    #: every C library of the package, in creation order (fault-injection tests reset them all)
    instances: List["CKernel"] = []

    def __init__(self, name: str, source: Callable[[], str], declare: Callable[[ctypes.CDLL], None]):
        self.name, self._source, self._declare = name, source, declare
        self._lock = threading.Lock()
        self.reset()
        CKernel.instances.append(self)

    def reset(self) -> None:
        """Forget the loaded library (the next ``load()`` looks again); used by fault-injection tests."""
        self._lib, self._tried = None, False

    def load(self) -> Optional[ctypes.CDLL]:
        if disabled():
            return None
        with self._lock:
            if not self._tried:
                self._tried = True
                self._lib = self._build_and_load()
            return self._lib

    def library_path(self, cc: str) -> str:
        """Where the library built by ``cc`` is cached (the key covers source, flags, compiler, CPU)."""
        key = hashlib.sha256("\0".join([self._source(), " ".join(CFLAGS), cc, cpu_tag()]).encode()).hexdigest()[:16]
        cache = os.environ.get("VITMIX_CACHE_DIR") or os.path.join(os.path.expanduser("~"), ".cache", "vitmix")
        return os.path.join(cache, f"{self.name}_{key}.so")

    def _build_and_load(self) -> Optional[ctypes.CDLL]:
        cc = find_compiler()
        if cc is None:
            warnings.warn(f"vitmix: no C compiler (cc/gcc/clang or CC=...) for the {self.name}; using the "
                          f"PyTorch path", RuntimeWarning, stacklevel=4)
            return None
        source = self._source()
        target = self.library_path(cc)
        try:
            os.makedirs(os.path.dirname(target), exist_ok=True)
            error = "" if os.path.exists(target) else compile_shared(source, target, cc)
            if error:
                warnings.warn(f"vitmix: could not compile the {self.name} with {cc}; using the PyTorch path. "
                              f"Compiler output: {error}", RuntimeWarning, stacklevel=4)
                return None
            lib = ctypes.CDLL(target)
            self._declare(lib)
        except (OSError, AttributeError) as err:
            # a truncated/corrupt cached library fails to load or lacks a symbol: rebuild it once
            try:
                os.remove(target)
                error = compile_shared(source, target, cc)
                lib = None if error else ctypes.CDLL(target)
                if lib is not None:
                    self._declare(lib)
                    warnings.warn(f"vitmix: the cached {self.name} at {target} could not be loaded ({err}) and "
                                  f"was rebuilt", RuntimeWarning, stacklevel=4)
                    return lib
            except (OSError, AttributeError) as err2:
                err = err2
            warnings.warn(f"vitmix: cannot load the {self.name} ({err}); using the PyTorch path",
                          RuntimeWarning, stacklevel=4)
            return None
        return lib


__all__ = ["CKernel", "compile_shared", "cpu_tag", "find_compiler", "disabled", "CFLAGS"]
