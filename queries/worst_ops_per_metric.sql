-- Worst ops per metric: the 5 output tensors with the lowest cosine, highest KL, highest relative distance
WITH outs AS (
    SELECT * FROM comparison WHERE cmp_id = getvariable('cmp_id') AND io = 'out'
),
ranked AS (
    SELECT 'cosine_similarity' AS metric, cosine_similarity AS value, token_id, golden_node, test_node,
           row_number() OVER (ORDER BY cosine_similarity ASC NULLS LAST) AS rn FROM outs
    UNION ALL
    SELECT 'kl_divergence', kl_divergence, token_id, golden_node, test_node,
           row_number() OVER (ORDER BY kl_divergence DESC NULLS LAST) FROM outs
    UNION ALL
    SELECT 'relative_euclidean_distance', relative_euclidean_distance, token_id, golden_node, test_node,
           row_number() OVER (ORDER BY relative_euclidean_distance DESC NULLS LAST) FROM outs
    UNION ALL
    SELECT 'max_absolute_error', max_absolute_error, token_id, golden_node, test_node,
           row_number() OVER (ORDER BY max_absolute_error DESC NULLS LAST) FROM outs
)
SELECT metric, rn AS rank, value, token_id, golden_node, test_node
FROM ranked WHERE rn <= 5
ORDER BY metric, rn;
