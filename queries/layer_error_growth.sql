-- Per-layer error growth: worst output error of each decoder layer per token, and how much it grew over the previous layer
WITH per_layer AS (
    SELECT r.token_id, n.layer,
           max(r.max_rel_euclid) AS worst_rel_euclid,
           min(r.min_cosine)     AS worst_cosine,
           CAST(coalesce(sum(r.out_failed), 0) AS BIGINT) AS failed_outputs
    FROM node_results r
    JOIN comparisons c USING (cmp_id)
    JOIN nodes n ON n.run_id = c.golden_run AND n.node_id = r.golden_node_id
    WHERE r.cmp_id = getvariable('cmp_id') AND n.layer IS NOT NULL
    GROUP BY r.token_id, n.layer
)
SELECT token_id, layer, worst_rel_euclid, worst_cosine, failed_outputs,
       worst_rel_euclid / nullif(lag(worst_rel_euclid) OVER (PARTITION BY token_id ORDER BY layer), 0) AS growth
FROM per_layer
ORDER BY token_id, layer;
