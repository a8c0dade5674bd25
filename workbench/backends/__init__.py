"""Test-side inference stacks that write real dumps: the ATB-structured Llama (`atb_llama`)."""

from workbench.backends.atb_dump import AtbDumpConfig
from workbench.backends.atb_llama import AtbLlama, AtbRun
from workbench.backends.defects import DEFECT_KINDS, Defect

__all__ = ["DEFECT_KINDS", "AtbDumpConfig", "AtbLlama", "AtbRun", "Defect"]
