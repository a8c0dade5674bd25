"""A kernel entry as a shared library: linked once by the system's C compiler, loaded with ctypes alone.

Loading an entry's object file takes llvmlite (`kernel_code`): ~0.05 s of CPU in each pool worker, which a compare
of a few hundred pairs notices (issue 23). Where a C compiler is at hand (`$CC`, else `cc`), the entry's code is
emitted once more as position-independent code from the same LLVM IR numba optimised, for the same CPU, and linked
with a three-function shim into `<entry>.so`; a later process loads that with `ctypes.CDLL` (~1 ms). The shim gives
the code the numba runtime functions it names (the error path's GIL, an array's release), forwarding them to
numba's own, whose addresses the loader hands it. Without a compiler, or where linking fails, nothing is written
and the object file serves as before.

Each library has a sidecar `<entry>.so.sum` holding its digest and entry symbol; a library whose bytes do not match
its sidecar is not loaded (a half-written or damaged file).
"""

from __future__ import annotations

import ctypes
import hashlib
import os
import shutil
import subprocess
import tempfile
from pathlib import Path
from typing import Any

_MAGIC = b"wb-kernel-library 1\n"
_SETTER = "wb_kernel_helpers"
# the numba runtime functions the kernels' code names, in the order the setter takes their addresses
HELPERS = ("numba_gil_ensure", "numba_gil_release", "NRT_MemInfo_call_dtor")
_SHIM = """\
typedef void (*wb_helper)(void *);
static wb_helper helpers[3];
__attribute__((visibility("hidden"))) void numba_gil_ensure(void *state) { helpers[0](state); }
__attribute__((visibility("hidden"))) void numba_gil_release(void *state) { helpers[1](state); }
__attribute__((visibility("hidden"))) void NRT_MemInfo_call_dtor(void *meminfo) { helpers[2](meminfo); }
void wb_kernel_helpers(wb_helper ensure, wb_helper release, wb_helper call_dtor) {
    helpers[0] = ensure;
    helpers[1] = release;
    helpers[2] = call_dtor;
}
"""
_LINK_TIMEOUT_S = 120


def compiler() -> str | None:
    """The C compiler that links the libraries (`$CC`, else `cc`), None where there is none."""
    return shutil.which(os.environ.get("CC") or "cc")


def library_name(object_name: str) -> str:
    """The library's file name beside the entry's object file `object_name` (`....o`)."""
    return object_name.removesuffix(".o") + ".so"


def pic_object(compiled: Any) -> bytes:
    """The entry numba compiled (`kernels.compile_entry`'s function) as position-independent object code, from the
    IR numba optimised, for the CPU and features numba compiled it for (numba's private API: an exception where it
    changed, and then no library is made)."""
    import llvmlite.binding as llvm

    library = compiled._library
    codegen = library.codegen
    machine = llvm.Target.from_triple(codegen._llvm_module.triple).create_target_machine(
        cpu=codegen._get_host_cpu_name(),
        features=codegen._tm_features,
        opt=3,
        reloc="pic",
        codemodel="default",
    )
    module = llvm.parse_assembly(library.get_llvm_str())
    return bytes(machine.emit_object(module))


def link(code: bytes, symbol: str, folder: Path, name: str) -> bool:
    """`code` (a position-independent object) and the shim linked into `folder/name`, its sidecar written after it;
    False where there is no compiler or the link fails (nothing is left behind)."""
    cc = compiler()
    if cc is None:
        return False
    try:
        with tempfile.TemporaryDirectory(prefix=".wb_kernel-link-", dir=folder) as work:
            src, obj, out = Path(work, "shim.c"), Path(work, "entry.o"), Path(work, "entry.so")
            src.write_text(_SHIM)
            obj.write_bytes(code)
            done = subprocess.run(
                [cc, "-shared", "-fPIC", "-O2", "-Wl,-z,noexecstack", "-o", str(out), str(src), str(obj), "-lm"],
                capture_output=True,
                timeout=_LINK_TIMEOUT_S,
                check=False,
            )
            if done.returncode != 0 or not out.is_file():
                return False
            blob = out.read_bytes()
            os.chmod(out, 0o755)
            os.replace(out, folder / name)
            sidecar = Path(work, "entry.sum")
            sidecar.write_bytes(_MAGIC + hashlib.sha256(blob).hexdigest().encode() + b"\n" + symbol.encode() + b"\n")
            os.chmod(sidecar, 0o644)
            os.replace(sidecar, folder / (name + ".sum"))
            return True
    except (OSError, subprocess.SubprocessError):
        return False


def load(path: Path, helper_addresses: dict[str, int]) -> tuple[Any, int] | None:
    """(the loaded library, its entry's address), or None where the library or its sidecar is missing, they do not
    match, or a numba helper's address is unknown."""
    if any(helper_addresses.get(h) is None for h in HELPERS):
        return None
    try:
        sidecar = Path(str(path) + ".sum").read_bytes()
        blob = path.read_bytes()
    except OSError:
        return None
    if not sidecar.startswith(_MAGIC):
        return None
    lines = sidecar[len(_MAGIC) :].split(b"\n")
    if len(lines) != 3 or lines[2] or hashlib.sha256(blob).hexdigest().encode() != lines[0]:
        return None
    try:
        library = ctypes.CDLL(str(path))
        setter = library[_SETTER]
        address = ctypes.cast(library[lines[1].decode()], ctypes.c_void_p).value
    except (OSError, AttributeError, UnicodeDecodeError):
        return None
    if not address:
        return None
    setter.argtypes = [ctypes.c_void_p] * len(HELPERS)
    setter.restype = None
    setter(*(helper_addresses[h] for h in HELPERS))
    return library, address
