-- First divergent token: the earliest token whose logits (last op in execution order) fail, with its metrics;
-- no row when every token's logits pass
WITH last_out AS (
    SELECT token_id, golden_node, test_node, cosine_similarity, kl_divergence,
           relative_euclidean_distance, passed,
           row_number() OVER (PARTITION BY token_id ORDER BY exec_order DESC NULLS LAST, data_id DESC) AS rn
    FROM comparison
    WHERE cmp_id = getvariable('cmp_id') AND io = 'out' AND cosine_similarity IS NOT NULL
)
SELECT token_id, golden_node AS logits_op, test_node AS test_op, cosine_similarity, kl_divergence,
       relative_euclidean_distance, passed
FROM last_out
WHERE rn = 1 AND passed = false
ORDER BY token_id
LIMIT 1;
