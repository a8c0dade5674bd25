"""`open_dump`: find out what kind of dump a path is (and at which level) and read it.

Accepted levels, as users pass them to msit/msprobe:
- msit torch: the folder above `msit_dump_*`, `msit_dump_*`, `torch_tensors/`, `torch_tensors/{dev}_{pid}`,
  one token folder `{dev}_{pid}/{n}` (that token only), one module folder (that module and its submodules);
- ATB: the folder above `msit_dump_*`, `msit_dump_*`, `tensors/`, `tensors/{dev}_{pid}`, one execute-count
  folder, one op folder at any depth (that op subtree), or its `before`/`after` folder;
- msprobe: the dump path (`step*/` below it), `step{N}`, `step{N}/rank{R}`, or its `dump_tensor_data`;
- msprobe's ATB probe: its `--output` folder, `atb_dump_data`, `atb_dump_data/data`, `data/{dev}_{pid}`, one
  execution-count folder `{dev}_{pid}/{n}` (the level `msprobe compare -m atb` takes), or its `statistic.csv`.
- TorchAir GE: the folder above `msit_ge_dump`, `msit_ge_dump` (graph text files in it), one
  `worldsize{N}_global_rank{R}` below it; TorchAir FX: the folder above `msit_fx_dump`, `msit_fx_dump`, one rank
  folder, `data_dump` (PTA 7.1 and older).
Where a level holds several candidates (dump folders, devices, ranks) the newest dump folder and the
first device/rank are read, and `meta["other_candidates"]` lists the others.
"""

from __future__ import annotations

import dataclasses
import functools
import os
import re
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from workbench.core.files import ATB_PROBE_DUMP_DIR, ATB_PROBE_STATS_FILE, MANIFEST_NAME, MODEL_TREE_NAME
from workbench.core.text import ascii_int, has_foreign_digit, storable

# msprobe and msit torch dumps are looked for first and their readers loaded here; the ATB and TorchAir readers
# load where a path is not one of those (they cost a compare of msit dumps ~10 ms of start-up otherwise)
from workbench.formats import msit_torch, msprobe
from workbench.formats.model import Dump, DumpError, token_number
from workbench.formats.scan import confined, list_dir

_DUMP_DIR_RE = re.compile(r"^(msit_dump|ait_dump)")
_ATB_DEV_RE = re.compile(r"[0-9]+_[0-9]+")
_MAX_UP = 32


def open_dump(path: str | Path, *, follow_symlinks: bool = False) -> Dump:
    """Detect the format of a dump folder (any level users pass to msit/msprobe) and read it.

    Symbolic links to folders are never followed; links to files outside the dump only with
    `follow_symlinks`. A file name DuckDB cannot store (not UTF-8) becomes an unusable entry with a problem line.
    """
    p = Path(path).expanduser()
    if not p.exists():
        raise DumpError(p, "no such file or folder")
    p = p.resolve()
    if p.is_file():
        if p.name in (MODEL_TREE_NAME, "dump.json", MANIFEST_NAME, ATB_PROBE_STATS_FILE):
            p = p.parent
        else:
            raise DumpError(p, "is a file, not a dump folder (pass the folder that holds the dump)")
    if not os.access(p, os.R_OK | os.X_OK):
        raise DumpError(p, "cannot list folder: permission denied")
    if storable(str(p)) != str(p):
        raise DumpError(p, "folder name is not valid UTF-8: rename it (or link it under a UTF-8 name)")
    with confined(None if follow_symlinks else _anchor(p)):
        dump = _open_msprobe(p) or _open_torch(p) or _open_atb_csv(p) or _open_atb(p) or _open_torchair(p)
    if dump is None:
        raise DumpError(
            p,
            "not a dump: found no model_tree.json or token folders (msit torch), "
            "tensors/{dev}_{pid} (ATB), step*/rank*/dump.json (msprobe) or data/{dev}_{pid}/{n}/statistic.csv "
            "(msprobe's ATB probe), dynamo_original_graph_*.txt (TorchAir GE) or {token}/*.INPUT.0.*.npy (TorchAir FX)",
        )
    return _storable_names(dump)


def _anchor(p: Path) -> Path:
    """The whole dump a path lies in (its `msit_dump_*` folder, or the folder above msprobe's `step*`): links
    between its files are followed, links leaving it are not."""
    for a in [p, *list(p.parents)[:6]]:
        if _DUMP_DIR_RE.match(a.name):
            return a
        if re.fullmatch(r"step[0-9]+", a.name):
            return a.parent
        if a.name == ATB_PROBE_DUMP_DIR:
            return a
    return p


def _storable_names(dump: Dump) -> Dump:
    """Names DuckDB cannot store (undecodable bytes in a file or folder name) escaped; such a file is not read."""
    paths = "\0".join(t.path or "" for t in dump.tensors)
    names = "\0".join(n.name for n in dump.nodes)
    dump.problems = [storable(x) for x in dump.problems]
    if storable(paths) is paths and storable(names) is names:
        return dump
    for n in dump.nodes:
        n.name, n.type = storable(n.name), storable(n.type)
        n.parent = storable(n.parent) if n.parent is not None else None
    tensors = []
    for t in dump.tensors:
        node, path = storable(t.node), storable(t.path) if t.path is not None else None
        if path != t.path:
            dump.problems.append(f"{path}: file name is not valid UTF-8: not read (rename it)")
            t = dataclasses.replace(t, node=node, path=path, error="file name is not valid UTF-8")
        elif node != t.node:
            t = dataclasses.replace(t, node=node)
        tensors.append(t)
    dump.tensors = tensors
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
    return _refuse_foreign(dump, {c.parent for c in candidates})


def _refuse_foreign(dump: Dump, parents: set[Path]) -> Dump:
    """One problem line per folder beside the device, rank or step folders whose name holds a digit that is not
    ASCII (`npu١_2`, `step٣`): it is not read, and never passes for the number it looks like."""
    for parent in sorted(parents):
        for d in _subdirs(parent):
            if has_foreign_digit(d.name):
                dump.problems.append(_FOREIGN.format(d))
    return dump


_FOREIGN = "{}: folder name holds a digit that is not ASCII: not read"


# ---------------------------------------------------------------------------------------------- msprobe


def _open_msprobe(p: Path) -> Dump | None:
    if p.name == "dump_tensor_data" and msprobe.is_msprobe_rank_dir(p.parent):
        p = p.parent
    ranks = msprobe.find_rank_dirs(p)
    if not ranks:
        return None
    steps = {d.parent for _s, d in ranks if re.fullmatch(r"step[0-9]+", d.parent.name)}
    return _refuse_foreign(msprobe.read_msprobe(ranks, root=p), steps | {s.parent for s in steps})


# ---------------------------------------------------------------------------------------------- torch


def _torch_dev_dirs(p: Path) -> list[Path]:
    return [d for d in _subdirs(p) if not has_foreign_digit(d.name) and msit_torch.is_torch_device_dir(d)]


def _open_torch(p: Path) -> Dump | None:
    if msit_torch.is_torch_device_dir(p):
        return msit_torch.read_msit_torch(p)
    tok, parent_tok = token_number(p.name), token_number(p.parent.name)
    if tok is not None and msit_torch.is_torch_device_dir(p.parent):
        return msit_torch.read_msit_torch(p.parent, token=tok, root=p)
    if parent_tok is not None and msit_torch.is_torch_device_dir(p.parent.parent):
        return msit_torch.read_msit_torch(p.parent.parent, token=parent_tok, module=p.name, root=p)
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


# ---------------------------------------------------------------------------------------------- msprobe's ATB probe


def _open_atb_csv(p: Path) -> Dump | None:
    from workbench.formats import atb_csv

    if (p / atb_csv.STATS_FILE).is_file() and atb_csv.is_device_dir(p.parent):
        return atb_csv.read_atb_csv(p.parent, count_folder=p.name, root=p)
    if atb_csv.is_device_dir(p):
        return atb_csv.read_atb_csv(p)
    candidates = atb_csv.device_dirs(p)
    if not candidates:
        return None
    return _note_others(atb_csv.read_atb_csv(candidates[0]), candidates[0], candidates)


# ---------------------------------------------------------------------------------------------- ATB


def _atb_dev_dirs(tensors: Path) -> list[Path]:
    return [d for d in _subdirs(tensors) if _ATB_DEV_RE.fullmatch(d.name)]


def _open_atb(p: Path) -> Dump | None:
    from workbench.formats import atb

    if atb.is_atb_device_dir(p):
        return atb.read_atb(p.parent.parent, p)
    # an execute-count folder, an op folder at any depth, or before/after inside one
    parts: list[str] = []
    cur = p
    for _ in range(_MAX_UP):
        if cur.parent == cur:
            break
        if token_number(cur.name) is not None and atb.is_atb_device_dir(cur.parent):
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


# ---------------------------------------------------------------------------------------------- TorchAir


def _open_torchair(p: Path) -> Dump | None:
    """A GE dump (graph text files + GE dump files) or an FX dump (`.npy` per aten node), at the levels msit
    takes: the folder above `msit_ge_dump`/`msit_fx_dump`, that folder, one `worldsize{N}_global_rank{R}`."""
    from workbench.formats import fx_dump, ge_run, torchair

    for sub in (p / torchair.GE_DUMP_DIR, p):
        if sub.is_dir() and ge_run.is_ge_dir(sub):
            return ge_run.read_ge(sub, root=p)
    for sub in (p / torchair.FX_DUMP_DIR, p):
        ranks = torchair.rank_dirs(sub) if sub.is_dir() else []
        if ranks and fx_dump.is_fx_dir(ranks[0]):
            return _note_others(fx_dump.read_fx(ranks[0], root=p), ranks[0], ranks)
        if sub.is_dir() and fx_dump.is_fx_dir(sub):
            return fx_dump.read_fx(sub, root=p)
    return None


# ---------------------------------------------------------------------------------------------- ranks

_DEV_ID_RE = re.compile(r"(?:[a-z]+)?([0-9]+)_[0-9]+")  # npu3_1234, cuda0_77, 3_1234 (ATB); cpu_123 has none


@dataclass(frozen=True)
class RankDump:
    """One rank (process, device) of a multi-rank dump: its id where the folder names one, and how to read it."""

    rank: int | None
    label: str  # the folder: npu3_1234, rank3, 0_4321
    path: Path
    open: Callable[[], Dump]


def find_ranks(path: str | Path, problems: list[str] | None = None) -> list[RankDump]:
    """The ranks below a dump path that holds several (tensor parallelism writes one folder per process):
    msit `torch_tensors/{dev}_{pid}`, ATB `tensors/{dev}_{pid}`, msprobe `step*/rank{N}`, msprobe's ATB probe
    `atb_dump_data/data/{dev}_{pid}`, TorchAir `worldsize{N}_global_rank{R}`; [] for one rank. A folder beside
    them whose name holds a digit that is not ASCII (`npu١_2`) is no rank: one line each in `problems` (where there
    are several ranks)."""
    p = Path(path).expanduser()
    if not p.is_dir():
        return []
    p = p.resolve()
    found = _msprobe_ranks(p) or _torch_ranks(p) or _atb_csv_ranks(p) or _atb_ranks(p) or _torchair_ranks(p)
    refused = sorted({d for r in found for d in _subdirs(r.path.parent) if has_foreign_digit(d.name)})
    found = [r for r in found if r.path not in refused]
    if len(found) < 2:
        return []  # one rank: `open_dump` reads it and says what it refused
    if problems is not None:
        problems += [_FOREIGN.format(d) for d in refused]
    return found


def _dev_id(name: str) -> int | None:
    m = _DEV_ID_RE.fullmatch(name)
    return int(m.group(1)) if m else None


def _msprobe_ranks(p: Path) -> list[RankDump]:
    if msprobe.is_msprobe_rank_dir(p) or p.name == "dump_tensor_data":
        return []
    by_rank = msprobe.find_all_rank_dirs(p)
    out = []
    for name, dirs in sorted(by_rank.items(), key=lambda kv: (len(kv[0]), kv[0])):
        digits = name.removeprefix("rank")
        out.append(
            RankDump(
                ascii_int(digits),
                name,
                dirs[0][1],
                functools.partial(msprobe.read_msprobe, dirs, root=dirs[0][1]),
            )
        )
    return out


def _torch_ranks(p: Path) -> list[RankDump]:
    if msit_torch.is_torch_device_dir(p):
        return []
    tt = p if p.name == "torch_tensors" else p / "torch_tensors"
    if not tt.is_dir():
        tt = next((d / "torch_tensors" for d in _dump_dirs(p) if (d / "torch_tensors").is_dir()), tt)
    devs = _torch_dev_dirs(tt) if tt.is_dir() else []
    return [RankDump(_dev_id(d.name), d.name, d, functools.partial(msit_torch.read_msit_torch, d)) for d in devs]


def _atb_csv_ranks(p: Path) -> list[RankDump]:
    from workbench.formats import atb_csv

    if atb_csv.is_device_dir(p):
        return []
    devs = atb_csv.device_dirs(p)
    return [RankDump(_dev_id(d.name), d.name, d, functools.partial(atb_csv.read_atb_csv, d)) for d in devs]


def _atb_ranks(p: Path) -> list[RankDump]:
    from workbench.formats import atb

    if atb.is_atb_device_dir(p):
        return []
    if p.name == "tensors":
        tensors, root = p, p.parent
    elif (p / "tensors").is_dir():
        tensors, root = p / "tensors", p
    else:
        d = next((d for d in _dump_dirs(p) if (d / "tensors").is_dir()), None)
        if d is None:
            return []
        tensors, root = d / "tensors", d
    devs = _atb_dev_dirs(tensors)
    return [RankDump(_dev_id(d.name), d.name, d, functools.partial(atb.read_atb, root, d)) for d in devs]


def _torchair_ranks(p: Path) -> list[RankDump]:
    """TorchAir rank folders (`worldsize{N}_global_rank{R}`) of a GE dump (graphs beside them) or an FX dump."""
    from workbench.formats import fx_dump, ge_run, torchair

    if torchair.rank_of(p.name) is not None:
        return []
    for sub in (p / torchair.GE_DUMP_DIR, p):
        if sub.is_dir() and torchair.graph_files(sub):
            return [
                RankDump(torchair.rank_of(d.name), d.name, d, functools.partial(ge_run.read_ge, d))
                for d in torchair.rank_dirs(sub)
            ]
    for sub in (p / torchair.FX_DUMP_DIR, p):
        if sub.is_dir():
            found = [d for d in torchair.rank_dirs(sub) if fx_dump.is_fx_dir(d)]
            if found:
                return [
                    RankDump(torchair.rank_of(d.name), d.name, d, functools.partial(fx_dump.read_fx, d)) for d in found
                ]
    return []


def pair_ranks(golden: list[RankDump], test: list[RankDump]) -> list[tuple[RankDump, RankDump]]:
    """Golden and test ranks paired by device/rank id when both sides name the same ids, else in order
    (ids, then folder names); extra ranks on one side stay unpaired."""
    g_ids, t_ids = [r.rank for r in golden], [r.rank for r in test]
    if None not in g_ids and None not in t_ids and set(g_ids) == set(t_ids) and len(set(g_ids)) == len(g_ids):
        by_id = {r.rank: r for r in test}
        return [(g, by_id[g.rank]) for g in sorted(golden, key=lambda r: r.rank or 0)]

    def order(r: RankDump) -> tuple[bool, int, int, str]:  # cpu_{pid}: processes by pid (rank 0 starts first)
        tail = r.label.rsplit("_", 1)[-1]
        return (r.rank is None, r.rank or 0, ascii_int(tail) or 0, r.label)

    return list(zip(sorted(golden, key=order), sorted(test, key=order)))
