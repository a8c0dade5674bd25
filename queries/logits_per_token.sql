-- Logits per token (cosine, KL, top-1 of each side, golden top probability) and whether the runs' inputs differ there
SELECT l.token_id, l.passed, l.cosine_similarity, l.kl_divergence, l.golden_top1, l.test_top1, l.top5_overlap,
       l.golden_top_p_golden, l.golden_top_p_test, l.prob_l1, l.failed_metrics,
       s.inputs_differ, s.reason AS inputs
FROM logits l
LEFT JOIN token_status s USING (cmp_id, token_id)
WHERE l.cmp_id = getvariable('cmp_id')
ORDER BY l.token_id;
