"""msprobe's ATB dumps made by msprobe's own ATB probe, on a machine without an NPU.

msprobe's ATB dumper is a C++ library (`msprobe/lib/libatb_probe_abi1.so`) that ATB calls for every tensor
(`atb::Probe::SaveTensor`); it depends only on libc. `tests/data/atb_probe_driver.cpp` makes the calls ATB makes
(`IsTensorNeedSave`, `UpdateConfig`, `IsExecuteCountInRange`, `IsSaveTensorInSpecificDir`, `SaveTensor`) with the
tensors of a dump of our ATB-structured stack, so the probe itself writes `atb_dump_data/data/{dev}_{pid}/{n}/
statistic.csv` (and, for task `tensor`/`all`, its `.bin` files): byte for byte what it writes under ATB.
"""

from __future__ import annotations

import hashlib
import importlib.util
import json
import os
import shutil
import subprocess
import tempfile
from pathlib import Path

from workbench.formats import atb, atb_bin

SOURCE = Path(__file__).resolve().parent / "data" / "atb_probe_driver.cpp"


def probe_library() -> Path | None:
    """msprobe's ATB probe library (C++11 ABI), or None when msprobe is not installed."""
    spec = importlib.util.find_spec("msprobe")
    if spec is None or not spec.submodule_search_locations:
        return None
    lib = Path(next(iter(spec.submodule_search_locations))) / "lib" / "libatb_probe_abi1.so"
    return lib if lib.is_file() else None


def skip_reason() -> str | None:
    """Why msprobe's ATB probe cannot be driven here (None when it can)."""
    if probe_library() is None:
        return "msprobe's ATB probe library not installed (pip install mindstudio-probe)"
    if shutil.which("g++") is None:
        return "g++ not found: needed to build the driver that calls msprobe's ATB probe"
    return None


def driver() -> Path:
    """The driver executable, built once per source and library (cached in the temp folder)."""
    lib = probe_library()
    assert lib is not None
    key = hashlib.sha256(SOURCE.read_bytes() + str(lib).encode()).hexdigest()[:16]
    exe = Path(tempfile.gettempdir()) / f"wb-atb-probe-driver-{key}"
    if not exe.is_file():
        tmp = exe.with_name(exe.name + f".{os.getpid()}")
        subprocess.run(
            [
                "g++",
                "-O1",
                "-std=c++17",
                str(SOURCE),
                "-o",
                str(tmp),
                f"-L{lib.parent}",
                f"-l:{lib.name}",
                f"-Wl,-rpath,{lib.parent}",
            ],
            check=True,
            capture_output=True,
        )
        tmp.replace(exe)
    return exe


def probe_dump(atb_dump: Path, out: Path, task: str = "statistics") -> Path:
    """Feed every tensor of our ATB stack's dump (`msit_dump_*` folder) to msprobe's ATB probe, which writes its
    own dump under `out/atb_dump_data`; returns that folder."""
    tensors = atb_dump / "tensors"
    lines = []
    for p in sorted(tensors.rglob("*.bin")):
        h = atb_bin.read_header(str(p))
        rel = p.relative_to(tensors).as_posix()
        attrs = h.attrs
        fields = [rel, attrs["format"], attrs["dtype"], attrs["dims"], str(p), str(h.payload_offset)]
        lines.append("\t".join([*fields, str(h.payload_length)]))
    for p in sorted(tensors.rglob(atb.OP_PARAM_FILE)):
        lines.append("\t".join(["param", p.relative_to(tensors).as_posix(), str(p)]))
    out.mkdir(parents=True, exist_ok=True)
    config = out / "atb_dump_config.json"
    body = {
        "dump_enable": True,
        "task": task,
        "exec_range": "all",
        "ids": "",
        "op_name": "",
        "save_child": True,
        "device": "",
        "filter_level": 1,
    }
    config.write_text(json.dumps(body))
    config.chmod(0o640)  # the probe refuses a configuration others may write
    env = {**os.environ, "ATB_DUMP_CONFIG": str(config), "ATB_OUTPUT_DIR": str(out)}
    proc = subprocess.run(
        [str(driver())], input="\n".join(lines) + "\n", capture_output=True, text=True, env=env, timeout=300
    )
    n_tensors = sum(not line.startswith("param\t") for line in lines)
    if proc.returncode != 0 or proc.stdout.strip().splitlines()[-1:] != [str(n_tensors)]:
        raise RuntimeError(f"msprobe's ATB probe failed: {proc.stdout[-1000:]} {proc.stderr[-2000:]}")
    return out / "atb_dump_data"
