"""The DuckDB catalog schema: tables, the stable `comparison` view, and the schema version.

Documented for users in `docs/catalog.md`; keep both in step. Bump `SCHEMA_VERSION` on any
incompatible change: a catalog written by a newer version is refused with a clear message.
"""

from __future__ import annotations

import re

from workbench.core.advice import STANDS_OUT
from workbench.core.metrics import ALL_METRICS as ALL_METRICS
from workbench.core.metrics import MSIT_METRICS as MSIT_METRICS
from workbench.formats.overwrites import overwritten_target_sql

SCHEMA_VERSION = 2  # 2: node_results.max_stat_bound (an older wb's roll-up would supply one value too few)

TABLES_DDL = """
CREATE TABLE IF NOT EXISTS meta (
    key   VARCHAR PRIMARY KEY,
    value VARCHAR
);

CREATE SEQUENCE IF NOT EXISTS run_seq START 1;
CREATE TABLE IF NOT EXISTS runs (
    run_id       INTEGER PRIMARY KEY,
    kind         VARCHAR NOT NULL,        -- msit_torch | atb | msprobe | torchair_ge | torchair_fx
    path         VARCHAR NOT NULL,        -- resolved dump folder that was read
    fingerprint  VARCHAR NOT NULL,        -- digest of file names, sizes and mtimes
    model_name   VARCHAR,
    order_source VARCHAR NOT NULL,        -- recorded | topology | data-flow | definition
    n_nodes      INTEGER,
    n_tensors    INTEGER,
    problems     VARCHAR[],               -- one line per unreadable file
    meta         JSON,                    -- manifest: command, cwd, argv, device, ...
    ingested_at  TIMESTAMP DEFAULT current_timestamp,
    rank         INTEGER                  -- rank (device) id of a multi-rank dump, NULL for a single rank
);

CREATE TABLE IF NOT EXISTS nodes (
    run_id     INTEGER NOT NULL,
    node_id    INTEGER NOT NULL,
    name       VARCHAR NOT NULL,
    type       VARCHAR,
    parent_id  INTEGER,                   -- NULL for the root(s)
    depth      INTEGER,
    exec_order INTEGER,                   -- position in execution (pre-order of calls)
    end_order  INTEGER,                   -- the node's completion: last exec_order in its subtree
    layer      INTEGER,                   -- decoder layer index, NULL outside layers
    phase      VARCHAR,                   -- prefill | decode (ATB graphs), else NULL
    params     JSON,
    PRIMARY KEY (run_id, node_id)
);

CREATE TABLE IF NOT EXISTS tensors (
    run_id    INTEGER NOT NULL,
    tensor_id INTEGER NOT NULL,
    token_id  INTEGER NOT NULL,
    node_id   INTEGER NOT NULL,
    io        VARCHAR NOT NULL,           -- in | out
    idx       INTEGER NOT NULL,
    path      VARCHAR,
    dtype     VARCHAR,
    shape     BIGINT[],
    layout    VARCHAR,
    numel     BIGINT,
    min       DOUBLE,
    max       DOUBLE,
    mean      DOUBLE,
    std       DOUBLE,
    norm      DOUBLE,
    nan_count BIGINT,
    inf_count BIGINT,
    error     VARCHAR,                    -- why this tensor cannot be read
    PRIMARY KEY (run_id, tensor_id)
);

CREATE SEQUENCE IF NOT EXISTS cmp_seq START 1;
CREATE TABLE IF NOT EXISTS comparisons (
    cmp_id         INTEGER PRIMARY KEY,
    golden_run     INTEGER NOT NULL,
    test_run       INTEGER NOT NULL,
    mapping_digest VARCHAR NOT NULL,
    mapping        JSON,
    thresholds     JSON,
    created_at     TIMESTAMP DEFAULT current_timestamp
);

-- node-level pairing (what the trees and the mapping editor show)
CREATE TABLE IF NOT EXISTS node_matches (
    cmp_id         INTEGER NOT NULL,
    golden_node_id INTEGER NOT NULL,
    test_node_id   INTEGER NOT NULL,
    method         VARCHAR NOT NULL,      -- name | msit-mapping | mapping-file | auto-* | editor
    confidence     DOUBLE,
    evidence       VARCHAR
);

-- tensor-level pairs: one row per compared golden/test tensor pair
CREATE TABLE IF NOT EXISTS matches (
    cmp_id           INTEGER NOT NULL,
    pair_id          INTEGER NOT NULL,
    token_id         INTEGER NOT NULL,    -- golden token
    test_token_id    INTEGER NOT NULL,
    golden_tensor_id INTEGER NOT NULL,
    test_tensor_id   INTEGER NOT NULL,
    golden_node_id   INTEGER NOT NULL,
    test_node_id     INTEGER NOT NULL,
    io               VARCHAR NOT NULL,
    method           VARCHAR NOT NULL,
    confidence       DOUBLE,
    transform        VARCHAR,             -- layout fix applied before comparing (e.g. squeeze batch)
    PRIMARY KEY (cmp_id, pair_id)
);

CREATE TABLE IF NOT EXISTS metrics (
    cmp_id                      INTEGER NOT NULL,
    pair_id                     INTEGER NOT NULL,
    cosine_similarity           DOUBLE,
    max_relative_error          DOUBLE,
    mean_relative_error         DOUBLE,
    max_absolute_error          DOUBLE,
    mean_absolute_error         DOUBLE,
    kl_divergence               DOUBLE,
    relative_euclidean_distance DOUBLE,
    max_ulp_error               DOUBLE,
    snr_db                      DOUBLE,
    one_thousandth_err_ratio    DOUBLE,
    five_thousandths_err_ratio  DOUBLE,
    golden_nan_count            BIGINT,
    golden_inf_count            BIGINT,
    my_nan_count                BIGINT,
    my_inf_count                BIGINT,
    finite_only                 BOOLEAN,  -- metrics computed on the finite part only
    passed                      BOOLEAN,  -- NULL when nothing could be computed
    failed_metrics              VARCHAR,  -- comma list of metrics over their threshold
    cmp_fail_reason             VARCHAR,
    PRIMARY KEY (cmp_id, pair_id)
);

-- statistics metrics of every computed pair (core/metrics.py STAT_METRICS, docs/metrics.md): the only
-- metrics of a pair with a statistics-only side; `metrics.passed` then comes from stat_rel_euclid_bound
CREATE TABLE IF NOT EXISTS stat_metrics (
    cmp_id                     INTEGER NOT NULL,
    pair_id                    INTEGER NOT NULL,
    max_stat_absolute_error    DOUBLE,
    max_stat_relative_error    DOUBLE,
    min_stat_absolute_error    DOUBLE,
    min_stat_relative_error    DOUBLE,
    mean_stat_absolute_error   DOUBLE,
    mean_stat_relative_error   DOUBLE,
    l2norm_stat_absolute_error DOUBLE,
    l2norm_stat_relative_error DOUBLE,
    stat_rel_euclid_bound      DOUBLE,    -- lower bound of relative_euclidean_distance from the statistics
    PRIMARY KEY (cmp_id, pair_id)
);

-- all-reduce check of a multi-rank dump (analysis/checks/allreduce.py): each rank's output of a communication op
-- against the sum of every rank's input; culprit_rank/factor name the rank whose contribution explains it
CREATE TABLE IF NOT EXISTS allreduce_checks (
    run_id       INTEGER NOT NULL,        -- the run of this rank
    token_id     INTEGER NOT NULL,
    node         VARCHAR NOT NULL,
    rel_error    DOUBLE,                  -- ||out - sum(inputs)|| / ||sum(inputs)||
    passed       BOOLEAN,
    culprit_rank INTEGER,                 -- runs.rank of the rank whose contribution is off
    factor       DOUBLE,                  -- that contribution arrived multiplied by this (0: dropped)
    reason       VARCHAR,
    PRIMARY KEY (run_id, token_id, node)
);

-- per (token, golden node) roll-up written after a compare: drives the trees, the heatmap
-- and the "error born at" verdict without touching tensors again
CREATE TABLE IF NOT EXISTS node_results (
    cmp_id          INTEGER NOT NULL,
    token_id        INTEGER NOT NULL,
    golden_node_id  INTEGER NOT NULL,
    test_node_id    INTEGER,
    out_pairs       INTEGER,
    out_failed      INTEGER,
    in_pairs        INTEGER,
    in_failed       INTEGER,
    min_cosine      DOUBLE,
    max_kl          DOUBLE,
    max_rel_euclid  DOUBLE,
    max_abs_err     DOUBLE,
    max_rel_err     DOUBLE,
    mean_rel_err    DOUBLE,
    in_rel_euclid   DOUBLE,               -- worst relative euclidean distance of the inputs
    added_error     DOUBLE,               -- out_rel_euclid - in_rel_euclid (error the op adds)
    has_nan_inf     BOOLEAN,
    passed          BOOLEAN,              -- all outputs passed
    inputs_passed   BOOLEAN,              -- all inputs passed (TRUE when none dumped)
    born            BOOLEAN,              -- output fails while inputs pass
    max_stat_bound  DOUBLE,               -- worst stat_rel_euclid_bound of the outputs without tensor metrics
    PRIMARY KEY (cmp_id, token_id, golden_node_id)
);

-- the verdict per token: where the error is born (NULL node when every output passes)
CREATE TABLE IF NOT EXISTS error_born (
    cmp_id         INTEGER NOT NULL,
    token_id       INTEGER NOT NULL,
    golden_node_id INTEGER,
    test_node_id   INTEGER,
    evidence       VARCHAR,               -- how the test op was pinned down (e.g. single-op precheck)
    PRIMARY KEY (cmp_id, token_id)
);

-- the root-cause advisor's ranking per token (workbench/analysis/verdicts/advisor.py): every compared golden
-- node, rank 1 = the op that adds the most error beyond its inputs and its peers' noise
CREATE TABLE IF NOT EXISTS advice (
    cmp_id         INTEGER NOT NULL,
    token_id       INTEGER NOT NULL,
    rank           INTEGER NOT NULL,
    golden_node_id INTEGER NOT NULL,
    test_node_id   INTEGER,
    score          DOUBLE,                -- own added error / what its peers add (>= 3: stands out)
    reason         VARCHAR,               -- one line: output vs input error, the ratio to its peers
    evidence       VARCHAR,               -- rank 1 only: how the test op was pinned down (precheck)
    PRIMARY KEY (cmp_id, token_id, rank)
);

-- the logits of each token (last position's vocabulary row, float64): `wb logits`, `wb compare`
CREATE TABLE IF NOT EXISTS logits (
    cmp_id              INTEGER NOT NULL,
    token_id            INTEGER NOT NULL,
    golden_node         VARCHAR,          -- the node whose output holds the logits (lm_head, LmHead, root)
    test_node           VARCHAR,
    dtype               VARCHAR,          -- the test logits' dtype (picks the thresholds)
    vocab               INTEGER,
    cosine_similarity   DOUBLE,
    kl_divergence       DOUBLE,           -- KL(golden || test) of the softmaxes, float64
    golden_top1         BIGINT,
    test_top1           BIGINT,
    top1_agree          BOOLEAN,
    top5_overlap        INTEGER,          -- golden top-5 ids also in the test top-5
    golden_top_p_golden DOUBLE,           -- probability of the golden top-1 id, golden run
    golden_top_p_test   DOUBLE,           -- ... test run
    golden_top_p_delta  DOUBLE,           -- test - golden
    prob_l1             DOUBLE,           -- sum |p_golden - p_test|
    passed              BOOLEAN,          -- NULL when nothing could be compared (see reason)
    failed_metrics      VARCHAR,
    reason              VARCHAR,
    golden_path         VARCHAR,
    test_path           VARCHAR,
    PRIMARY KEY (cmp_id, token_id)
);

-- mapping-file entries a comparison did not use (compare/pairing/fingerprint.py, docs/mapping.md): explicit pairs that
-- no longer fit the dumps the mapping's fingerprint was taken on, and rules that match nothing
CREATE TABLE IF NOT EXISTS mapping_stale (
    cmp_id        INTEGER NOT NULL,
    kind          VARCHAR NOT NULL,       -- pair | rule
    golden        VARCHAR NOT NULL,       -- golden node name (pair) or pattern (rule)
    test          VARCHAR NOT NULL,
    golden_tensor VARCHAR,                -- tensor selectors as in the file (* = all)
    test_tensor   VARCHAR,
    reason        VARCHAR NOT NULL,       -- e.g. shape of root.model.norm out:0 changed 128 -> 64
    mapping       VARCHAR                 -- the mapping file
);

-- kinds of call the test run makes at some tokens and not at others (compare/pairing/token_realign.py): calls
-- numbered by their kind are renamed past the difference there, and paired again by their order at those tokens;
-- the lines `wb compare` tells (analysis/reporting/call_drift.py), replaced on every compare of the comparison
CREATE TABLE IF NOT EXISTS call_drift (
    cmp_id   INTEGER NOT NULL,
    position INTEGER NOT NULL,            -- the order they are told in
    line     VARCHAR NOT NULL,            -- note: ... (paired again) | warning: ... (pairs may compare other calls)
    repaired BOOLEAN NOT NULL,            -- the kind's calls were paired again at every such token
    PRIMARY KEY (cmp_id, position)
);

-- whether the two runs were fed the same token ids at each token; from the first token whose inputs
-- differ on, no op is named (error_born keeps NULL with this reason)
CREATE TABLE IF NOT EXISTS token_status (
    cmp_id          INTEGER NOT NULL,
    token_id        INTEGER NOT NULL,
    inputs_differ   BOOLEAN,              -- NULL: unknown (no ids recorded or dumped)
    golden_input_id BIGINT,               -- first differing id (the token's own ids, else NULL)
    test_input_id   BIGINT,
    source          VARCHAR,              -- manifest | embedding | top-1 (how the ids were found)
    reason          VARCHAR,
    PRIMARY KEY (cmp_id, token_id)
);
"""

COMPARISON_VIEW = """
CREATE OR REPLACE VIEW comparison AS
SELECT
    m.cmp_id,
    m.pair_id,
    m.test_token_id                                   AS token_id,
    row_number() OVER (PARTITION BY m.cmp_id
                       ORDER BY m.token_id,
                                CASE WHEN m.io = 'in' THEN 2 * gn.exec_order ELSE 2 * gn.end_order + 1 END
                                    NULLS LAST,
                                CASE WHEN m.io = 'in' THEN gn.depth ELSE -gn.depth END, gn.node_id,
                                gt.idx, m.pair_id) - 1 AS data_id,
    gt.path                                           AS golden_data_path,
    gn.type                                           AS golden_op_type,
    'torch.' || gt.dtype                              AS golden_dtype,
    '[' || array_to_string(gt.shape, ', ') || ']'     AS golden_shape,
    gt.max                                            AS golden_max_value,
    gt.min                                            AS golden_min_value,
    gt.mean                                           AS golden_mean_value,
    tt.path                                           AS my_data_path,
    tn.type                                           AS my_op_type,
    'torch.' || tt.dtype                              AS my_dtype,
    '[' || array_to_string(tt.shape, ', ') || ']'     AS my_shape,
    tt.max                                            AS my_max_value,
    tt.min                                            AS my_min_value,
    tt.mean                                           AS my_mean_value,
    x.cosine_similarity,
    x.max_relative_error,
    x.mean_relative_error,
    x.max_absolute_error,
    x.mean_absolute_error,
    x.kl_divergence,
    x.relative_euclidean_distance,
    x.cmp_fail_reason,
    m.token_id                                        AS golden_token_id,
    gn.name                                           AS golden_node,
    tn.name                                           AS test_node,
    gn.layer                                          AS layer,
    gn.exec_order                                     AS exec_order,
    m.io                                              AS io,
    gt.idx                                            AS golden_index,
    tt.idx                                            AS test_index,
    x.passed,
    x.failed_metrics,
    x.max_ulp_error,
    x.snr_db,
    x.one_thousandth_err_ratio,
    x.five_thousandths_err_ratio,
    x.golden_nan_count,
    x.golden_inf_count,
    x.my_nan_count,
    x.my_inf_count,
    x.finite_only,
    m.method                                          AS match_method,
    m.confidence                                      AS match_confidence,
    gt.std                                            AS golden_std,
    gt.norm                                           AS golden_norm,
    tt.std                                            AS my_std,
    tt.norm                                           AS my_norm,
    m.golden_node_id,
    m.test_node_id,
    m.golden_tensor_id,
    m.test_tensor_id,
    s.max_stat_absolute_error,
    s.max_stat_relative_error,
    s.min_stat_absolute_error,
    s.min_stat_relative_error,
    s.mean_stat_absolute_error,
    s.mean_stat_relative_error,
    s.l2norm_stat_absolute_error,
    s.l2norm_stat_relative_error,
    s.stat_rel_euclid_bound,
    (gt.path IS NULL OR tt.path IS NULL)              AS on_statistics   -- compared on statistics only
FROM matches m
JOIN comparisons c ON c.cmp_id = m.cmp_id
JOIN tensors gt ON gt.run_id = c.golden_run AND gt.tensor_id = m.golden_tensor_id
JOIN tensors tt ON tt.run_id = c.test_run AND tt.tensor_id = m.test_tensor_id
JOIN nodes gn ON gn.run_id = c.golden_run AND gn.node_id = m.golden_node_id
JOIN nodes tn ON tn.run_id = c.test_run AND tn.node_id = m.test_node_id
LEFT JOIN metrics x ON x.cmp_id = m.cmp_id AND x.pair_id = m.pair_id
LEFT JOIN stat_metrics s ON s.cmp_id = m.cmp_id AND s.pair_id = m.pair_id;
"""

# what an in-place call overwrites, before the write: compared, not judged (formats/overwrites.py); counted apart
# from the pairs without metrics
_NOT_COMPARABLE_SELECT = "    coalesce(p.not_comparable, 0)                     AS not_comparable,\n"
_NOT_JUDGED_SELECT = (
    "    coalesce(p.not_comparable, 0) - coalesce(j.not_judged, 0) AS not_comparable,\n"
    "    coalesce(j.not_judged, 0)                         AS not_judged,\n"
)
_NOT_JUDGED_JOIN = f"""LEFT JOIN (
    SELECT m.cmp_id, count(*) AS not_judged
    FROM matches m JOIN metrics x ON x.cmp_id = m.cmp_id AND x.pair_id = m.pair_id
    JOIN comparisons jc ON jc.cmp_id = m.cmp_id
    JOIN nodes gn ON gn.run_id = jc.golden_run AND gn.node_id = m.golden_node_id
    JOIN tensors tt ON tt.run_id = jc.test_run AND tt.tensor_id = m.test_tensor_id
    WHERE x.passed IS NULL AND {overwritten_target_sql("gn.type", "m.io", "tt.idx")}
    GROUP BY m.cmp_id
) j ON j.cmp_id = c.cmp_id
"""
RANK_VIEW = f"""
CREATE OR REPLACE VIEW rank_summary AS
-- one row per comparison with its rank (runs.rank of the test run, else of the golden run; NULL when neither
-- side is one rank of a multi-rank dump): the figures `wb compare` prints per rank, and the app's rank list
SELECT
    c.cmp_id,
    coalesce(t.rank, g.rank)                          AS rank,
    c.golden_run,
    c.test_run,
    coalesce(p.pairs, 0)                              AS pairs,
    coalesce(p.failed, 0)                             AS failed,
{_NOT_JUDGED_SELECT}    p.min_cosine,
    p.max_rel_euclid,
    b.first_born_token,
    bn.name                                           AS first_born_node,
    o.origin_token,
    onode.name                                        AS origin_node,
    coalesce(a.allreduce_checked, 0)                  AS allreduce_checked,
    coalesce(a.allreduce_failed, 0)                   AS allreduce_failed,
    a.culprit_rank
FROM comparisons c
JOIN runs g ON g.run_id = c.golden_run
JOIN runs t ON t.run_id = c.test_run
LEFT JOIN (
    SELECT m.cmp_id, count(*) AS pairs, count(*) FILTER (WHERE x.passed = false) AS failed,
           count(*) FILTER (WHERE x.passed IS NULL) AS not_comparable,
           min(x.cosine_similarity) AS min_cosine, max(x.relative_euclidean_distance) AS max_rel_euclid
    FROM matches m LEFT JOIN metrics x ON x.cmp_id = m.cmp_id AND x.pair_id = m.pair_id
    GROUP BY m.cmp_id
) p ON p.cmp_id = c.cmp_id
{_NOT_JUDGED_JOIN}LEFT JOIN (
    SELECT cmp_id, arg_min(golden_node_id, token_id) AS golden_node_id, min(token_id) AS first_born_token
    FROM error_born WHERE golden_node_id IS NOT NULL GROUP BY cmp_id
) b ON b.cmp_id = c.cmp_id
LEFT JOIN nodes bn ON bn.run_id = c.golden_run AND bn.node_id = b.golden_node_id
LEFT JOIN (
    SELECT cmp_id, arg_min(golden_node_id, token_id) AS golden_node_id, min(token_id) AS origin_token
    FROM advice WHERE rank = 1 AND score >= {STANDS_OUT} GROUP BY cmp_id
) o ON o.cmp_id = c.cmp_id
LEFT JOIN nodes onode ON onode.run_id = c.golden_run AND onode.node_id = o.golden_node_id
LEFT JOIN (
    SELECT run_id, count(*) AS allreduce_checked, count(*) FILTER (WHERE passed = false) AS allreduce_failed,
           min(culprit_rank) FILTER (WHERE passed = false) AS culprit_rank
    FROM allreduce_checks GROUP BY run_id
) a ON a.run_id = c.test_run;
"""

# Columns of msit's CSV report, in msit's order (docs: shared formats README section 4).
MSIT_CSV_COLUMNS: tuple[str, ...] = (
    "token_id",
    "data_id",
    "golden_data_path",
    "golden_op_type",
    "golden_dtype",
    "golden_shape",
    "golden_max_value",
    "golden_min_value",
    "golden_mean_value",
    "my_data_path",
    "my_op_type",
    "my_dtype",
    "my_shape",
    "my_max_value",
    "my_min_value",
    "my_mean_value",
    *MSIT_METRICS,
    "cmp_fail_reason",
)

# wb's own SQL objects, by name: on every open, a view under one of these names is wb's (catalog/lockdown.py)
OUR_VIEWS: dict[str, str] = {"comparison": COMPARISON_VIEW, "rank_summary": RANK_VIEW}
# the views earlier releases wrote, still trusted where the catalog is opened read-only (a read-write open replaces
# them with OUR_VIEWS'): before 2026-11-26 rows sharing a golden tensor were numbered in no set order
PAST_VIEWS: dict[str, tuple[str, ...]] = {
    "comparison": (COMPARISON_VIEW.replace("gt.idx, m.pair_id) - 1 AS data_id", "gt.idx) - 1 AS data_id", 1),),
    # before 2026-11-29 an in-place call's overwritten target counted as not comparable
    "rank_summary": (
        RANK_VIEW.replace(_NOT_JUDGED_SELECT, _NOT_COMPARABLE_SELECT, 1).replace(_NOT_JUDGED_JOIN, "", 1),
    ),
}
OUR_TABLES: frozenset[str] = frozenset(re.findall(r"CREATE TABLE IF NOT EXISTS (\w+)", TABLES_DDL))
# the tables holding a computed pair's rows, keyed (cmp_id, pair_id): deleted together (a pair recomputed gets both
# again, inserted: executor.ResultSink)
PAIR_RESULT_TABLES: tuple[str, ...] = ("metrics", "stat_metrics")
