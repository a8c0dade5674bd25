"""The DuckDB catalog: schema version, incremental and atomic ingest, refusing newer schemas."""

from __future__ import annotations

import hashlib
import os
from pathlib import Path

import duckdb
import pytest

from workbench.catalog.schema import SCHEMA_VERSION
from workbench.catalog.store import CatalogError, first_row, ingest_dump, open_catalog
from workbench.formats.fingerprint import dump_fingerprint
from workbench.formats.model import Dump, Node, TensorEntry, TensorStats


def _dump(root: Path, n_layers: int = 2) -> Dump:
    root.mkdir(parents=True, exist_ok=True)
    (root / "model_tree.json").write_text("{}")
    nodes = [Node("root", "Model", None, 0, 0)]
    tensors = []
    for i in range(n_layers):
        nodes.append(Node(f"root.layers.{i}", "Layer", "root", 1, i + 1, layer=i))
        for tok in range(2):
            tensors.append(
                TensorEntry(tok, f"root.layers.{i}", "out", 0, str(root / f"{tok}/{i}.pth"), "float32", (2, 3))
            )
    tensors.append(TensorEntry(0, "root", "out", 0, None, "float32", (4,), stats=TensorStats(1.0, -1.0, 0.0, 2.0)))
    return Dump(
        "msit_torch",
        root,
        nodes,
        tensors,
        "definition",
        model_name="Tiny",
        meta={"command": ["x"]},
        problems=[f"{root}/bad.pth: empty file"],
    )


def test_ingest_is_incremental_and_complete(tmp_path: Path) -> None:
    cat = tmp_path / "c.duckdb"
    con = open_catalog(cat)
    d = _dump(tmp_path / "d")
    first = ingest_dump(con, d)
    again = ingest_dump(con, d)
    assert not first.skipped and again.skipped and again.run_id == first.run_id
    assert first_row(con.execute("SELECT count(*) FROM runs")) == (1,)
    assert first_row(con.execute("SELECT count(*) FROM tensors")) == (5,)
    row = first_row(
        con.execute(
            "SELECT n.name, n.layer, p.name FROM nodes n JOIN nodes p ON p.run_id = n.run_id "
            "AND p.node_id = n.parent_id WHERE n.name = 'root.layers.1'"
        )
    )
    assert row == ("root.layers.1", 1, "root")
    stats = first_row(con.execute("SELECT min, max, mean, norm, shape FROM tensors WHERE path IS NULL"))
    assert stats == (-1.0, 1.0, 0.0, 2.0, [4])
    assert first_row(con.execute("SELECT problems FROM runs"))[0] == [f"{tmp_path}/d/bad.pth: empty file"]
    # a changed dump is a new run
    (tmp_path / "d" / "extra.txt").write_text("x")
    assert not ingest_dump(con, d).skipped
    con.close()


def test_interrupted_ingest_leaves_catalog_unchanged(tmp_path: Path) -> None:
    cat = tmp_path / "c.duckdb"
    con = open_catalog(cat)
    ingest_dump(con, _dump(tmp_path / "a"))
    bad = _dump(tmp_path / "b")
    # a duplicate node name breaks the nodes insert after the runs row was written, inside the transaction
    bad.nodes.append(Node("root.layers.0", "Layer", "root", 1, 9, layer=0))
    with pytest.raises(Exception):  # noqa: B017 - any failure must roll back
        ingest_dump(con, bad)
    assert first_row(con.execute("SELECT count(*) FROM runs")) == (1,)
    assert first_row(con.execute("SELECT count(DISTINCT run_id) FROM nodes")) == (1,)
    con.close()


def test_newer_schema_is_refused_clearly(tmp_path: Path) -> None:
    cat = tmp_path / "c.duckdb"
    open_catalog(cat).close()
    con = duckdb.connect(str(cat))
    con.execute("UPDATE meta SET value = ? WHERE key = 'schema_version'", [str(SCHEMA_VERSION + 1)])
    con.close()
    with pytest.raises(CatalogError, match="newer than this wb supports") as err:
        open_catalog(cat)
    assert str(cat) in str(err.value)


def test_foreign_files_are_refused(tmp_path: Path) -> None:
    junk = tmp_path / "junk.duckdb"
    junk.write_bytes(b"this is not a database at all" * 10)
    with pytest.raises(CatalogError, match=str(junk)):
        open_catalog(junk)
    with pytest.raises(CatalogError, match="not found"):
        open_catalog(tmp_path / "missing.duckdb", read_only=True)


def test_older_catalog_gains_new_tables_once(tmp_path: Path) -> None:
    """A catalog written before a table existed (no schema digest) gains it on open; an up-to-date one is opened
    without re-running the DDL (its digest matches), and keeps its rows."""
    cat = tmp_path / "c.duckdb"
    con = open_catalog(cat)
    ingest_dump(con, _dump(tmp_path / "d"))
    con.close()
    con = duckdb.connect(str(cat))
    con.execute("DROP TABLE mapping_stale")
    con.execute("DELETE FROM meta WHERE key = 'schema_digest'")  # as an older wb left it
    con.close()
    con = open_catalog(cat)
    try:
        assert first_row(con.execute("SELECT count(*) FROM mapping_stale")) == (0,)
        digest = first_row(con.execute("SELECT value FROM meta WHERE key = 'schema_digest'"))
        assert digest is not None and len(str(digest[0])) == 16
        assert first_row(con.execute("SELECT count(*) FROM runs")) == (1,)
    finally:
        con.close()
    con = open_catalog(cat)  # digest matches: nothing to do, everything still there
    try:
        assert first_row(con.execute("SELECT count(*) FROM runs")) == (1,)
        assert first_row(con.execute("SELECT count(*) FROM comparison")) == (0,)
    finally:
        con.close()


def test_dump_fingerprint_is_the_digest_of_every_file_line(tmp_path: Path) -> None:
    """`runs.fingerprint`: SHA-256 of the sorted `relative path NUL size NUL mtime_ns` lines of every file below the
    dump (nested folders, a name that is not UTF-8 included), each line ending in a newline; 32 hex digits."""
    (tmp_path / "0" / "root.model").mkdir(parents=True)
    (tmp_path / "0" / "root.model" / "output.pth").write_bytes(b"x" * 7)
    (tmp_path / "model_tree.json").write_text("{}")
    odd = os.fsencode(tmp_path) + b"/a\xff\xfeb"
    with open(odd, "wb") as fh:
        fh.write(b"12")
    lines = []
    for folder, _dirs, files in os.walk(os.fsencode(tmp_path)):
        for name in files:
            st = os.stat(os.path.join(folder, name))
            rel = os.path.relpath(os.path.join(folder, name), os.fsencode(tmp_path))
            lines.append(b"%s\0%d\0%d\n" % (rel, st.st_size, st.st_mtime_ns))
    expected = hashlib.sha256(b"".join(sorted(lines))).hexdigest()[:32]
    assert len(lines) == 3 and dump_fingerprint(tmp_path) == expected
