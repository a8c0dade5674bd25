"""`python -m workbench.cli`."""

from workbench.cli import main

main()
