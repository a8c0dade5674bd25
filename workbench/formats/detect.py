"""`open_dump`: find out what kind of dump a path is (and at which level) and read it.

Accepted levels, as users pass them to msit/msprobe:
- msit torch: the folder above `msit_dump_*`, `msit_dump_*`, `torch_tensors/`, `torch_tensors/{dev}_{pid}`,
  one token folder `{dev}_{pid}/{n}` (that token only), one module folder (that module and its submodules);
- ATB: the folder above `msit_dump_*`, `msit_dump_*`, `tensors/`, `tensors/{dev}_{pid}`, one execute-count
  folder, one op folder at any depth (that op subtree), or its `before`/`after` folder;
- msprobe: the dump path (`step*/` below it), `step{N}`, `step{N}/rank{R}`, or its `dump_tensor_data`.
Where a level holds several candidates (dump folders, devices, ranks) the newest dump folder and the
first device/rank are read, and `meta["other_candidates"]` lists the others.
"""

from __future__ import annotations

import os
import re
from pathlib import Path

from workbench.core.files import MANIFEST_NAME, MODEL_TREE_NAME
from workbench.formats import atb, msit_torch, msprobe
from workbench.formats.model import Dump, DumpError
from workbench.formats.scan import list_dir

_DUMP_DIR_RE = re.compile(r"^(msit_dump|ait_dump)")
_ATB_DEV_RE = re.compile(r"^\d+_\d+$")
_MAX_UP = 32


def open_dump(path: str | Path) -> Dump:
    """Detect the format of a dump folder (any level users pass to msit/msprobe) and read it."""
    p = Path(path).expanduser()
    if not p.exists():
        raise DumpError(p, "no such file or folder")
    p = p.resolve()
    if p.is_file():
        if p.name in (MODEL_TREE_NAME, "dump.json", MANIFEST_NAME):
            p = p.parent
        else:
            raise DumpError(p, "is a file, not a dump folder (pass the folder that holds the dump)")
    if not os.access(p, os.R_OK | os.X_OK):
        raise DumpError(p, "cannot list folder: permission denied")
    dump = _open_msprobe(p) or _open_torch(p) or _open_atb(p)
    if dump is None:
        raise DumpError(
            p,
            "not a dump: found no model_tree.json or token folders (msit torch), "
            "tensors/{dev}_{pid} (ATB) or step*/rank*/dump.json (msprobe)",
        )
    return dump


def _subdirs(p: Path) -> list[Path]:
    try:
        return [Path(e.path) for e in list_dir(p) if e.is_dir]
    except DumpError:
        return []


def _dump_dirs(p: Path) -> list[Path]:
    """`msit_dump_*`/`ait_dump*` folders below p, newest (by timestamp name) first."""
    return sorted((d for d in _subdirs(p) if _DUMP_DIR_RE.match(d.name)), key=lambda d: d.name, reverse=True)


def _note_others(dump: Dump, chosen: Path, candidates: list[Path]) -> Dump:
    others = [str(c) for c in candidates if c != chosen]
    if others:
        dump.meta["other_candidates"] = others
    return dump


# ---------------------------------------------------------------------------------------------- msprobe


def _open_msprobe(p: Path) -> Dump | None:
    if p.name == "dump_tensor_data" and msprobe.is_msprobe_rank_dir(p.parent):
        p = p.parent
    ranks = msprobe.find_rank_dirs(p)
    if not ranks:
        return None
    return msprobe.read_msprobe(ranks, root=p)


# ---------------------------------------------------------------------------------------------- torch


def _torch_dev_dirs(p: Path) -> list[Path]:
    return [d for d in _subdirs(p) if msit_torch.is_torch_device_dir(d)]


def _open_torch(p: Path) -> Dump | None:
    if msit_torch.is_torch_device_dir(p):
        return msit_torch.read_msit_torch(p)
    if p.name.isdigit() and msit_torch.is_torch_device_dir(p.parent):
        return msit_torch.read_msit_torch(p.parent, token=int(p.name), root=p)
    if p.parent.name.isdigit() and msit_torch.is_torch_device_dir(p.parent.parent):
        return msit_torch.read_msit_torch(p.parent.parent, token=int(p.parent.name), module=p.name, root=p)
    candidates: list[Path] = []
    if p.name == "torch_tensors":
        candidates = _torch_dev_dirs(p)
    elif (p / "torch_tensors").is_dir():
        candidates = _torch_dev_dirs(p / "torch_tensors")
    else:
        for d in _dump_dirs(p):
            if (d / "torch_tensors").is_dir() and not (d / "tensors").is_dir():
                candidates = _torch_dev_dirs(d / "torch_tensors")
                if candidates:
                    break
    if not candidates:
        return None
    dump = msit_torch.read_msit_torch(candidates[0])
    return _note_others(dump, candidates[0], candidates)


# ---------------------------------------------------------------------------------------------- ATB


def _atb_dev_dirs(tensors: Path) -> list[Path]:
    return [d for d in _subdirs(tensors) if _ATB_DEV_RE.match(d.name)]


def _open_atb(p: Path) -> Dump | None:
    if atb.is_atb_device_dir(p):
        return atb.read_atb(p.parent.parent, p)
    # an execute-count folder, an op folder at any depth, or before/after inside one
    parts: list[str] = []
    cur = p
    for _ in range(_MAX_UP):
        if cur.parent == cur:
            break
        if cur.name.isdigit() and atb.is_atb_device_dir(cur.parent):
            dev = cur.parent
            ops = [x for x in reversed(parts) if x not in ("before", "after")]
            op_rel = "/".join(ops) or None
            return atb.read_atb(dev.parent.parent, dev, count_folder=cur.name, op_rel=op_rel, root=p)
        parts.append(cur.name)
        cur = cur.parent
    candidates: list[Path] = []
    dump_root = p
    if p.name == "tensors":
        candidates, dump_root = _atb_dev_dirs(p), p.parent
    elif (p / "tensors").is_dir():
        candidates = _atb_dev_dirs(p / "tensors")
    else:
        for d in _dump_dirs(p):
            if (d / "tensors").is_dir():
                candidates, dump_root = _atb_dev_dirs(d / "tensors"), d
                if candidates:
                    break
    if not candidates:
        return None
    dump = atb.read_atb(dump_root, candidates[0])
    return _note_others(dump, candidates[0], candidates)
