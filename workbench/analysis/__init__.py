"""Analyses over the catalog: verdicts, saved queries, exploration."""
