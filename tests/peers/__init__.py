"""Compatibility with the peers' own dumpers and formats (msit, msprobe)."""
