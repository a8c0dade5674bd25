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


# exit codes (docs/security.md lists them)
EXIT_OK = 0
EXIT_NOTHING = 1  # ran, but nothing could be compared / precheck found ops that disagree
EXIT_INPUT = 2  # bad input, bad option, unusable file or catalog: one line names it
EXIT_CRASH = 3  # a bug in wb: one line (the traceback with --debug), please report it
EXIT_INTERRUPTED = 130  # Ctrl-C (SIGINT)
EXIT_TERMINATED = 143  # SIGTERM
REPORT_AT = "how and where: docs/security.md, Reporting a crash"


class Terminated(KeyboardInterrupt):
    """SIGTERM, delivered as an interrupt so it ends exactly like Ctrl-C (everything committed kept)."""


def say(line: object, err: bool = False) -> None:
    """Print one line with control characters and undecodable bytes escaped (file names can hold anything)."""
    from workbench.core.text import printable

    typer.echo(printable(line), err=err)


def fail(message: str, code: int = EXIT_INPUT) -> typer.Exit:
    say(f"wb: error: {message}", err=True)
    return typer.Exit(code)


def _first_line(exc: BaseException) -> str:
    text = str(exc).strip()
    return text.splitlines()[0] if text else type(exc).__name__


def guarded(fn: Callable[[], T]) -> T:
    """Run `fn`, turning every known user-facing error into a one-line message and exit 2
    (interrupts: 130, SIGTERM: 143; unexpected exceptions reach `main`, which reports a crash)."""
    import duckdb

    from workbench.catalog import CatalogError, storage_message
    from workbench.compare.mapping import MappingError
    from workbench.formats.model import DumpError

    try:
        return fn()
    except (DumpError, CatalogError, MappingError) as exc:
        raise fail(str(exc)) from None
    except ValueError as exc:
        raise fail(_first_line(exc)) from None
    except RecursionError:
        raise fail("input nested too deeply to read (a JSON or TOML file, or folders)") from None
    except duckdb.Error as exc:
        raise fail(f"catalog: {storage_message(exc)}; everything committed before is kept") from None
    except OSError as exc:
        where = f"{exc.filename}: " if exc.filename else ""
        msg = storage_message(exc) if exc.errno in (27, 28, 122) else (exc.strerror or _first_line(exc))
        raise fail(f"{where}{msg}; everything committed before is kept") from None
    except Terminated:
        raise fail("terminated; everything committed so far is kept in the catalog", EXIT_TERMINATED) from None
    except KeyboardInterrupt:
        raise fail("interrupted; everything committed so far is kept in the catalog", EXIT_INTERRUPTED) from None


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
