"""Find things of a comparison in the catalog: the golden node by name or id and its test counterpart, whether it
holds pairs compared on statistics only, the advisor's highest-scored op inside a node, whether a table exists."""

from __future__ import annotations

from dataclasses import dataclass

import duckdb


def has_table(con: duckdb.DuckDBPyConnection, name: str) -> bool:
    """Whether the catalog has table `name` (one written by a later version, `advice` or `token_status`, is
    missing from a catalog an older `wb` wrote)."""
    row = con.execute("SELECT count(*) FROM duckdb_tables() WHERE table_name = ?", [name]).fetchone()
    return bool(row and row[0])


class NodeLookupError(ValueError):
    """The comparison or the op is not in the catalog; the message says which."""


def compared_node(
    con: duckdb.DuckDBPyConnection, cmp_id: int, golden_node: int | str, token: int, side: str = "test"
) -> tuple[int, int]:
    """(run_id, node_id) of the `side` op of comparison `cmp_id`'s golden node (a name or a node id) at `token`.

    The test side is the op compared at that token (`node_results`: an ATB decode graph has other ops than the
    prefill graph), else the node paired with it (`node_matches`)."""
    row = con.execute("SELECT golden_run, test_run FROM comparisons WHERE cmp_id = ?", [cmp_id]).fetchone()
    if row is None:
        raise NodeLookupError(f"no comparison {cmp_id} in the catalog")
    golden_run, test_run = int(row[0]), int(row[1])
    if isinstance(golden_node, str):
        found = con.execute(
            "SELECT node_id FROM nodes WHERE run_id = ? AND name = ?", [golden_run, golden_node]
        ).fetchone()
        if found is None:
            raise NodeLookupError(f"no golden node {golden_node!r} in comparison {cmp_id}")
        gid = int(found[0])
    else:
        gid = int(golden_node)
    if side != "test":
        return golden_run, gid
    found = (
        con.execute(
            "SELECT test_node_id FROM node_results WHERE cmp_id = ? AND token_id = ? AND golden_node_id = ? "
            "AND test_node_id IS NOT NULL",
            [cmp_id, token, gid],
        ).fetchone()
        or con.execute(
            "SELECT test_node_id FROM node_matches WHERE cmp_id = ? AND golden_node_id = ? LIMIT 1", [cmp_id, gid]
        ).fetchone()
    )
    if found is None:
        raise NodeLookupError("the op has no counterpart on the test side (pair it in the mapping editor)")
    return test_run, int(found[0])


def resolve_comparison(con: duckdb.DuckDBPyConnection, cmp_id: int | None, catalog: object) -> int:
    """`cmp_id` when the catalog holds it, else (None) the newest comparison; NodeLookupError naming `catalog`."""
    if cmp_id is None:
        row = con.execute("SELECT max(cmp_id) FROM comparisons").fetchone()
        if row is None or row[0] is None:
            raise NodeLookupError(f"{catalog}: no comparison in this catalog (run `wb compare` first)")
        return int(row[0])
    if con.execute("SELECT 1 FROM comparisons WHERE cmp_id = ?", [cmp_id]).fetchone() is None:
        raise NodeLookupError(f"{catalog}: no comparison {cmp_id} (see `wb query 'SELECT * FROM comparisons'`)")
    return cmp_id


def has_statistics_only_pairs(con: duckdb.DuckDBPyConnection, cmp_id: int) -> bool:
    """Whether comparison `cmp_id` holds pairs without tensor metrics (compared on statistics only): ~1 ms, where
    the queries that read their statistics cost a join over every pair."""
    rows = con.execute(  # fetched whole: DuckDB 2 keeps a half-read result open on the connection
        "SELECT EXISTS (SELECT 1 FROM metrics WHERE cmp_id = ? "
        "AND relative_euclidean_distance IS NULL AND cosine_similarity IS NULL)",
        [cmp_id],
    ).fetchall()
    return bool(rows and rows[0][0])


def judged_on_statistics_only(con: duckdb.DuckDBPyConnection, cmp_id: int) -> bool:
    """Whether comparison `cmp_id` has computed pairs and none with tensor metrics (statistics-only dumps): every
    error it holds is a lower bound (`stat_rel_euclid_bound`)."""
    rows = con.execute(
        "SELECT EXISTS (SELECT 1 FROM metrics WHERE cmp_id = ?) "
        "AND NOT EXISTS (SELECT 1 FROM metrics WHERE cmp_id = ? "
        "AND (relative_euclidean_distance IS NOT NULL OR cosine_similarity IS NOT NULL))",
        [cmp_id, cmp_id],
    ).fetchall()
    return bool(rows and rows[0][0])


@dataclass(frozen=True, slots=True)
class InsideOrigin:
    """The op the advisor scores highest inside a node at a token: where a module's error was added when its own
    score (what none of its child ops explains) is low."""

    golden_node_id: int
    name: str
    score: float


def highest_inside(
    con: duckdb.DuckDBPyConnection, cmp_id: int, nodes_by_token: dict[int, int]
) -> dict[int, InsideOrigin]:
    """token -> the highest-scored op strictly inside the given golden node at that token (none where no op inside
    it was ranked)."""
    if not nodes_by_token:
        return {}
    if not has_table(con, "advice"):
        return {}
    rows = con.execute(
        "WITH RECURSIVE sub(token_id, node_id) AS ("
        "  SELECT n.token_id, c.node_id FROM (SELECT unnest(?) AS token_id, unnest(?) AS node_id) n "
        "  JOIN comparisons cm ON cm.cmp_id = ? JOIN nodes c ON c.run_id = cm.golden_run AND c.parent_id = n.node_id "
        "  UNION ALL "
        "  SELECT s.token_id, c.node_id FROM sub s JOIN comparisons cm ON cm.cmp_id = ? "
        "  JOIN nodes c ON c.run_id = cm.golden_run AND c.parent_id = s.node_id) "
        "SELECT a.token_id, a.golden_node_id, n.name, a.score FROM advice a "
        "JOIN sub s ON s.token_id = a.token_id AND s.node_id = a.golden_node_id "
        "JOIN comparisons cm ON cm.cmp_id = a.cmp_id "
        "JOIN nodes n ON n.run_id = cm.golden_run AND n.node_id = a.golden_node_id "
        "WHERE a.cmp_id = ? AND a.score IS NOT NULL ORDER BY a.token_id, a.score DESC, a.rank",
        [list(nodes_by_token), list(nodes_by_token.values()), cmp_id, cmp_id, cmp_id],
    ).fetchall()
    out: dict[int, InsideOrigin] = {}
    for tok, gid, name, score in rows:
        out.setdefault(int(tok), InsideOrigin(int(gid), str(name), float(score)))
    return out
