-- NaN/Inf locations: every compared tensor with NaN or Inf on either side, earliest first
-- Earliest = execution events within a token: an op's inputs when it starts, its outputs when it ends
-- (data_id), so the op that produced a NaN comes before the layer that encloses it.
-- A pair compared on statistics only (no counts: on_statistics) is listed where a side's max/min/mean/norm is NaN/Inf.
SELECT token_id, golden_node, test_node, io, golden_index AS idx,
       golden_nan_count, golden_inf_count, my_nan_count, my_inf_count, finite_only, on_statistics,
       my_max_value, my_min_value, my_mean_value, my_norm, cmp_fail_reason
FROM comparison
WHERE cmp_id = getvariable('cmp_id')
  AND (coalesce(golden_nan_count, 0) + coalesce(golden_inf_count, 0)
         + coalesce(my_nan_count, 0) + coalesce(my_inf_count, 0) > 0
       OR (on_statistics
           AND NOT coalesce(isfinite(golden_max_value) AND isfinite(golden_min_value) AND isfinite(golden_mean_value)
                            AND isfinite(golden_norm) AND isfinite(my_max_value) AND isfinite(my_min_value)
                            AND isfinite(my_mean_value) AND isfinite(my_norm), true)))
ORDER BY token_id, data_id;
