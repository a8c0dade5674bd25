"""Tests of the Textual app: Pilot, snapshots, the tmux end-to-end run."""
