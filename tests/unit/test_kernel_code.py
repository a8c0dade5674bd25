"""The kernels' machine code kept between processes (`kernel_code`): a process that finds the shared libraries a C
compiler linked loads them with ctypes alone, one that finds only the object files loads those with llvmlite (numba
is never imported), and either computes the numbers numba's own compile gives, bit for bit; a damaged file is refused
(a library: the object file serves; an object file: the entry is compiled anew)."""

from __future__ import annotations

import ast
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from workbench.compare.judging.kernel_shared import compiler

# one pair through both entries (NaN and Inf on either side reach add_side), printed to the last bit
_PROGRAM = """
import sys
import torch
from workbench.compare.judging.metrics import compare_tensors
gen = torch.Generator().manual_seed(5)
g = torch.randn(100_003, generator=gen) * 3
m = (g * 1.002 + 1e-3).to(torch.bfloat16)
m[17] = float("nan")
g[40_000] = float("inf")
r = compare_tensors(g, m)
print(repr(sorted(r.values.items())), repr(r.golden), repr(r.test))
print("numba imported:", "numba" in sys.modules)
from workbench.compare.judging.kernel_code import kernel_code
print(repr(kernel_code().compiled))
print("llvmlite imported:", "llvmlite" in sys.modules)
"""
_NO_COMPILER = "no C compiler here (cc, or $CC): the kernels are not linked as shared libraries"


def _run(cache: Path, **env: str) -> tuple[str, bool]:
    return _run_llvm(cache, **env)[:2]


def _run_llvm(cache: Path, **env: str) -> tuple[str, bool, bool]:
    """(the numbers, whether numba was imported, whether llvmlite was)."""
    env = {**os.environ, "NUMBA_CACHE_DIR": str(cache), **env}
    out = subprocess.run(
        [sys.executable, "-c", _PROGRAM], capture_output=True, text=True, timeout=600, env=env, check=True
    ).stdout.splitlines()
    return out[0], out[1] == "numba imported: True", out[3] == "llvmlite imported: True"


def _objects(cache: Path) -> list[Path]:
    return sorted((cache / "wb_kernels").glob("wb_kernel-*.o"))


def _libraries(cache: Path) -> list[Path]:
    return sorted((cache / "wb_kernels").glob("wb_kernel-*.so"))


@pytest.mark.slow
def test_object_files_load_without_numba_and_give_numbas_numbers(tmp_path: Path) -> None:
    compiled, numba_first = _run(tmp_path)
    names = [p.name.split("-")[1:-1] for p in _objects(tmp_path)]
    # the chunks holding NaN or Inf: each side alone, then the positions finite on both as float32
    assert names == [
        ["add_side", "bfloat16"],
        ["add_side", "float32"],
        ["pass_pair", "float32", "bfloat16"],
        ["pass_pair", "float32", "float32"],
    ]
    assert numba_first  # nothing to load: numba compiled the entries and their files were written
    if compiler() is not None:  # and linked each as a library, with its digest beside it
        assert [p.name.removesuffix(".so") for p in _libraries(tmp_path)] == [
            p.name.removesuffix(".o") for p in _objects(tmp_path)
        ]
        assert all(Path(f"{p}.sum").is_file() for p in _libraries(tmp_path))
    loaded, numba_second, llvm_second = _run_llvm(tmp_path)
    assert not numba_second, "a process with every object file imported numba"
    assert loaded == compiled
    assert llvm_second == (compiler() is None), "llvmlite loaded though every entry has its library"


@pytest.mark.slow
@pytest.mark.skipif(compiler() is None, reason=_NO_COMPILER)
def test_a_damaged_library_is_refused_and_the_object_file_loaded(tmp_path: Path) -> None:
    reference, _ = _run(tmp_path)
    target = next(p for p in _libraries(tmp_path) if "pass_pair" in p.name)
    blob = bytearray(target.read_bytes())
    blob[len(blob) // 2] ^= 0xFF
    target.write_bytes(bytes(blob))
    again, numba_used, llvm_used = _run_llvm(tmp_path)
    assert (again, numba_used, llvm_used) == (reference, False, True)


@pytest.mark.slow
def test_without_a_compiler_the_object_files_serve(tmp_path: Path) -> None:
    missing = str(tmp_path / "no-such-cc")
    reference, numba_first = _run(tmp_path, CC=missing)
    assert numba_first and _objects(tmp_path) and not _libraries(tmp_path)
    loaded, numba_used, llvm_used = _run_llvm(tmp_path, CC=missing)
    assert (loaded, numba_used, llvm_used) == (reference, False, True)


@pytest.mark.slow
def test_a_damaged_object_file_is_refused_and_the_entry_compiled_again(tmp_path: Path) -> None:
    no_cc = str(tmp_path / "no-such-cc")  # object files alone (a library would be loaded before them)
    reference, _ = _run(tmp_path, CC=no_cc)
    target = next(p for p in _objects(tmp_path) if "pass_pair" in p.name)
    blob = bytearray(target.read_bytes())
    blob[-100] ^= 0xFF  # one byte of the machine code
    target.write_bytes(bytes(blob))
    again, numba_used = _run(tmp_path, CC=no_cc)
    assert numba_used and again == reference
    fixed, numba_third = _run(tmp_path, CC=no_cc)  # the compile wrote a good file over it
    assert not numba_third and fixed == reference


@pytest.mark.slow
def test_processes_needing_the_same_entry_compile_it_once(tmp_path: Path) -> None:
    """Two processes started together with no object files (a pool's workers after an install): one compiles each
    entry, the other waits for its file and loads it; both give the same numbers. Which process compiles which entry
    is a race (each entry has its own lock): every entry is compiled by exactly one of them."""
    env = {**os.environ, "NUMBA_CACHE_DIR": str(tmp_path)}
    procs = [
        subprocess.Popen([sys.executable, "-c", _PROGRAM], stdout=subprocess.PIPE, text=True, env=env) for _ in range(2)
    ]
    outs = [p.communicate(timeout=600)[0].splitlines() for p in procs]
    assert all(p.returncode == 0 for p in procs)
    assert outs[0][0] == outs[1][0]
    compiled = [ast.literal_eval(o[2]) for o in outs]
    assert sorted(compiled[0] + compiled[1]) == [
        ("add_side", ("bfloat16",)),
        ("add_side", ("float32",)),
        ("pass_pair", ("float32", "bfloat16")),
        ("pass_pair", ("float32", "float32")),
    ]
    for out, entries in zip(outs, compiled, strict=True):
        assert out[1] == f"numba imported: {bool(entries)}"  # only a process that compiled loaded numba
    assert len(_objects(tmp_path)) == 4


def test_file_names_hold_the_entry_and_a_digest_of_what_made_the_code() -> None:
    from workbench.compare.judging.kernel_code import ENTRIES, KernelCode, _file_name

    key = KernelCode()._cache_key()
    names = {_file_name(e, key) for e in ENTRIES}
    assert len(names) == len(ENTRIES) == 12
    assert all(n.endswith(f"-{key}.o") and n.startswith("wb_kernel-") for n in names)


_PREPARE_TWO = """
from workbench.compare.execution.pool import new_pool
from workbench.compare.execution.worker import prepare_kernel
pool = new_pool(2)
entries = [("pass_pair", ("float32", "float32")), ("pass_pair", ("float32", "bfloat16"))]
futures = [pool.submit(prepare_kernel, e) for e in entries]
print([f.result() for f in futures], [f.result() for f in [pool.submit(prepare_kernel, e) for e in entries]])
pool.shutdown()
"""


@pytest.mark.slow
def test_a_pool_prepares_the_entries_it_is_handed_each_on_the_worker_that_takes_it(tmp_path: Path) -> None:
    """The first compare after an install hands the pool one `prepare_kernel` task per entry its pairs run: each
    worker compiles the entry it took (with per-entry locks, two workers compile two entries at once), writes its
    file, and a second ask only loads it."""
    env = {**os.environ, "NUMBA_CACHE_DIR": str(tmp_path)}
    out = subprocess.run(
        [sys.executable, "-c", _PREPARE_TWO], capture_output=True, text=True, timeout=600, env=env, check=True
    ).stdout.strip()
    assert out == "[True, True] [False, False]"
    assert [p.name.split("-")[1:-1] for p in _objects(tmp_path)] == [
        ["pass_pair", "float32", "bfloat16"],
        ["pass_pair", "float32", "float32"],
    ]


def test_a_pair_runs_the_entry_of_its_dtypes_any_other_dtype_as_float32() -> None:
    from workbench.compare.judging.kernel_code import ENTRIES, pair_entry

    assert pair_entry("float32", "bfloat16") == ("pass_pair", ("float32", "bfloat16"))
    assert pair_entry("float16", "float16") == ("pass_pair", ("float16", "float16"))
    assert pair_entry("float64", "int8") == ("pass_pair", ("float32", "float32"))
    assert pair_entry(None, "bfloat16") == ("pass_pair", ("float32", "bfloat16"))
    assert all(pair_entry(g, t) in ENTRIES for g in ("float32", "bfloat16", "x") for t in ("float16", None))


# float16 values of every kind (normal, subnormal, zeros, Inf, NaN) against a float32 golden, read out exactly
_HALVES = """
import json
import sys
import numpy as np
from workbench.compare.judging import kernels
from workbench.compare.judging.metrics import compare_tensors
gen = np.random.default_rng(6)
g = (gen.standard_normal(70_001) * 4).astype(np.float32)
g[::11] *= np.float32(1e-6)  # subnormal halves
m = g.astype(np.float16)
m[5], m[6], m[7], m[8] = np.inf, -np.inf, np.nan, -0.0
r = compare_tensors(g, m)
print(kernels._CPU_CONVERTS_HALVES)
print(json.dumps({k: None if v is None else float(v) for k, v in r.values.items()}))
print(repr((r.golden, r.test)))
"""


@pytest.mark.slow
def test_float16_read_by_the_cpu_or_in_bits_gives_the_same_numbers(tmp_path: Path) -> None:
    """A CPU that converts halves itself (F16C, ARM) and code compiled for a generic CPU (bit arithmetic) see the
    same float16 values: every count, extreme and metric agrees (sums to float32 rounding: the loops vectorise
    differently)."""

    def run(**env: str) -> list[str]:
        return subprocess.run(
            [sys.executable, "-c", _HALVES],
            capture_output=True,
            text=True,
            timeout=600,
            env={**os.environ, **env},
            check=True,
        ).stdout.splitlines()

    native, generic = run(), run(NUMBA_CPU_NAME="generic", NUMBA_CACHE_DIR=str(tmp_path))
    assert generic[0] == "False"
    values = [json.loads(out[1]) for out in (native, generic)]
    assert values[0].keys() == values[1].keys()
    for name, v in values[0].items():
        # the KL divergence from float32 sums of exponentials: absolute precision ~1e-7 (docs/metrics.md)
        rel, tol = (None, 1e-7) if name == "kl_divergence" else (1e-6, 1e-12)
        assert v == pytest.approx(values[1][name], rel=rel, abs=tol), name
    # the statistics: NaN/Inf counts, min and max exactly, the sums to rounding
    sides = [out[2] for out in (native, generic)]
    for field in ("nan_count=1", "inf_count=2", "min=", "max="):
        assert field in sides[0] and field in sides[1], field
    extremes = [[part for part in side.split(", ") if part.startswith(("min=", "max="))] for side in sides]
    assert extremes[0] == extremes[1]


_WIDTH = """
import sys
from workbench.compare.judging import kernels
from numba.core import config
asm = kernels.compile_entry("pass_pair", ("float32", "bfloat16"))._library.get_asm_str()
print("zmm" in asm, "ymm" in asm)
print(config.CPU_FEATURES)
"""


def _avx512_here() -> bool:
    try:
        with open("/proc/cpuinfo", encoding="utf-8") as f:
            flags = next((line for line in f if line.startswith("flags")), "").split()
    except OSError:
        return False
    return {"avx512f", "avx512vl", "avx512bw"} <= set(flags)


@pytest.mark.slow
@pytest.mark.skipif(not _avx512_here(), reason="this CPU has no AVX-512: the kernels are vectorised 256 bits wide")
def test_the_pass_is_vectorised_512_bits_wide_unless_the_user_chose_the_cpu_features() -> None:
    """LLVM's tuning prefers 256-bit vectors on every AVX-512 CPU; the kernels lift it (the pass ran ~1.6x faster,
    `bench/bench_kernel_width.py`). A user's own `NUMBA_CPU_FEATURES` or `NUMBA_CPU_NAME` is left as it is."""

    def run(**env: str) -> list[str]:
        base = {k: v for k, v in os.environ.items() if k not in ("NUMBA_CPU_FEATURES", "NUMBA_CPU_NAME")}
        return subprocess.run(
            [sys.executable, "-c", _WIDTH], capture_output=True, text=True, timeout=600, env={**base, **env}, check=True
        ).stdout.splitlines()

    wide = run()
    assert wide[0] == "True True"  # 512-bit loops (and 256-bit code where LLVM chose it)
    assert wide[1].endswith(",-prefer-256-bit") and "+avx512f" in wide[1]
    chosen = "+64bit,+sse2,+avx,+avx2,+fma,+f16c"
    assert run(NUMBA_CPU_FEATURES=chosen)[1] == chosen
    assert run(NUMBA_CPU_NAME="generic")[1] == ""  # numba's own default for a generic CPU, left as it is
