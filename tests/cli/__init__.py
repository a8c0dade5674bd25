"""Tests of `wb` commands, run as the user runs them (a subprocess, or typer's CliRunner)."""
