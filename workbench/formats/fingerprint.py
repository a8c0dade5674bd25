"""A dump folder's content identity without reading it: a digest of every file's relative path, size and mtime.

The catalog keys a run by it (a dump ingested again with the same fingerprint is not ingested twice). Light to import
(standard library only), so a compare worker computes it while the compare's own process reads the dumps: it stats
every file of the dump, ~14 us a file in Python (0.19 s for a 13,000-file dump).
"""

from __future__ import annotations

import hashlib
import os
from pathlib import Path


def dump_fingerprint(root: str | Path) -> str:
    """Digest of every file's relative path, size and mtime below `root` (content identity without reading)."""
    entries: list[str] = []
    base = len(os.path.join(str(root), ""))  # entry paths start with root + separator: cut, not relpath (slow)
    stack = [str(root)]  # plain strings: a Path per folder was a third of the walk's CPU
    while stack:
        cur = stack.pop()
        try:
            with os.scandir(cur) as it:
                for e in it:
                    try:
                        if e.is_dir(follow_symlinks=False):
                            stack.append(e.path)
                        else:
                            st = e.stat()
                            entries.append(f"{e.path[base:]}\0{st.st_size}\0{st.st_mtime_ns}")
                    except OSError:
                        entries.append(f"{e.path[base:]}\0unreadable")
        except OSError:
            entries.append(f"{os.path.relpath(cur, root)}\0unreadable-dir")
    entries.sort()
    entries.append("")  # every line ends with a newline
    return hashlib.sha256("\n".join(entries).encode("utf-8", "surrogateescape")).hexdigest()[:32]


def run_fingerprint(root: str | Path) -> str:
    """The catalog's key of a run at `root`: `dump_fingerprint` of a folder, a digest of the path of anything else
    (a dump given as one file)."""
    if Path(root).is_dir():
        return dump_fingerprint(root)
    return hashlib.sha256(str(root).encode()).hexdigest()[:32]
