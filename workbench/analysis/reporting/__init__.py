"""What a compare hands back: `CompareResult` read from the catalog, the msit CSV and the
printed summary."""
