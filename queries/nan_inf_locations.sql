-- NaN/Inf locations: every compared tensor with NaN or Inf on either side, earliest first
-- Earliest = execution events within a token: an op's inputs when it starts, its outputs when it ends
-- (data_id), so the op that produced a NaN comes before the layer that encloses it.
SELECT token_id, golden_node, test_node, io, golden_index AS idx,
       golden_nan_count, golden_inf_count, my_nan_count, my_inf_count, finite_only, cmp_fail_reason
FROM comparison
WHERE cmp_id = getvariable('cmp_id')
  AND coalesce(golden_nan_count, 0) + coalesce(golden_inf_count, 0)
    + coalesce(my_nan_count, 0) + coalesce(my_inf_count, 0) > 0
ORDER BY token_id, data_id;
