"""Small C libraries compiled on first use with the system C compiler and loaded with ctypes (private).

The sources are the C files of ``vitmix/ops/csrc`` (package data: one ``.c`` per library, shared
headers; plain C99 with OpenMP, no torch headers), so a build takes about a second, and the
library is cached under ``VITMIX_CACHE_DIR`` (default ``~/.cache/vitmix``) keyed by the library's
source and every header it includes, the flags, the compiler and the CPU: later processes load it
without compiling. Each library declares its exported functions in one table of C prototypes (the
same text as its header's, which a test checks); the ctypes ``argtypes`` are generated from it.

A cached library runs inside the process, so it is loaded only when it can be trusted: its folder
and the file belong to the current user and are writable by nobody else, and the file's bytes
match the SHA-256 recorded beside it at build time (``<name>_<key>.sha256``, naming the library
``<name>_<key>_<digest>.so``). A refused library is rebuilt (one warning naming the reason and the
path); an unsafe folder is not used at all (one warning, the PyTorch path). A build compiles in a
private temporary folder, writes the library to a fresh private file and renames it into place,
then the record: each rename is atomic and the record names a complete library, so processes that
build at the same time (torchrun, pytest-xdist) are safe.

``VITMIX_DISABLE_C_KERNEL=1`` turns every C kernel off (the PyTorch paths are used); a missing or
failing compiler gives one ``RuntimeWarning`` and the same fallback. ``VITMIX_C_SANITIZE=1`` builds
with AddressSanitizer and UndefinedBehaviorSanitizer (a separate cache entry; CI runs the C op
tests so once, with the ASan runtime preloaded into Python).
"""
from __future__ import annotations

import ctypes
import hashlib
import os
import platform
import re
import shutil
import stat
import subprocess
import tempfile
import threading
import warnings
from typing import List, Optional, Sequence, Tuple

from .. import _util

CFLAGS = ["-O3", "-fPIC", "-shared", "-std=c99", "-fno-math-errno", "-fno-trapping-math", "-fno-signed-zeros",
          "-fassociative-math", "-D_POSIX_C_SOURCE=200809L"]
#: added with ``VITMIX_C_SANITIZE=1`` (the CI's sanitizer run of the C op tests)
SANITIZE_FLAGS = ["-fsanitize=address,undefined", "-fno-omit-frame-pointer", "-fno-sanitize-recover=undefined"]
#: the folder of the C sources (package data)
CSRC = os.path.join(os.path.dirname(os.path.abspath(__file__)), "csrc")
#: the dtypes every library is instantiated for: (name suffix, C type of ``TYPE``, ctypes of ``TYPE``)
DTYPES = (("f32", "float", ctypes.c_float), ("f64", "double", ctypes.c_double))
_CTYPES = {"int64_t": ctypes.c_int64, "int": ctypes.c_int, "double": ctypes.c_double, "float": ctypes.c_float,
           "void": None}

#: ``os.lstat``, looked up at call time so that tests can fake another owner
_lstat = os.lstat


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


def build_flags() -> List[str]:
    return CFLAGS + (SANITIZE_FLAGS if os.environ.get("VITMIX_C_SANITIZE", "") not in ("", "0") else [])


def includes(source: str, folder: str = CSRC, include_dirs: Sequence[str] = ()) -> List[str]:
    """Paths of ``source`` (in ``folder``) and of every file it includes (``#include "..."``, searched in
    ``folder`` then ``include_dirs``), transitively, in order."""
    seen: List[str] = []

    def visit(path: str) -> None:
        if path not in seen:
            seen.append(path)
            with open(path) as fh:
                for name in re.findall(r'^\s*#\s*include\s+"([^"]+)"', fh.read(), re.M):
                    found = [os.path.join(d, name) for d in (folder, *include_dirs)
                             if os.path.isfile(os.path.join(d, name))]
                    if not found:
                        raise FileNotFoundError(f"{path} includes {name}, found in none of {[folder, *include_dirs]}")
                    visit(found[0])
    visit(os.path.join(folder, source))
    return seen


def split_prototype(prototype: str) -> Tuple[str, str, List[str]]:
    """``"void f(const TYPE *x, int n)"`` -> ``("void", "f", ["const TYPE *", "int"])`` (parameter names dropped)."""
    head, params = prototype.split("(", 1)
    ret, name = re.fullmatch(r"\s*(.*?)\s*\b(\w+)\s*", head).groups()
    types = [re.sub(r"\s*\b\w+$", "", p.strip()) for p in params.rsplit(")", 1)[0].split(",") if p.strip() != "void"]
    return ret, name, types


def ctype_of(c_type: str, real):
    """The ctypes type of a C parameter or return type: pointers are ``c_void_p``; ``TYPE`` is ``real``."""
    if "*" in c_type:
        return ctypes.c_void_p
    base = c_type.replace("const", "").strip()
    return real if base == "TYPE" else _CTYPES[base]


def bind(lib: ctypes.CDLL, prototypes) -> None:
    """Set ``argtypes``/``restype`` of each function of ``prototypes`` (C prototypes in ``TYPE``, names without
    the dtype suffix) for every dtype: ``vitmix_ns`` becomes ``vitmix_ns_f32`` and ``vitmix_ns_f64``."""
    for prototype in prototypes:
        ret, name, params = split_prototype(prototype)
        for sfx, _, real in DTYPES:
            fn = getattr(lib, f"{name}_{sfx}")
            fn.argtypes = [ctype_of(p, real) for p in params]
            fn.restype = ctype_of(ret, real)


def cache_dir() -> str:
    return str(_util.cache_dir())


def untrusted(path: str, kind: str = "file") -> str:
    """Why ``path`` (a ``"file"`` or ``"folder"``) must not be trusted, or "" if it may be.

    Another user who owns it, or may write to it, could make this process run their code.
    """
    try:
        st = _lstat(path)
    except OSError as err:
        return f"cannot be inspected ({err.strerror})"
    if not (stat.S_ISDIR if kind == "folder" else stat.S_ISREG)(st.st_mode):
        return f"is not a regular {kind}"
    if hasattr(os, "getuid") and st.st_uid != os.getuid():
        return f"is owned by user id {st.st_uid}, not by the current user ({os.getuid()})"
    if st.st_mode & (stat.S_IWGRP | stat.S_IWOTH):
        return f"is writable by group or others (mode {stat.S_IMODE(st.st_mode):o})"
    return ""


def sha256_file(path: str) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as fh:
        for block in iter(lambda: fh.read(1 << 20), b""):
            digest.update(block)
    return digest.hexdigest()


def compile_shared(source: str, cc: str, folder: str = CSRC,
                   include_dirs: Sequence[str] = ()) -> Tuple[Optional[bytes], str]:
    """Compile the C file ``source`` of ``folder`` (headers from ``folder``, then ``include_dirs``) into a
    shared library in a private temporary folder.

    Returns ``(the library's bytes, "")`` on success, else ``(None, the compiler's error)``.
    """
    error = ""
    with tempfile.TemporaryDirectory() as tmp:     # mkdtemp: mode 0700, a fresh name
        src = os.path.join(folder, source)
        out = os.path.join(tmp, "kernel.so")
        # OpenMP first: the library then shares PyTorch's libgomp (same soname, already loaded) and so
        # its thread pool; without OpenMP the kernel runs on its own pthreads (csrc/vitmix_parallel.h).
        for arch in (["-fopenmp", "-march=native"], ["-march=native"], ["-fopenmp"], []):
            dirs = [flag for d in (folder, *include_dirs) for flag in ("-I", d)]
            cmd = [cc, *build_flags(), *arch, *dirs, src, "-o", out, "-lm", "-lpthread"]
            try:
                res = subprocess.run(cmd, capture_output=True, text=True, timeout=120)
            except (OSError, subprocess.TimeoutExpired) as err:
                error = str(err)
                continue
            if res.returncode == 0:
                with open(out, "rb") as fh:
                    return fh.read(), ""
            error = (res.stderr or res.stdout).strip()[-500:]
    return None, error or "unknown error"


def write_private(folder: str, final_name: str, data: bytes) -> str:
    """Write ``data`` to a fresh private file in ``folder`` and rename it to ``final_name`` atomically."""
    fd, tmp = tempfile.mkstemp(dir=folder, prefix=f".{final_name}.", suffix=".tmp")   # O_EXCL, mode 0600
    try:
        with os.fdopen(fd, "wb") as fh:
            fh.write(data)
        os.replace(tmp, os.path.join(folder, final_name))
    except BaseException:
        os.unlink(tmp)
        raise
    return os.path.join(folder, final_name)


def find_compiler() -> Optional[str]:
    return os.environ.get("CC") or shutil.which("cc") or shutil.which("gcc") or shutil.which("clang")


def disabled() -> bool:
    return os.environ.get("VITMIX_DISABLE_C_KERNEL", "") not in ("", "0")


class CKernel:
    """A lazily built C library: ``load()`` returns the ``ctypes.CDLL`` or ``None`` (with one warning).

    Args:
        name: file-name stem and the name used in warnings (e.g. ``"l1_kernel"``).
        source: its C file in ``folder`` (e.g. ``"l1_kernel.c"``).
        prototypes: the C prototypes of its exported functions, written in ``TYPE`` without the dtype
            suffix (see :func:`bind`); the same as its header's (``tests/ops/test_csrc.py`` checks).
        folder: where ``source`` lives (default :data:`CSRC`); ``include_dirs``: more header folders.
    """

    #: every C library of the package, in creation order (fault-injection tests reset them all)
    instances: List["CKernel"] = []

    def __init__(self, name: str, source: str, prototypes: Sequence[str], folder: str = CSRC,
                 include_dirs: Sequence[str] = ()):
        self.name, self.source, self.prototypes = name, source, tuple(prototypes)
        self.folder, self.include_dirs = folder, tuple(include_dirs)
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

    def record_path(self, cc: str) -> str:
        """The file recording the SHA-256 of the library built by ``cc`` (the key covers the C file and its
        headers, the flags, the compiler, the CPU); the library is ``<record stem>_<digest[:16]>.so`` beside it."""
        key = hashlib.sha256("\0".join([*self._sources(), " ".join(build_flags()), cc, cpu_tag()]).encode())
        return os.path.join(cache_dir(), f"{self.name}_{key.hexdigest()[:16]}.sha256")

    def _sources(self) -> List[str]:
        """The text of the library's C file and of every header it includes (all part of the cache key)."""
        texts = []
        for path in includes(self.source, self.folder, self.include_dirs):
            with open(path) as fh:
                texts.append(f"{os.path.basename(path)}\n{fh.read()}")
        return texts

    def _declare(self, lib: ctypes.CDLL) -> None:
        bind(lib, self.prototypes)

    def _warn(self, message: str) -> None:
        warnings.warn(f"vitmix: {message}", RuntimeWarning, stacklevel=5)

    def _build_and_load(self) -> Optional[ctypes.CDLL]:
        cc = find_compiler()
        if cc is None:
            self._warn(f"no C compiler (cc/gcc/clang or CC=...) for the {self.name}; using the PyTorch path")
            return None
        try:
            record = self.record_path(cc)
        except OSError as err:                  # a broken install without the package data
            self._warn(f"cannot read the C sources of the {self.name} ({err}); using the PyTorch path")
            return None
        folder = os.path.dirname(record)
        try:
            os.makedirs(folder, mode=0o700, exist_ok=True)
        except OSError as err:
            self._warn(f"cannot create the kernel cache {folder} ({err}); using the PyTorch path for the {self.name}")
            return None
        reason = untrusted(folder, "folder")
        if reason:
            self._warn(f"not using the kernel cache {folder} for the {self.name}: it {reason}; using the PyTorch "
                       f"path (make it private with chmod 700, or set VITMIX_CACHE_DIR to a private folder)")
            return None
        if os.path.exists(record):
            lib, refusal = self._load_cached(record)
            if lib is not None:
                return lib
            self._warn(f"not loading the cached {self.name}: {refusal}; rebuilding it")
        data, error = compile_shared(self.source, cc, self.folder, self.include_dirs)
        if data is None:
            self._warn(f"could not compile the {self.name} with {cc}; using the PyTorch path. Compiler output: {error}")
            return None
        digest = hashlib.sha256(data).hexdigest()
        stem = os.path.basename(record)[:-len(".sha256")]
        try:
            path = write_private(folder, f"{stem}_{digest[:16]}.so", data)
            write_private(folder, os.path.basename(record), digest.encode())   # after the library it names
            lib = ctypes.CDLL(path)
            self._declare(lib)
        except (OSError, AttributeError) as err:
            self._warn(f"cannot load the {self.name} ({err}); using the PyTorch path")
            return None
        return lib

    def _load_cached(self, record: str) -> Tuple[Optional[ctypes.CDLL], str]:
        """The cached library if it can be trusted, else ``(None, why not, naming the path)``."""
        reason = untrusted(record)
        if reason:
            return None, f"its record {record} {reason}"
        with open(record) as fh:
            digest = fh.read().strip()
        if not re.fullmatch("[0-9a-f]{64}", digest):
            return None, f"its record {record} is not a SHA-256"
        path = f"{record[:-len('.sha256')]}_{digest[:16]}.so"
        reason = untrusted(path)
        if not reason and sha256_file(path) != digest:
            reason = "does not match the SHA-256 recorded when it was built"
        if reason:
            return None, f"{path} {reason}"
        try:
            lib = ctypes.CDLL(path)
            self._declare(lib)
        except (OSError, AttributeError) as err:     # e.g. a library from an older vitmix lacking a symbol
            return None, f"{path} cannot be loaded ({err})"
        return lib, ""


__all__ = ["CKernel", "compile_shared", "cpu_tag", "find_compiler", "disabled", "CFLAGS", "SANITIZE_FLAGS", "CSRC",
           "DTYPES", "bind", "build_flags", "cache_dir", "includes", "split_prototype", "untrusted"]
