"""wb: a terminal workbench for finding where an LLM's inference goes numerically wrong."""

__version__ = "0.1.0"
