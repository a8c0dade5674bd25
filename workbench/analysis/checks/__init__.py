"""Checks that re-run or scan: precheck (ATB ops, torch modules), errcheck (NaN/Inf/overflow),
the all-reduce check of multi-rank dumps."""
