"""The fused metric kernels (`kernels`) as machine code, called through ctypes (which lets go of the GIL).

numba compiles each entry point, a C function per element kind of its arrays (9 `pass_pair`, 3 `add_side`), once per
machine; this module keeps its machine code in files of its own, and a later process loads them instead of importing
numba and its compiler (~0.25 s) and loading numba's cache (~0.1 s): the entry as a shared library where a C compiler
linked one (`kernel_shared`: ctypes alone, ~1 ms), else its object file with llvmlite (~0.05 s of CPU). An entry
with no file yet is compiled by numba (~3 s) on its first call, by one process at a time (the others wait for its
files), and its files written. `make install` compiles all twelve (~40 s).

A file serves one version of the kernels' sources, numba, llvmlite and Python on one host CPU (its name holds their
digest), and its bytes are checked against the digest in its header (a library's: its sidecar) before loading. Files
live in `__pycache__` beside this module, or the user's cache folder where that is not writable (`NUMBA_CACHE_DIR`
first, as numba's).
"""

from __future__ import annotations

import contextlib
import ctypes
import fcntl
import glob
import hashlib
import importlib.machinery
import importlib.util
import os
import sys
import tempfile
import threading
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import numpy as np

from workbench.compare.judging import kernel_shared
from workbench.compare.judging.kernel_state import STATE_LEN

# the arrays the kernels read in place, by dtype: bfloat16 as its uint16 words, float16 as int16 words
KINDS: dict[np.dtype[Any], str] = {
    np.dtype(np.float32): "float32",
    np.dtype(np.uint16): "bfloat16",
    np.dtype(np.int16): "float16",
}
_KIND_NAMES = ("float32", "bfloat16", "float16")
ENTRIES: tuple[tuple[str, tuple[str, ...]], ...] = (
    *(("pass_pair", (g, m)) for g in _KIND_NAMES for m in _KIND_NAMES),
    *(("add_side", (x,)) for x in _KIND_NAMES),
)
_i8, _ptr = ctypes.c_int64, ctypes.c_void_p
_C_TYPES = {
    "pass_pair": ctypes.CFUNCTYPE(_i8, _ptr, _ptr, _i8, _i8, _i8, _i8, _ptr, _i8, _i8, _i8),
    "add_side": ctypes.CFUNCTYPE(_i8, _ptr, _i8, _i8, _ptr, _i8, _ptr),
}
_MAGIC = b"wb-kernel-object 1\n"
_SOURCES = ("kernels.py", "kernel_state.py")  # what the machine code is compiled from


class KernelCode:
    """The entry points of one process, each loaded (or compiled) on its first call."""

    def __init__(self) -> None:
        self._functions: dict[tuple[str, tuple[str, ...]], Any] = {}
        self.compiled: list[tuple[str, tuple[str, ...]]] = []  # the entries this process compiled, in order
        self._keep: list[Any] = []  # engines and numba functions whose code the functions above run
        self._lock = threading.Lock()
        self._llvm: Any = None
        self._key: str | None = None

    def pass_pair(
        self,
        g: np.ndarray,
        m: np.ndarray,
        first: int,
        stop: int,
        chunk: int,
        st: np.ndarray,
        ulp_top: int,
        ulp_floor: int,
        sides: bool,
    ) -> int:
        """Add chunks `first` .. `stop - 1` of a pair of 1-D contiguous arrays of one size to the state `st` (each
        side's statistics too when `sides`); returns the first chunk holding a NaN or an Inf (not added), or -1."""
        g, m = _contiguous(g), _contiguous(m)
        if g.size != m.size:
            raise ValueError(f"a pair of {g.size} and {m.size} elements")
        fn = self._function("pass_pair", (KINDS[g.dtype], KINDS[m.dtype]))
        return int(fn(_address(g), _address(m), g.size, first, stop, chunk, _state(st), ulp_top, ulp_floor, sides))

    def add_side(self, x: np.ndarray, chunk: int, st: np.ndarray, side: int) -> tuple[int, int]:
        """Add the finite elements of `x` to one side's statistics in `st`; returns its (NaN, Inf) counts."""
        x = _contiguous(x)
        counts = np.zeros(2, np.int64)
        self._function("add_side", (KINDS[x.dtype],))(_address(x), x.size, chunk, _state(st), side, _address(counts))
        return int(counts[0]), int(counts[1])

    def load_cached(self) -> None:
        """Load every entry whose library or object file is there (the others are compiled at their first call)."""
        with self._lock:
            for entry in ENTRIES:
                if entry not in self._functions:
                    self._try_file(entry)

    def build(self) -> None:
        """Every entry ready, from its files or compiled and its files written (`make install`); an entry with an
        object file but no library (written without a C compiler, or by an older wb) is compiled again to link one
        where a compiler is here now."""
        linking = kernel_shared.compiler() is not None
        for entry in ENTRIES:
            with self._lock:
                if entry in self._functions and not linking:
                    continue
                if self._try_library(entry) or (not linking and self._try_file(entry)):
                    continue
                self._compile(entry, library=linking)

    # ------------------------------------------------------------------------------------------

    def prepare(self, entry: str, kinds: tuple[str, ...]) -> bool:
        """Have the entry ready: loaded from its file, or compiled (and its file written) where there is none;
        True when this process compiled it."""
        with self._lock:
            if (entry, kinds) in self._functions or self._try_file((entry, kinds)):
                return False
            return self._compile((entry, kinds))

    def _function(self, entry: str, kinds: tuple[str, ...]) -> Callable[..., int]:
        fn = self._functions.get((entry, kinds))
        if fn is None:
            self.prepare(entry, kinds)
            fn = self._functions[(entry, kinds)]
        return fn

    def _try_file(self, entry: tuple[str, tuple[str, ...]]) -> bool:
        """The entry from its library, else its object file; False where there is neither (or only unusable ones:
        it is compiled anew)."""
        return self._try_library(entry) or self._try_object(entry)

    def _try_library(self, entry: tuple[str, tuple[str, ...]]) -> bool:
        """The entry from its shared library (`kernel_shared`), loaded without llvmlite."""
        name = kernel_shared.library_name(_file_name(entry, self._cache_key()))
        for folder in _folders():
            path = folder / name
            if not path.is_file():
                continue
            loaded = kernel_shared.load(path, _numba_helper_addresses())
            if loaded is not None:
                library, address = loaded
                self._keep.append(library)
                self._functions[entry] = _C_TYPES[entry[0]](address)
                return True
        return False

    def _try_object(self, entry: tuple[str, tuple[str, ...]]) -> bool:
        """The entry from its object file, loaded with llvmlite."""
        try:
            llvm = self._llvm_binding()
            for folder in _folders():
                path = folder / _file_name(entry, self._cache_key())
                try:
                    blob = path.read_bytes()
                except OSError:
                    continue
                parsed = _parse(blob)
                if parsed is None:
                    continue
                symbol, code = parsed
                engine = llvm.create_mcjit_compiler(llvm.parse_assembly(""), self._target_machine)
                engine.add_object_file(llvm.ObjectFileRef.from_data(code))
                engine.finalize_object()
                address = engine.get_function_address(symbol)
                if not address:
                    continue
                self._keep.append(engine)
                self._functions[entry] = _C_TYPES[entry[0]](address)
                return True
        except Exception:  # llvmlite missing or refusing the code: numba compiles it
            return False
        return False

    def _compile(self, entry: tuple[str, tuple[str, ...]], *, library: bool = False) -> bool:
        """Compile the entry unless another process did while this one waited for the lock (`library`: unless it
        linked its library)."""
        with _compile_lock(entry):
            if self._try_library(entry) if library else self._try_file(entry):
                return False
            self._compile_here(entry)
            return True

    def _compile_here(self, entry: tuple[str, tuple[str, ...]]) -> None:
        from workbench.compare.judging import kernels

        compiled = kernels.compile_entry(*entry)
        self.compiled.append(entry)
        self._keep.append(compiled)
        self._functions[entry] = _C_TYPES[entry[0]](compiled.address)
        name = _file_name(entry, self._cache_key())
        try:
            code = compiled._library._get_compiled_object()  # numba's private API: no file where it changed
            folder = _write(name, _header(compiled.native_name, code) + code)
        except Exception:  # no file: this process compiled it, the next one compiles it too
            return
        if kernel_shared.compiler() is None:
            return
        with contextlib.suppress(Exception):  # no library: the object file serves
            pic = kernel_shared.pic_object(compiled)
            kernel_shared.link(pic, compiled.native_name, folder, kernel_shared.library_name(name))

    def _llvm_binding(self) -> Any:
        if self._llvm is None:
            import llvmlite.binding as llvm

            llvm.initialize_native_target()
            llvm.initialize_native_asmprinter()
            for symbol, address in _numba_helper_addresses().items():
                llvm.add_symbol(symbol, address)
            self._target_machine = llvm.Target.from_default_triple().create_target_machine()
            self._llvm = llvm
        return self._llvm

    def _cache_key(self) -> str:
        """The digest of what made the machine code: the kernels' sources, numba's and llvmlite's versions, Python,
        the host CPU (computed without importing llvmlite where the system describes the CPU)."""
        if self._key is None:
            h = hashlib.sha256()
            here = Path(__file__).parent
            for name in _SOURCES:
                h.update((here / name).read_bytes())
            for package in ("numba", "llvmlite"):
                folder = _package_dir(package)
                h.update((folder / "_version.py").read_bytes() if folder else f"no {package}".encode())
            parts = (
                sys.implementation.cache_tag,
                sys.platform,
                os.uname().machine,
                _host_cpu() or self._llvm_host_cpu(),
                os.environ.get("NUMBA_CPU_NAME", ""),
                os.environ.get("NUMBA_CPU_FEATURES", ""),
                os.environ.get("NUMBA_OPT", ""),
            )
            h.update("\0".join(parts).encode())
            self._key = h.hexdigest()[:24]
        return self._key

    def _llvm_host_cpu(self) -> str:
        llvm = self._llvm_binding()
        return f"{llvm.get_process_triple()} {llvm.get_host_cpu_name()} {llvm.get_host_cpu_features().flatten()}"


_code: KernelCode | None = None
_code_lock = threading.Lock()


def kernel_code() -> KernelCode:
    """This process's kernels."""
    global _code
    if _code is None:
        with _code_lock:
            if _code is None:
                _code = KernelCode()
    return _code


def pair_entry(golden_dtype: str | None, test_dtype: str | None) -> tuple[str, tuple[str, ...]]:
    """The `pass_pair` entry a pair of tensors of these (canonical) dtypes runs: any dtype but the kernels' own
    is passed as float32 chunks."""
    kinds = tuple(d if d in _KIND_NAMES else "float32" for d in (golden_dtype, test_dtype))
    return "pass_pair", kinds


def preload() -> None:
    """Before a pool forks its workers: every entry with an object file loaded. An entry without one is compiled
    where a worker first calls it (one worker compiles, the others wait for its file: `_compile_lock`), so the
    first compare after an install compiles only what its pairs need (~3 s, not ~11 s for every float32-golden
    entry)."""
    kernel_code().load_cached()


# ----------------------------------------------------------------------------------------------


def _contiguous(a: np.ndarray) -> np.ndarray:
    return a if a.flags.c_contiguous else np.ascontiguousarray(a)


def _address(a: np.ndarray) -> int:
    address: int = a.__array_interface__["data"][0]
    return address


def _state(st: np.ndarray) -> int:
    if st.dtype != np.float64 or st.size != STATE_LEN or not st.flags.c_contiguous or not st.flags.writeable:
        raise ValueError("not a kernel state (kernel_state.new_state)")
    return _address(st)


def _package_dir(name: str) -> Path | None:
    spec = importlib.util.find_spec(name)  # found, not imported
    return Path(spec.origin).parent if spec is not None and spec.origin else None


# the lines of /proc/cpuinfo that say which instructions a CPU runs (x86, then ARM)
_CPU_FIELDS = frozenset(
    {
        *("vendor_id", "cpu family", "model", "model name", "flags"),
        *("CPU implementer", "CPU architecture", "CPU variant", "CPU part", "Features"),
    }
)


def _host_cpu() -> str | None:
    """The first CPU's identity and instruction-set flags as Linux reports them; None elsewhere."""
    try:
        with open("/proc/cpuinfo", encoding="utf-8", errors="replace") as f:
            first = []
            for line in f:
                if not line.strip():
                    break
                first.append(line)
    except OSError:
        return None
    fields = [line.strip() for line in first if line.split(":", 1)[0].strip() in _CPU_FIELDS]
    return "\n".join(fields) or None


_helper_addresses: dict[str, int] | None = None


def _numba_helper_addresses() -> dict[str, int]:
    """The addresses of the numba runtime functions compiled code refers to (its error path: the GIL, and an array's
    release), from numba's own extension modules, loaded without importing numba (once a process)."""
    global _helper_addresses
    if _helper_addresses is None:
        _helper_addresses = _find_numba_helpers()
    return _helper_addresses


def _find_numba_helpers() -> dict[str, int]:
    found_addresses: dict[str, int] = {}
    numba_dir = _package_dir("numba")
    if numba_dir is None:
        return found_addresses
    wanted = {
        "_helperlib": {"numba_gil_ensure": "gil_ensure", "numba_gil_release": "gil_release"},
        "core.runtime._nrt_python": {"NRT_MemInfo_call_dtor": "MemInfo_call_dtor"},
    }
    for module, symbols in wanted.items():
        *folders, stem = module.split(".")
        found = glob.glob(str(numba_dir.joinpath(*folders, f"{stem}.*.so")))
        if not found:
            continue
        loader = importlib.machinery.ExtensionFileLoader(f"numba.{module}", found[0])
        spec = importlib.util.spec_from_loader(f"numba.{module}", loader)
        if spec is None:
            continue
        helpers = importlib.util.module_from_spec(spec).c_helpers
        for symbol, name in symbols.items():
            found_addresses[symbol] = helpers[name]
    return found_addresses


def _folders() -> list[Path]:
    """Where object files are looked for, in order (written to the first writable one)."""
    if os.environ.get("NUMBA_CACHE_DIR"):
        return [Path(os.environ["NUMBA_CACHE_DIR"]) / "wb_kernels"]
    user = Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache") / "wb" / "kernels"
    return [Path(__file__).parent / "__pycache__", user]


def _file_name(entry: tuple[str, tuple[str, ...]], key: str) -> str:
    return f"wb_kernel-{entry[0]}-{'-'.join(entry[1])}-{key}.o"


def _header(symbol: str, code: bytes) -> bytes:
    return _MAGIC + hashlib.sha256(code).hexdigest().encode() + b"\n" + symbol.encode() + b"\n"


def _parse(blob: bytes) -> tuple[str, bytes] | None:
    """(symbol, object code) of a file this module wrote, None for anything else."""
    if not blob.startswith(_MAGIC):
        return None
    lines = blob[len(_MAGIC) :].split(b"\n", 2)
    if len(lines) != 3:
        return None
    digest, symbol, code = lines
    if hashlib.sha256(code).hexdigest().encode() != digest:
        return None
    return symbol.decode(), code


@contextlib.contextmanager
def _compile_lock(entry: tuple[str, tuple[str, ...]]) -> Iterator[None]:
    """Held while this process compiles `entry`: the pool's workers, all calling the same entries first, then compile
    each once between them (the others wait, then load its file), and different entries at once. A lock on one
    byte (the entry's place in `ENTRIES`) of one lock file; none where no cache folder takes the file."""
    fd = None
    place = ENTRIES.index(entry) if entry in ENTRIES else len(ENTRIES)
    for folder in _folders():
        try:
            folder.mkdir(parents=True, exist_ok=True)
            fd = os.open(folder / ".wb_kernel.lock", os.O_RDWR | os.O_CREAT, 0o644)
        except OSError:
            continue
        try:
            fcntl.lockf(fd, fcntl.LOCK_EX, 1, place)
        except OSError:  # a filesystem without locks
            os.close(fd)
            fd = None
        break
    try:
        yield
    finally:
        if fd is not None:
            os.close(fd)  # and the lock with it


def _write(name: str, blob: bytes) -> Path:
    """`blob` as `name` in the first folder that takes it (written whole, then renamed: a reader never sees half);
    that folder."""
    for folder in _folders():
        try:
            folder.mkdir(parents=True, exist_ok=True)
            fd, tmp = tempfile.mkstemp(prefix=".wb_kernel-", dir=folder)
        except OSError:
            continue
        try:
            with os.fdopen(fd, "wb") as f:
                f.write(blob)
            os.chmod(tmp, 0o644)  # mkstemp's 0600 would keep the code from the other users of a shared install
            os.replace(tmp, folder / name)
            return folder
        except OSError:
            Path(tmp).unlink(missing_ok=True)
    raise OSError("no writable folder for the kernels' object code")
