"""Long operations that both the CLI and the app run (compare, redump), with progress and cancellation."""
