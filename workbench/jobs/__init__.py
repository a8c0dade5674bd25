"""Long operations both the CLI and the app run (compare, redump), with progress and cancellation.

The layer above `analysis`: a job may use every package below it and is used by `app` and `cli` only.
"""
