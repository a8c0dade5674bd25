"""Build a schema-conformant catalog of a synthetic Llama comparison, fast, with DuckDB `range()`.

    python bench/make_big_catalog.py OUT.duckdb [--layers 80] [--ops 12] [--tokens 1000]

The default (80 layers x 12 ops x 1000 tokens, one input and one output per module) holds about
2.1 million compared tensor pairs. Error is small everywhere except from a planted defect
(`layers.D.down_proj` from token T on) downstream; `act_fn` is named `act` on the test side, so
both sides have unmatched nodes. `node_results` and `error_born` are computed by the real
roll-up (`workbench.analysis.verdicts.born.refresh_verdicts`). With `--tensors DIR` (small catalogs only)
every tensor is also written as a real `.npy` file whose error matches the stored metrics, so
the detail pane can read them.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from dataclasses import dataclass
from pathlib import Path

import duckdb

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from workbench.analysis.verdicts.born import refresh_verdicts
from workbench.catalog.schema import COMPARISON_VIEW, SCHEMA_VERSION, TABLES_DDL

OPS: tuple[tuple[str, str], ...] = (
    ("input_layernorm", "LlamaRMSNorm"),
    ("q_proj", "Linear"),
    ("k_proj", "Linear"),
    ("v_proj", "Linear"),
    ("rotary_emb", "LlamaRotaryEmbedding"),
    ("attn", "SDPA"),
    ("o_proj", "Linear"),
    ("post_attention_layernorm", "LlamaRMSNorm"),
    ("gate_proj", "Linear"),
    ("up_proj", "Linear"),
    ("act_fn", "SiLU"),
    ("down_proj", "Linear"),
)
# the structure of workbench/data/thresholds.toml, as a comparison stores it
THRESHOLDS = {
    "verdict": ["cosine_similarity", "relative_euclidean_distance"],
    "nan_inf_fails": True,
    "default_dtype": "float32",
    "dtype": {
        "float32": {"cosine_similarity": {"min": 0.99999}, "relative_euclidean_distance": {"max": 0.001}},
        "float16": {
            "cosine_similarity": {"min": 0.99},
            "relative_euclidean_distance": {"max": 0.05},
            "kl_divergence": {"max": 0.005},
        },
    },
}


@dataclass(frozen=True, slots=True)
class CatalogPlan:
    """What was built: sizes and the planted defect (for tests and the bench)."""

    path: Path
    layers: int
    ops: int
    tokens: int
    pairs: int
    defect_layer: int
    defect_token: int
    defect_node: str
    nan_token: int


def _node_table(layers: int, ops: int, rename_test: bool) -> str:
    """SQL for (node_id, name, type, parent_id, depth, exec_order, layer, test_name) of one model."""
    n_ops = min(ops, len(OPS))
    op_values = ", ".join(f"({i}, '{n}', '{t}')" for i, (n, t) in enumerate(OPS[:n_ops]))
    per = n_ops + 1
    last = 2 + layers * per
    act = "'act'" if rename_test else "o.name"
    return f"""
    WITH ops(k, name, type) AS (VALUES {op_values}),
    layer_nodes AS (
        SELECT 2 + l * {per} AS node_id, 'root.model.layers.' || l AS name, 'LlamaDecoderLayer' AS type,
               0 AS parent_id, 1 AS depth, 2 + l * {per} AS exec_order, l AS layer,
               'root.model.layers.' || l AS test_name
        FROM range({layers}) r(l)
    ),
    op_nodes AS (
        SELECT 3 + l * {per} + o.k, 'root.model.layers.' || l || '.' || o.name, o.type, 2 + l * {per}, 2,
               3 + l * {per} + o.k, l,
               'root.model.layers.' || l || '.' || (CASE WHEN o.name = 'act_fn' THEN {act} ELSE o.name END)
        FROM range({layers}) r(l), ops o
    )
    SELECT 0 AS node_id, 'root' AS name, 'LlamaForCausalLM' AS type, NULL::INTEGER AS parent_id, 0 AS depth,
           0 AS exec_order, NULL::INTEGER AS layer, 'root' AS test_name
    UNION ALL SELECT 1, 'root.model.embed_tokens', 'Embedding', 0, 1, 1, NULL, 'root.model.embed_tokens'
    UNION ALL SELECT * FROM layer_nodes
    UNION ALL SELECT * FROM op_nodes
    UNION ALL SELECT {last}, 'root.model.norm', 'LlamaRMSNorm', 0, 1, {last}, NULL, 'root.model.norm'
    UNION ALL SELECT {last + 1}, 'root.lm_head', 'Linear', 0, 1, {last + 1}, NULL, 'root.lm_head'
    """


def make_catalog(
    path: str | Path,
    *,
    layers: int = 80,
    ops: int = 12,
    tokens: int = 1000,
    defect_layer: int | None = None,
    defect_token: int | None = None,
    tensors: str | Path | None = None,
    hidden: int = 16,
    rename_test: bool = True,
    seed: int = 0,
) -> CatalogPlan:
    """Write a fresh catalog at `path` (replacing it) and return what it holds."""
    path = Path(path)
    if path.exists():
        path.unlink()
    n_ops = min(ops, len(OPS))
    per = n_ops + 1
    d_layer = layers // 2 if defect_layer is None else defect_layer
    d_token = tokens // 3 if defect_token is None else defect_token
    down_k = next((i for i, (n, _) in enumerate(OPS[:n_ops]) if n == "down_proj"), n_ops - 1)
    defect_exec = 3 + d_layer * per + down_k
    last_exec = 2 + layers * per + 1
    nan_token = tokens - 1
    con = duckdb.connect(str(path))
    con.execute(TABLES_DDL)
    con.execute("INSERT INTO meta VALUES ('schema_version', ?)", [str(SCHEMA_VERSION)])
    con.execute(COMPARISON_VIEW)
    con.execute("BEGIN TRANSACTION")
    con.execute(f"CREATE TEMP TABLE m AS {_node_table(layers, ops, rename_test)}")
    tdir = Path(tensors) if tensors is not None else None
    for run_id, kind, dtype in ((1, "golden", "float32"), (2, "test", "float16")):
        con.execute(
            "INSERT INTO runs (run_id, kind, path, fingerprint, model_name, order_source, n_nodes, "
            "n_tensors, problems, meta) VALUES (?, 'msit_torch', ?, ?, 'synthetic-llama', 'recorded', "
            "?, ?, [], '{}')",
            [
                run_id,
                str((tdir or path.parent) / kind),
                f"synthetic-{kind}-{seed}",
                layers * per + 4,
                layers * per * tokens * 2 + 3 * tokens * 2,
            ],
        )
        name_col = "name" if run_id == 1 else "test_name"
        con.execute(
            f"INSERT INTO nodes (run_id, node_id, name, type, parent_id, depth, exec_order, end_order, "
            f"layer) SELECT {run_id}, node_id, {name_col}, type, parent_id, depth, exec_order, "
            f"CASE WHEN node_id = 0 THEN {last_exec} WHEN depth = 1 AND layer IS NOT NULL "
            f"THEN exec_order + {n_ops} ELSE exec_order END, layer FROM m"
        )
        # every module except the root has one input and one output per token
        path_sql = f"'{tdir / kind}/' || t.tok || '/' || n.node_id || '_' || io.io || '.npy'" if tdir else "NULL"
        con.execute(f"""
            INSERT INTO tensors (run_id, tensor_id, token_id, node_id, io, idx, path, dtype, shape, layout, numel,
                                 min, max, mean, std, norm, nan_count, inf_count)
            SELECT {run_id}, (t.tok * {last_exec + 1} + n.node_id) * 2 + io.o, t.tok, n.node_id, io.io, 0,
                   {path_sql}, '{dtype}', [1, 1, {hidden}], 'ND', {hidden},
                   -3.0, 3.0, 0.0, 1.0, sqrt({hidden}), 0, 0
            FROM range({tokens}) t(tok), m n, (VALUES (0, 'in'), (1, 'out')) io(o, io)
            WHERE n.parent_id IS NOT NULL""")
    con.execute(
        "INSERT INTO comparisons (cmp_id, golden_run, test_run, mapping_digest, mapping, thresholds) "
        "VALUES (1, 1, 2, 'none', NULL, ?)",
        [json.dumps(THRESHOLDS)],
    )
    con.execute(
        "INSERT INTO node_matches SELECT 1, g.node_id, t.node_id, 'name', 1.0, 'same name' FROM nodes g "
        "JOIN nodes t ON t.run_id = 2 AND t.name = g.name WHERE g.run_id = 1 AND g.parent_id IS NOT NULL"
    )
    con.execute("""
        INSERT INTO matches
        SELECT 1, row_number() OVER (ORDER BY gt.tensor_id) - 1, gt.token_id, gt.token_id, gt.tensor_id,
               tt.tensor_id, nm.golden_node_id, nm.test_node_id, gt.io, 'name', 1.0, NULL
        FROM node_matches nm
        JOIN tensors gt ON gt.run_id = 1 AND gt.node_id = nm.golden_node_id
        JOIN tensors tt ON tt.run_id = 2 AND tt.node_id = nm.test_node_id AND tt.token_id = gt.token_id
             AND tt.io = gt.io AND tt.idx = gt.idx""")
    # relative error of a module's output: small noise, plus a defect from (d_layer.down_proj, d_token) on.
    # A layer node's output is its last op's; an input is the previous module's output.
    err = f"""(0.002 * (1.2 + sin(x.tok * 12.9898 + x.eo * 78.233))
              + CASE WHEN x.tok >= {d_token} AND x.eo >= {defect_exec}
                     THEN 0.2 * (1 + 0.002 * (x.eo - {defect_exec})) ELSE 0 END)"""
    con.execute(f"""
        CREATE TEMP TABLE pe AS
        WITH base AS (
            SELECT t.tensor_id, t.token_id AS tok,
                   CASE WHEN t.io = 'in' THEN n.exec_order - 1
                        WHEN n.depth = 1 AND n.layer IS NOT NULL THEN n.exec_order + {n_ops}
                        ELSE n.exec_order END AS eo
            FROM tensors t JOIN nodes n ON n.run_id = 1 AND n.node_id = t.node_id WHERE t.run_id = 1
        )
        SELECT x.tensor_id, x.tok, x.eo, {err} AS e,
               CASE WHEN x.tok = {nan_token} AND x.eo = {defect_exec} THEN 3 ELSE 0 END AS nans
        FROM base x""")
    con.execute("""
        INSERT INTO metrics
        SELECT 1, m.pair_id, 1 - e * e / 2, e * 8, e, e * 4, e * 0.8, e * e, e, e * 900, -20 * log10(e),
               CASE WHEN e > 0.01 THEN 0.9 ELSE 0.999 END, CASE WHEN e > 0.01 THEN 0.95 ELSE 1.0 END,
               0, 0, nans, 0, nans > 0, e <= 0.05,
               CASE WHEN e > 0.05 THEN 'cosine_similarity,relative_euclidean_distance' END, NULL
        FROM matches m JOIN pe ON pe.tensor_id = m.golden_tensor_id""")
    con.execute("COMMIT")
    n_pairs = int(con.execute("SELECT count(*) FROM matches").fetchone()[0])  # type: ignore[index]
    refresh_verdicts(con, 1)
    if tdir is not None:
        _write_tensors(con, tdir, hidden, seed)
    con.execute("CHECKPOINT")
    con.close()
    return CatalogPlan(
        path, layers, n_ops, tokens, n_pairs, d_layer, d_token, f"root.model.layers.{d_layer}.down_proj", nan_token
    )


def _write_tensors(con: duckdb.DuckDBPyConnection, tdir: Path, hidden: int, seed: int) -> None:
    """Real files for every tensor: golden ~ N(0, 1), test = golden + noise of the stored relative error."""
    import numpy as np

    rng = np.random.default_rng(seed)
    # tensor ids are the same on both sides by construction (token, node id, role)
    rows = con.execute("""
        SELECT gt.path, tt.path, pe.e, pe.nans FROM pe
        JOIN tensors gt ON gt.run_id = 1 AND gt.tensor_id = pe.tensor_id
        JOIN tensors tt ON tt.run_id = 2 AND tt.tensor_id = pe.tensor_id ORDER BY pe.tensor_id""").fetchall()
    for gpath, tpath, e, nans in rows:
        g = rng.standard_normal((1, 1, hidden)).astype(np.float32)
        noise = rng.standard_normal(g.shape).astype(np.float32)
        noise *= np.float32(e * np.linalg.norm(g) / max(float(np.linalg.norm(noise)), 1e-12))
        t = (g + noise).astype(np.float16)
        if nans:
            t.reshape(-1)[: int(nans)] = np.nan
        for p, arr in ((gpath, g), (tpath, t)):
            Path(p).parent.mkdir(parents=True, exist_ok=True)
            np.save(p, arr)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("out", type=Path)
    ap.add_argument("--layers", type=int, default=80)
    ap.add_argument("--ops", type=int, default=12)
    ap.add_argument("--tokens", type=int, default=1000)
    ap.add_argument("--tensors", type=Path, default=None, help="also write real .npy tensors here (small sizes)")
    args = ap.parse_args()
    start = time.perf_counter()
    plan = make_catalog(args.out, layers=args.layers, ops=args.ops, tokens=args.tokens, tensors=args.tensors)
    print(
        f"{plan.path}: {plan.pairs:,} compared pairs ({plan.layers} layers x {plan.ops} ops x {plan.tokens} "
        f"tokens), defect at {plan.defect_node} from token {plan.defect_token}, built in "
        f"{time.perf_counter() - start:.1f} s"
    )


if __name__ == "__main__":
    main()
