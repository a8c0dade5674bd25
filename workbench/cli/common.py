"""What every `wb` command shares: the typer app, one-line errors, the progress printer."""

from __future__ import annotations

import contextlib
import os
import sys
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Any, TypeVar

import typer
from typer.core import TyperArgument, TyperCommand, TyperGroup

from workbench.core.exits import (  # noqa: F401  (the commands import them from here)
    EXIT_BROKEN_PIPE,
    EXIT_CRASH,
    EXIT_INPUT,
    EXIT_INTERRUPTED,
    EXIT_NOTHING,
    EXIT_OK,
    EXIT_TERMINATED,
)
from workbench.core.interrupts import (  # noqa: F401  (the commands import them from here)
    Terminated,
    on_sigterm,
    signal_inside,
    sigterm_received,
)
from workbench.core.output import check_format, csv_text, render, text_table  # noqa: F401  (the commands use them)

if TYPE_CHECKING:
    import duckdb


class _PlainHelp:
    """How `wb` shows and reads its parameters, through click's own hooks (`get_params`, `collect_usage_pieces`,
    `parse_args`) on the command classes typer lets an app choose (`cls`): plain option values (a string, a
    number, a path) coerced without loading pydantic (`plain_values`); an on/off flag takes no value, so no
    `<bool>` beside it (typer shows `--no-tui <bool>`, `--help <bool>`, which reads as if they took one), and
    arguments read as people write them in the usage line, `GOLDEN [TEST]`, not `{golden} [test]`."""

    # typer vendors click (`typer._click`, private): the hooks' types are left as Any rather than imported from it
    def get_params(self, ctx: Any) -> list[Any]:
        params: list[Any] = super().get_params(ctx)  # type: ignore[misc]
        for param in params:
            if getattr(param, "is_flag", False) and param.metavar is None:  # typer's flags and click's --help
                param.metavar = ""  # typer shows the metavar instead of the type: an empty one shows nothing
        return params

    def parse_args(self, ctx: Any, args: list[str]) -> list[str]:
        from workbench.cli import plain_values

        plain_values.install(self.get_params(ctx))  # plain option values coerced without pydantic
        with _usage_errors_on_one_line(ctx):
            return list(super().parse_args(ctx, args))  # type: ignore[misc]


@contextlib.contextmanager
def _usage_errors_on_one_line(ctx: Any) -> Iterator[None]:
    """A usage error (an unknown option or command, a missing or bad value) as one `wb: error:` line naming the
    command's `--help`, exit 2, instead of typer's usage block and framed message. `wb` alone (or a group with no
    arguments) still shows the help."""
    try:
        yield
    except typer.TyperException as exc:
        if getattr(exc, "exit_code", None) != EXIT_INPUT or type(exc).__name__ == "NoArgsIsHelpError":
            raise
        message = (exc.format_message() if hasattr(exc, "format_message") else str(exc)).rstrip(".")
        say(f"wb: error: {message} (see `{ctx.command_path} --help`)", err=True)
        raise typer.Exit(EXIT_INPUT) from None


class WbGroup(_PlainHelp, TyperGroup):
    """The `wb` group (its `--version` and `--help` flags)."""

    def resolve_command(self, ctx: Any, args: list[str]) -> Any:
        with _usage_errors_on_one_line(ctx):
            return super().resolve_command(ctx, args)


class WbCommand(_PlainHelp, TyperCommand):
    """Every `wb` command (`use_plain_help` sets it on each registered one)."""

    def collect_usage_pieces(self, ctx: Any) -> list[str]:
        pieces = [self.options_metavar] if self.options_metavar else []
        for param in self.get_params(ctx):
            if isinstance(param, TyperArgument):
                name = (param.name or "").upper()
                name = name if param.required else f"[{name}]"
                pieces.append(name + ("..." if param.nargs != 1 else ""))
            else:
                pieces.extend(param.get_usage_pieces(ctx))
        return pieces


def use_plain_help(typer_app: typer.Typer) -> None:
    """Build every command registered on `typer_app` as a `WbCommand` (call once they are all registered)."""
    for info in typer_app.registered_commands:
        if info.cls in (None, TyperCommand):  # typer's default: no command chose a class of its own
            info.cls = WbCommand


app = typer.Typer(
    name="wb",
    help="wb: find where an LLM's inference goes numerically wrong (golden vs test dumps).",
    no_args_is_help=True,
    add_completion=False,
    pretty_exceptions_enable=False,
    cls=WbGroup,
)


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
    try:
        return fn()
    except BaseException as exc:
        known = _user_facing_exit(exc)
        if known is None:
            raise
        raise known from None


def _user_facing_exit(exc: BaseException) -> typer.Exit | None:
    """The one-line exit `guarded` gives `exc`, None for what is not a user-facing error. The error classes are
    imported here, not before `fn` runs: DuckDB alone takes ~60 ms to load, and `wb compare` starts its worker
    pool first (an exception from DuckDB means it is loaded)."""
    from workbench.catalog import CatalogError, storage_message
    from workbench.compare.pairing.mapping import MappingError
    from workbench.formats.model import DumpError

    duckdb = sys.modules.get("duckdb")
    if isinstance(exc, BrokenPipeError) and exc.filename is None:
        return _reader_gone()
    if isinstance(exc, DumpError | CatalogError | MappingError):
        return fail(str(exc))
    if isinstance(exc, ValueError):
        return fail(_first_line(exc))
    if isinstance(exc, RecursionError):
        return fail("input nested too deeply to read (a JSON or TOML file, or folders)")
    if duckdb is not None and isinstance(exc, duckdb.InterruptException):  # a signal while DuckDB ran a statement
        return _stopped(sigterm_received())
    if duckdb is not None and isinstance(exc, duckdb.Error):
        if signal_inside(exc) is not None:
            return _stopped(sigterm_received())
        return fail(f"catalog: {storage_message(exc)}; everything committed before is kept")
    if isinstance(exc, OSError):
        where = f"{exc.filename}: " if exc.filename else ""
        msg = storage_message(exc) if exc.errno in (27, 28, 122) else (exc.strerror or _first_line(exc))
        return fail(f"{where}{msg}; everything committed before is kept")
    if isinstance(exc, Terminated):
        return _stopped(True)
    if isinstance(exc, KeyboardInterrupt):
        return _stopped(False)
    if isinstance(exc, RuntimeError) and signal_inside(exc) is not None:
        # DuckDB's "Query interrupted" when the signal came during a DataFrame scan
        return _stopped(sigterm_received())
    return None


def _reader_gone() -> typer.Exit:
    """The exit of a command whose output's reader closed it (`wb query ... | head`): no message, as a program
    that SIGPIPE ends; standard output goes to /dev/null so the last flush at exit does not fail again."""
    with contextlib.suppress(OSError, ValueError):
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, sys.stdout.fileno())
        os.close(devnull)
    return typer.Exit(EXIT_BROKEN_PIPE)


def _stopped(terminated: bool) -> typer.Exit:
    """The exit of a command a signal stopped: SIGTERM (143) or an interrupt (130), what was committed kept."""
    what, code = ("terminated", EXIT_TERMINATED) if terminated else ("interrupted", EXIT_INTERRUPTED)
    return fail(f"{what}; everything committed so far is kept in the catalog", code)


@contextlib.contextmanager
def open_comparison(catalog: Path, cmp_id: int | None) -> Iterator[tuple[duckdb.DuckDBPyConnection, int]]:
    """The catalog a command reads, opened read-only, and its comparison `cmp_id` (None: the newest); a missing
    catalog or comparison is a `ValueError` naming the file."""
    from workbench.catalog.lookup import resolve_comparison
    from workbench.catalog.store import open_catalog

    if not catalog.is_file():
        raise ValueError(f"{catalog}: no such catalog (run `wb compare -o DIR` first, or pass --catalog FILE)")
    con = open_catalog(catalog, read_only=True)
    try:
        yield con, resolve_comparison(con, cmp_id, catalog)
    finally:
        con.close()


def _stderr_columns() -> int:
    """The width of the terminal stderr writes to (80 where it says none)."""
    try:
        return os.get_terminal_size(sys.stderr.fileno()).columns or 80
    except (OSError, ValueError):
        return 80


def _one_row(stage: str, counts: str, message: str, width: int) -> str:
    """`stage counts  message` in `width` columns: the counts whole, the stage cut before them, the message last."""
    if len(stage) + len(counts) > width:
        stage = stage[: max(width - len(counts) - 3, 0)] + "..."
    line = stage + counts
    room = width - len(line) - 2
    if message and room >= 12:
        line += "  " + (message if len(message) <= room else message[: room - 3].rstrip() + "...")
    return line[:width]


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
            line = _one_row(p.stage, f": {p.done}/{p.total}{rate}", p.message, _stderr_columns() - 1)
            sys.stderr.write(f"\r{line}\x1b[K")  # one row (a wrapped line would not be redrawn), erased to its end
            if p.done >= p.total:
                sys.stderr.write("\n")
            sys.stderr.flush()
        self.last_stage = p.stage
