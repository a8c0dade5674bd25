"""Benchmarks and the generators some tests share (`make_big_catalog`, `advisor_defects`): run each as a script."""
