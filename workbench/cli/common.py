"""What every `wb` command shares: the typer app, one-line errors, the progress printer."""

from __future__ import annotations

import sys
from collections.abc import Callable
from typing import Any, TypeVar

import typer

app = typer.Typer(
    name="wb",
    help="wb: find where an LLM's inference goes numerically wrong (golden vs test dumps).",
    no_args_is_help=True,
    add_completion=False,
    pretty_exceptions_enable=False,
)

T = TypeVar("T")


def fail(message: str, code: int = 2) -> typer.Exit:
    typer.echo(f"wb: error: {message}", err=True)
    return typer.Exit(code)


def guarded(fn: Callable[[], T]) -> T:
    """Run `fn`, turning every known user-facing error into a one-line message and exit 2."""
    from workbench.catalog import CatalogError
    from workbench.compare.mapping import MappingError
    from workbench.formats.model import DumpError

    try:
        return fn()
    except (DumpError, CatalogError, MappingError) as exc:
        raise fail(str(exc)) from None
    except ValueError as exc:
        raise fail(str(exc).splitlines()[0] if str(exc) else type(exc).__name__) from None
    except KeyboardInterrupt:
        raise fail("interrupted; everything committed so far is kept in the catalog", 130) from None


class ProgressPrinter:
    """Progress on stderr, only on a terminal (stderr stays clean for errors otherwise)."""

    def __init__(self) -> None:
        self.tty = sys.stderr.isatty()
        self.last_stage = ""

    def __call__(self, p: Any) -> None:
        if self.tty:
            rate = f" {p.rate:,.0f}/s" if p.rate else ""
            sys.stderr.write(f"\r{p.stage}: {p.done}/{p.total}{rate}   ")
            if p.done >= p.total:
                sys.stderr.write("\n")
            sys.stderr.flush()
        self.last_stage = p.stage
