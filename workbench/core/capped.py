"""Reading a file whole: only a regular file, never more than the cap of its kind (docs/security.md has the table).

`-mf /dev/zero`, a FIFO or a sparse 6 GB `op_param.json` must end in one line naming the file and the limit,
not in a read that takes all memory or never returns. Every whole-file read of `wb` goes through here;
readers that stream (CSV, JSONL) open through `open_capped`, which checks the same before the first byte.
"""

from __future__ import annotations

import os
import stat
from pathlib import Path
from typing import IO, NamedTuple

KiB = 1 << 10
MiB = 1 << 20
GiB = 1 << 30


class Cap(NamedTuple):
    """A kind of file and the most bytes `wb` reads of one."""

    kind: str
    limit: int


# one row per kind of file; docs/security.md lists them
DUMP_JSON = Cap("dump JSON file", 256 * MiB)  # model_tree.json, wb_manifest.json, ATB model/layer JSONs, dump.json
OP_PARAM = Cap("op_param.json", 16 * MiB)  # one ATB op's parameters (a few hundred bytes in practice)
STATISTICS = Cap("statistics CSV", 1 * GiB)  # msit statistics.csv, msprobe ATB statistic.csv (streamed)
MAPPING = Cap("mapping file", 512 * MiB)  # -mf: a million explicit pairs are ~100 MB
THRESHOLDS = Cap("thresholds file", 1 * MiB)  # --thresholds TOML
RESULTS = Cap("results file", 8 * GiB)  # wb badcase -gp/-mp CSV or JSONL (streamed, never held whole)
SQL_FILE = Cap("SQL file", 1 * MiB)  # wb query FILE.sql, saved queries
THEME = Cap("theme file", 1 * MiB)  # themes/*.toml
ATTACHED = Cap("--attach file", 1 * GiB)  # wb query --attach CSV/Parquet/JSON (loaded into memory)


class FileRefused(Exception):
    """A file `wb` will not read: not a regular file, or over its cap. `str()` is the one line to print."""

    def __init__(self, path: str | Path, reason: str) -> None:
        super().__init__(f"{path}: {reason}")
        self.path = str(path)
        self.reason = reason


def size_text(n: int) -> str:
    """`n` bytes as the caps are written: 16 MiB, 1 GiB, 512 KiB, 12 bytes."""
    for unit, name in ((GiB, "GiB"), (MiB, "MiB"), (KiB, "KiB")):
        if n >= unit and n % unit == 0:
            return f"{n // unit} {name}"
    return f"{n} bytes"


def _what(mode: int) -> str:
    if stat.S_ISDIR(mode):
        return "a folder"
    if stat.S_ISFIFO(mode):
        return "a FIFO"
    if stat.S_ISCHR(mode):
        return "a character device"
    if stat.S_ISBLK(mode):
        return "a block device"
    if stat.S_ISSOCK(mode):
        return "a socket"
    return "not a regular file"


def _check(path: str | Path, st: os.stat_result, cap: Cap) -> None:
    if not stat.S_ISREG(st.st_mode):
        raise FileRefused(path, f"{cap.kind} is {_what(st.st_mode)}, not a regular file: not read")
    if st.st_size > cap.limit:
        raise FileRefused(path, f"{cap.kind} of {st.st_size} bytes is over the {size_text(cap.limit)} limit: not read")


def check_regular(path: str | Path, kind: str) -> None:
    """`FileRefused` when `path` exists but is not a regular file (a FIFO would block whoever opens it); for
    files that are not read whole (a DuckDB catalog). `OSError` when it cannot be looked at."""
    st = os.stat(path)
    if not stat.S_ISREG(st.st_mode):
        raise FileRefused(path, f"{kind} is {_what(st.st_mode)}, not a regular file: not read")


def check_file(path: str | Path, cap: Cap) -> int:
    """The size of `path` when it is a regular file within `cap`; `FileRefused` otherwise (`OSError` when it
    cannot be looked at). For readers that open the file themselves (DuckDB)."""
    st = os.stat(path)
    _check(path, st, cap)
    return st.st_size


def open_capped(path: str | Path, cap: Cap, *, encoding: str | None = None, newline: str | None = None) -> IO[str]:
    """`path` open for text reading, checked as `check_file` on the opened file (no FIFO open blocks)."""
    return os.fdopen(_open(path, cap), "r", encoding=encoding or "utf-8", newline=newline)


def _open(path: str | Path, cap: Cap) -> int:
    fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK)  # a FIFO without a writer opens at once, then is refused
    try:
        _check(path, os.fstat(fd), cap)
        os.set_blocking(fd, True)
    except BaseException:
        os.close(fd)
        raise
    return fd


def read_bytes(path: str | Path, cap: Cap) -> bytes:
    """The whole of a regular file within `cap` (a file growing past the cap while read is refused too);
    `FileRefused` or `OSError` otherwise."""
    with os.fdopen(_open(path, cap), "rb") as fh:
        data = fh.read(cap.limit + 1)
    if len(data) > cap.limit:
        raise FileRefused(path, f"{cap.kind} is over the {size_text(cap.limit)} limit: not read")
    return data


def read_text(path: str | Path, cap: Cap, encoding: str = "utf-8") -> str:
    """`read_bytes` decoded (`UnicodeDecodeError` when it is not `encoding`)."""
    return read_bytes(path, cap).decode(encoding)
