"""What every `wb` command shares: the typer app, one-line errors, the progress printer."""

from __future__ import annotations

import csv
import io
import sys
from collections.abc import Callable, Iterable, Mapping, Sequence
from typing import Annotated, Any, TypeVar

import typer
from typer.core import TyperArgument, TyperOption

from workbench.core.exits import (  # noqa: F401  (the commands import them from here)
    EXIT_CRASH,
    EXIT_INPUT,
    EXIT_INTERRUPTED,
    EXIT_NOTHING,
    EXIT_OK,
    EXIT_TERMINATED,
)

app = typer.Typer(
    name="wb",
    help="wb: find where an LLM's inference goes numerically wrong (golden vs test dumps).",
    no_args_is_help=True,
    add_completion=False,
    pretty_exceptions_enable=False,
)


def _flag_type(self: TyperOption, ctx: Any) -> str | None:
    """An on/off flag takes no value: show no `<bool>` beside it in the help."""
    return None if self.is_flag else _option_type(self, ctx)


def _usage_name(self: TyperArgument) -> str:
    """Arguments in the usage line as people write them: `GOLDEN [TEST]`, not `{golden} [test]`."""
    name = self.display_name_raw.upper()
    name = name if self.required else f"[{name}]"
    return name + ("..." if self.nargs != 1 else "")


# typer shows `<bool>` for flags (`--no-tui <bool>`, `--help <bool>`), which reads as if they took a value, and
# `{golden}` for a required argument in the usage line
_option_type = TyperOption.display_type_rich
TyperOption.display_type_rich = _flag_type  # type: ignore[method-assign]
TyperArgument._usage_display_name = _usage_name  # type: ignore[method-assign]


def _version(value: bool) -> None:
    if value:
        from workbench import __version__

        typer.echo(f"wb {__version__}")
        raise typer.Exit()


@app.callback()
def _main(
    version: Annotated[
        bool,
        typer.Option("--version", callback=_version, is_eager=True, help="Print the version of wb and exit."),
    ] = False,
) -> None:
    """wb: find where an LLM's inference goes numerically wrong (golden vs test dumps)."""


T = TypeVar("T")


REPORT_AT = "how and where: docs/security.md, Reporting a crash"


class Terminated(KeyboardInterrupt):
    """SIGTERM, delivered as an interrupt so it ends exactly like Ctrl-C (everything committed kept)."""


_sigterm_received = False


def on_sigterm(_signum: int, _frame: object) -> None:
    """The SIGTERM handler: end like Ctrl-C, remembering it was SIGTERM (DuckDB may report it as its own
    interrupt, and the line and exit code must still say "terminated")."""
    global _sigterm_received
    _sigterm_received = True
    raise Terminated


def signal_inside(exc: BaseException) -> KeyboardInterrupt | None:
    """The interrupt a DuckDB error stands for, when a signal's exception was raised in Python code DuckDB was
    running (a DataFrame scan) and DuckDB wrapped it in an error of its own ("Traceback ..."), else None."""
    if _sigterm_received:
        return Terminated()
    if "KeyboardInterrupt" in str(exc) or str(exc).startswith("Query interrupted"):
        return KeyboardInterrupt()
    return None


def say(line: object, err: bool = False) -> None:
    """Print one line with control characters and undecodable bytes escaped (file names can hold anything)."""
    from workbench.core.text import printable

    typer.echo(printable(line), err=err)


def say_lines(text: str, err: bool = False) -> None:
    """Print a block of lines (a table, CSV text), each as `say` does: one printed line per line of `text`."""
    for line in text.splitlines():
        say(line, err=err)


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
    except duckdb.InterruptException:  # a signal that arrived while DuckDB ran a statement
        if _sigterm_received:
            raise fail("terminated; everything committed so far is kept in the catalog", EXIT_TERMINATED) from None
        raise fail("interrupted; everything committed so far is kept in the catalog", EXIT_INTERRUPTED) from None
    except duckdb.Error as exc:
        if signal_inside(exc) is not None:
            code = EXIT_TERMINATED if _sigterm_received else EXIT_INTERRUPTED
            what = "terminated" if _sigterm_received else "interrupted"
            raise fail(f"{what}; everything committed so far is kept in the catalog", code) from None
        raise fail(f"catalog: {storage_message(exc)}; everything committed before is kept") from None
    except OSError as exc:
        where = f"{exc.filename}: " if exc.filename else ""
        msg = storage_message(exc) if exc.errno in (27, 28, 122) else (exc.strerror or _first_line(exc))
        raise fail(f"{where}{msg}; everything committed before is kept") from None
    except Terminated:
        raise fail("terminated; everything committed so far is kept in the catalog", EXIT_TERMINATED) from None
    except KeyboardInterrupt:
        raise fail("interrupted; everything committed so far is kept in the catalog", EXIT_INTERRUPTED) from None
    except RuntimeError as exc:  # DuckDB's "Query interrupted" when the signal came during a DataFrame scan
        if signal_inside(exc) is None:
            raise
        what, code = ("terminated", EXIT_TERMINATED) if _sigterm_received else ("interrupted", EXIT_INTERRUPTED)
        raise fail(f"{what}; everything committed so far is kept in the catalog", code) from None


class ProgressPrinter:
    """Progress on stderr, only on a terminal (stderr stays clean for errors otherwise)."""

    def __init__(self) -> None:
        self.tty = sys.stderr.isatty()
        self.last_stage = ""
        self.last_finished: tuple[str, int] | None = None

    def __call__(self, p: Any) -> None:
        finished = (p.stage, p.total) if p.done >= p.total else None
        if finished is not None and finished == self.last_finished:
            return  # a stage reported complete twice (the last batch, then the stage's end) is printed once
        self.last_finished = finished or self.last_finished
        if self.tty:
            rate = f" {p.rate:,.0f}/s" if p.rate else ""
            sys.stderr.write(f"\r{p.stage}: {p.done}/{p.total}{rate}   ")
            if p.done >= p.total:
                sys.stderr.write("\n")
            sys.stderr.flush()
        self.last_stage = p.stage


OUTPUT_FORMATS = ("table", "csv", "json")


def check_format(fmt: str) -> None:
    """Refuse an output format other than table, csv or json, in one line."""
    if fmt not in OUTPUT_FORMATS:
        raise ValueError(f"--format {fmt!r}: expected {', '.join(OUTPUT_FORMATS[:-1])} or {OUTPUT_FORMATS[-1]}")


def csv_text(rows: Iterable[Mapping[str, object]], columns: Sequence[str]) -> str:
    """Rows as CSV text with a header line; text cells a spreadsheet would evaluate are neutralised (`csv_safe`)."""
    from workbench.core.text import csv_safe

    buf = io.StringIO()
    writer = csv.DictWriter(buf, fieldnames=list(columns), lineterminator="\n", extrasaction="ignore")
    writer.writeheader()
    writer.writerows({k: csv_safe(v) for k, v in r.items()} for r in rows)
    return buf.getvalue()


def text_table(heads: Sequence[str], cells: Sequence[Sequence[str]], right: Sequence[bool] = ()) -> list[str]:
    """Aligned columns, two spaces apart; `right[i]` right-aligns column i; the last column is never padded."""
    widths = [max(len(h), *(len(c[i]) for c in cells)) if cells else len(h) for i, h in enumerate(heads)]
    last = len(heads) - 1

    def line(values: Sequence[str]) -> str:
        parts = []
        for i, (v, w) in enumerate(zip(values, widths, strict=True)):
            if i < len(right) and right[i]:
                parts.append(v.rjust(w))
            else:
                parts.append(v if i == last else v.ljust(w))
        return "  ".join(parts).rstrip()

    return [line(heads), *(line(c) for c in cells)]
