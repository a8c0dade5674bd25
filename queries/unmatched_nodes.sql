-- Unmatched nodes: ops with dumped tensors on one side and no counterpart on the other
WITH c AS (SELECT * FROM comparisons WHERE cmp_id = getvariable('cmp_id'))
SELECT 'golden' AS side, n.name, n.type, n.layer, n.exec_order
FROM nodes n, c
WHERE n.run_id = c.golden_run
  AND EXISTS (SELECT 1 FROM tensors t WHERE t.run_id = n.run_id AND t.node_id = n.node_id)
  AND NOT EXISTS (SELECT 1 FROM node_matches m WHERE m.cmp_id = c.cmp_id AND m.golden_node_id = n.node_id)
UNION ALL
SELECT 'test', n.name, n.type, n.layer, n.exec_order
FROM nodes n, c
WHERE n.run_id = c.test_run
  AND EXISTS (SELECT 1 FROM tensors t WHERE t.run_id = n.run_id AND t.node_id = n.node_id)
  AND NOT EXISTS (SELECT 1 FROM node_matches m WHERE m.cmp_id = c.cmp_id AND m.test_node_id = n.node_id)
ORDER BY side, exec_order NULLS LAST, name;
