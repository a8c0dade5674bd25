-- First divergent token: the earliest token whose logits fail (table `logits`, filled by wb compare / wb logits), with its metrics; no row when no token fails
SELECT token_id, golden_node AS logits_op, test_node AS test_op, cosine_similarity, kl_divergence,
       golden_top1, test_top1, top5_overlap, golden_top_p_golden, golden_top_p_test, golden_top_p_delta,
       prob_l1, failed_metrics
FROM logits
WHERE cmp_id = getvariable('cmp_id') AND passed = false
ORDER BY token_id
LIMIT 1;
