"""Matching: which golden node and tensor pair with which test ones (the matchers, call-stream
alignment, layout rules, the automatic and file mappings, mapping fingerprints)."""
