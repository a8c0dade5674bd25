-- Error born per token: the earliest, deepest op whose output fails while its inputs pass
SELECT b.token_id,
       gn.name  AS golden_op,
       gn.type  AS golden_type,
       tn.name  AS test_op,
       gn.layer AS layer,
       r.min_cosine,
       r.max_rel_euclid,
       r.in_rel_euclid,
       r.added_error
FROM error_born b
JOIN comparisons c USING (cmp_id)
LEFT JOIN nodes gn ON gn.run_id = c.golden_run AND gn.node_id = b.golden_node_id
LEFT JOIN nodes tn ON tn.run_id = c.test_run AND tn.node_id = b.test_node_id
LEFT JOIN node_results r ON r.cmp_id = b.cmp_id AND r.token_id = b.token_id AND r.golden_node_id = b.golden_node_id
WHERE b.cmp_id = getvariable('cmp_id')
ORDER BY b.token_id;
