"""The workbench Textual app (`wb open`); `launch.launch` is the entry point."""
