"""Output folders a command owns: it replaces only what it created there before, never the user's files.

`claim(folder, command)` accepts an empty or missing folder, or one holding a marker (`.wb_<command>.json`)
that lists what an earlier run of the same command created; anything else is refused with one line. On an
earlier output it removes exactly the files the marker lists, and refuses (naming the file) when something
else sits inside what it would replace; the user's other entries beside them stay. `seal` records, at the
end, every file the command created, so the next run can replace them.
"""

from __future__ import annotations

import json
import os
from pathlib import Path

MAX_MARKER_BYTES = 64 << 20


class OwnedFolderError(ValueError):
    """Why a command will not write into a folder; one line naming the folder or the file in the way."""


def marker_path(folder: Path, command: str) -> Path:
    """The marker of `command`'s output in `folder`."""
    return folder / f".wb_{command}.json"


def _plain_name(name: object) -> bool:
    return isinstance(name, str) and name not in ("", ".", "..") and "/" not in name and "\0" not in name


def _inside(rel: object) -> bool:
    if not isinstance(rel, str) or not rel or rel.startswith("/") or "\0" in rel:
        return False
    return all(part not in ("", ".", "..") for part in rel.split("/"))


def _read_marker(path: Path) -> tuple[list[str], set[str] | None]:
    """(top-level entries created, files created or None when the run did not finish)."""
    try:
        if not path.is_file() or path.is_symlink() or path.stat().st_size > MAX_MARKER_BYTES:
            raise ValueError("not a regular file of a sensible size")
        data = json.loads(path.read_text(encoding="utf-8"))
        created, files = data["created"], data["files"]
        if not isinstance(created, list) or not all(_plain_name(n) for n in created):
            raise ValueError("'created' is not a list of names")
        if files is not None and (not isinstance(files, list) or not all(_inside(f) for f in files)):
            raise ValueError("'files' is not a list of relative paths")
    except (OSError, ValueError, KeyError, TypeError) as exc:
        raise OwnedFolderError(f"{path}: not a record wb wrote ({exc}); choose another output folder") from None
    return list(created), None if files is None else set(files)


def _files_under(folder: Path, name: str) -> list[str]:
    """Every file, link and folder below `folder/name` (relative to `folder`, links not followed), deepest first."""
    top = folder / name
    if top.is_symlink() or not top.is_dir():
        return [name] if os.path.lexists(top) else []
    out: list[str] = []
    for root, dirs, files in os.walk(top, topdown=False, followlinks=False):
        rel_root = os.path.relpath(root, folder)
        out.extend(f"{rel_root}/{f}" for f in files)
        out.extend(f"{rel_root}/{d}" for d in dirs if os.path.islink(os.path.join(root, d)))
        out.append(rel_root)
    return out


def _remove(folder: Path, rels: list[str]) -> None:
    for rel in rels:  # deepest first: a folder comes after what it holds
        p = folder / rel
        if p.is_dir() and not p.is_symlink():
            p.rmdir()  # empty by now, or OSError: something appeared meanwhile, and it stays
        else:
            p.unlink()


def claim(folder: Path, command: str, creates: list[str]) -> set[str]:
    """Make `folder` ready for `command`'s output (`creates`: the entries it will make, recorded before anything
    is written); returns the entries that were there already and stay. `OwnedFolderError` when it is not
    the command's to write."""
    marker = marker_path(folder, command)
    if folder.exists() and not folder.is_dir():
        raise OwnedFolderError(f"{folder}: exists and is not a folder")
    present = sorted(os.listdir(folder)) if folder.is_dir() else []
    if present and not os.path.lexists(marker):
        raise OwnedFolderError(
            f"{folder}: not empty and not an earlier `wb {command}` output (no {marker.name}); "
            "choose another folder, nothing was changed"
        )
    if present:
        created, files = _read_marker(marker)
        doomed: list[str] = []
        for name in created:
            wal = f"{name}.wal"  # DuckDB's log of a catalog the earlier run created
            for rel in [*_files_under(folder, name), *(_files_under(folder, wal) if wal not in created else [])]:
                if files is not None and rel not in files and not rel.startswith(wal):
                    raise OwnedFolderError(
                        f"{folder / rel}: not written by the earlier `wb {command}`; move it away or choose "
                        "another folder, nothing was changed"
                    )
                doomed.append(rel)
        try:
            _remove(folder, doomed)
        except OSError as exc:
            raise OwnedFolderError(f"{folder}: cannot replace the earlier output ({exc})") from None
    folder.mkdir(parents=True, exist_ok=True)
    kept = {n for n in os.listdir(folder) if n != marker.name}
    _write(marker, sorted(set(creates) - kept), None)
    return kept


def seal(folder: Path, command: str, kept: set[str]) -> None:
    """Record every file `command` created in `folder` (all but `kept`, what `claim` found there)."""
    marker = marker_path(folder, command)
    created = sorted(n for n in os.listdir(folder) if n != marker.name and n not in kept)
    files = sorted(rel for name in created for rel in _files_under(folder, name))
    _write(marker, created, files)


def _write(marker: Path, created: list[str], files: list[str] | None) -> None:
    tmp = marker.with_name(marker.name + ".tmp")
    tmp.write_text(json.dumps({"created": created, "files": files}, indent=0), encoding="utf-8")
    os.replace(tmp, marker)


def check_replaceable(path: Path, header: str, command: str) -> None:
    """`OwnedFolderError` unless `path` is missing or an earlier output of `command` (a regular file starting with
    our CSV `header`): a file wb did not write is never overwritten."""
    if not os.path.lexists(path):
        return
    if path.is_symlink() or not path.is_file():
        raise OwnedFolderError(f"{path}: exists and is not a regular file; not overwritten")
    try:
        with open(path, "rb") as fh:
            first = fh.read(len(header.encode()) + 2)
    except OSError as exc:
        raise OwnedFolderError(f"{path}: exists and cannot be read ({exc.strerror or exc}); not overwritten") from None
    if first.split(b"\n", 1)[0].rstrip(b"\r") != header.encode():
        raise OwnedFolderError(
            f"{path}: exists and is not an earlier `wb {command}` output; not overwritten (choose another name)"
        )
