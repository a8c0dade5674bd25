"""Matching golden to test and computing metrics."""
