"""The DuckDB catalog: schema, opening, ingesting."""
