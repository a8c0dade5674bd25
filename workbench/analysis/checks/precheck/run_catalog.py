"""The precheck of a compared node: the op a comparison's golden node pairs with at a token, ATB or torch, as the
app's `p` and `wb precheck --catalog` ask for it."""

from __future__ import annotations

from pathlib import Path

import duckdb

from workbench.analysis.checks.precheck.result import PrecheckResult
from workbench.analysis.checks.precheck.run_atb import precheck_group
from workbench.analysis.checks.precheck.run_torch import precheck_node, precheck_nodes
from workbench.analysis.checks.precheck.torch_inputs import CannotRun, TorchDump
from workbench.analysis.checks.precheck.torch_kernels import checker_key
from workbench.catalog.lookup import NodeLookupError, compared_node
from workbench.formats.model import DumpError


def precheck_catalog(
    con: duckdb.DuckDBPyConnection, cmp_id: int, golden_node: int | str, token: int, side: str = "test"
) -> list[PrecheckResult]:
    """Precheck the `side` op of a comparison's golden node at `token` (torch module, msprobe call or ATB op).

    A group (an ATB `1_Attention`, a torch container with no reference of its own) yields its leaf ops in
    execution order, as `wb compare` re-runs them; an op yields itself.
    """
    try:
        run_id, node_id = compared_node(con, cmp_id, golden_node, token, side)
    except NodeLookupError as exc:
        raise CannotRun(str(exc)) from None
    kind_row = con.execute("SELECT kind FROM runs WHERE run_id = ?", [run_id]).fetchone()
    name_row = con.execute("SELECT name FROM nodes WHERE run_id = ? AND node_id = ?", [run_id, node_id]).fetchone()
    if kind_row is None or name_row is None:
        raise CannotRun(f"run {run_id} or its node {node_id} is missing from the catalog")
    if kind_row[0] == "atb":
        paths = con.execute(
            "SELECT path FROM tensors WHERE run_id = ? AND node_id = ? AND token_id = ? AND path IS NOT NULL LIMIT 1",
            [run_id, node_id, token],
        ).fetchone()
        if paths is None:
            raise CannotRun(f"{name_row[0]}: no tensor file at token {token}")
        folder = Path(paths[0]).parent
        try:
            return precheck_group(folder.parent if folder.name in ("before", "after") else folder)
        except DumpError as exc:
            raise CannotRun(str(exc)) from None
    source, name = TorchDump.from_catalog(con, run_id), str(name_row[0])
    if checker_key(source.types.get(name, "")) is None:  # a container: its modules
        below = [n for n in source.descendants(name) if source.has(n, token)]
        if below:
            return precheck_nodes(source, token, below)
    return [precheck_node(source, name, token)]
