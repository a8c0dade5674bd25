"""Judging a pair: the metric kernels, statistics metrics, thresholds, the pass/fail rule."""
