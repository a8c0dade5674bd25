"""The `wb` command line (typer). Every failure a user can cause is one line on stderr, never a traceback."""

from __future__ import annotations

import contextlib
import gc
import os
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Annotated, Any, TypeVar

import typer

from workbench.catalog import first_row

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


class _ProgressPrinter:
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


def run_compare_cli(
    golden: Path,
    test: Path,
    out: Path,
    mapping: Path | None,
    tokens: str | None,
    workers: int | None,
    thresholds: Path | None,
    quiet: bool = False,
) -> Any:
    """Shared by `wb compare`, `wb open` and `wb demo`: compare, write the CSV, print the summary."""
    from workbench.catalog import CATALOG_NAME
    from workbench.compare.pool import PoolStarter, default_workers, worth_a_pool
    from workbench.compare.tasks import parse_tokens

    # boot the workers first, then read the dumps and hand the workers the pairs that are obvious
    # (same place in two dumps of one kind) while this process imports pandas/DuckDB and builds the catalog
    n_workers = workers or default_workers()
    starter = (
        PoolStarter(n_workers) if golden.exists() and test.exists() and worth_a_pool(golden, test, n_workers) else None
    )
    try:
        from workbench.formats import open_dump

        tok = parse_tokens(tokens)
        g_dump, t_dump = open_dump(golden), open_dump(test)
        early = None
        if starter is not None and g_dump.kind == t_dump.kind:
            from workbench.compare.early import EarlyPairs

            early = EarlyPairs(g_dump, t_dump, starter, tok)

        from workbench.catalog.store import open_catalog
        from workbench.compare.pipeline import run_compare
        from workbench.compare.report import format_summary, write_msit_csv

        gc.freeze()  # the imported modules' objects need no more collecting: ~0.1 s less of GC per run

        out.mkdir(parents=True, exist_ok=True)
        catalog = out / CATALOG_NAME
        res = run_compare(
            g_dump,
            t_dump,
            catalog,
            mapping=mapping,
            tokens=tok,
            workers=n_workers,
            thresholds=thresholds,
            progress=None if quiet else _ProgressPrinter(),
            pool=starter,
            early=early,
        )
    finally:
        if starter is not None:
            starter.shutdown()
    con = open_catalog(catalog)
    try:
        csv_path = write_msit_csv(con, res.cmp_id, out, tok)
        labels = {}
        for run_id in (res.golden_run, res.test_run):
            row = first_row(con.execute("SELECT kind, path FROM runs WHERE run_id = ?", [run_id]))
            labels[run_id] = f"{row[1]} ({row[0]})" if row else str(run_id)
    finally:
        con.close()
    for line in format_summary(res, labels[res.golden_run], labels[res.test_run], csv_path):
        typer.echo(line)
    return res


@app.command()
def compare(
    golden: Annotated[Path, typer.Option("-gp", "--golden-path", help="Golden dump (any level msit accepts).")],
    test: Annotated[Path, typer.Option("-mp", "--my-path", help="Test dump (any level msit accepts).")],
    mapping: Annotated[
        Path | None,
        typer.Option(
            "-mf",
            "--mapping",
            help="Mapping file (wb-mapping JSON), msit's op_mapping_file.json, or a folder with them.",
        ),
    ] = None,
    out: Annotated[
        Path, typer.Option("-o", "--output", help="Output folder: catalog.duckdb and the CSV report.")
    ] = Path("wb_out"),
    tokens: Annotated[str | None, typer.Option("--tokens", help="Tokens to compare, e.g. 0-3,7.")] = None,
    workers: Annotated[int | None, typer.Option("--workers", "-j", help="Worker processes (default: cores).")] = None,
    thresholds: Annotated[
        Path | None, typer.Option("--thresholds", help="TOML file overriding pass/fail bounds.")
    ] = None,
) -> None:
    """Compare two dumps op by op: OUT/catalog.duckdb, an msit-compatible CSV, and where the error is born."""
    res = guarded(lambda: run_compare_cli(golden, test, out, mapping, tokens, workers, thresholds))
    if res.pairs == 0 or res.uncomparable >= res.pairs:
        raise fail("nothing could be compared (no matched tensor pairs with readable data)", 1)


@app.command()
def ingest(
    dump: Annotated[Path, typer.Argument(help="A dump folder (msit torch, ATB or msprobe).")],
    catalog: Annotated[Path, typer.Option("--catalog", "-c", help="Catalog file.")] = Path("catalog.duckdb"),
) -> None:
    """Add one dump to a catalog (skipped when the same content is already there)."""
    from workbench.catalog.store import ingest_dump, open_catalog
    from workbench.formats import open_dump

    def go() -> None:
        d = open_dump(dump)
        con = open_catalog(catalog)
        try:
            res = ingest_dump(con, d)
        finally:
            con.close()
        verb = "already in the catalog as" if res.skipped else "ingested as"
        typer.echo(
            f"{d.root} ({d.kind}, {res.n_nodes} nodes, {res.n_tensors} tensors) {verb} run {res.run_id} in {catalog}"
        )
        for p in res.problems:
            typer.echo(f"problem: {p}")

    guarded(go)


@app.command()
def query(
    sql: Annotated[str, typer.Argument(help="SQL text, a .sql file, or the name of a saved query in queries/.")],
    catalog: Annotated[Path, typer.Option("--catalog", "-c", help="Catalog file.")] = Path("wb_out/catalog.duckdb"),
    fmt: Annotated[str, typer.Option("--format", "-f", help="table, csv or json.")] = "table",
    cmp_id: Annotated[
        int | None, typer.Option("--cmp", help="Comparison id for saved queries (default: newest).")
    ] = None,
    limit: Annotated[int, typer.Option("--limit", help="Rows shown in table format (0: all).")] = 200,
) -> None:
    """Run SQL on a catalog, read-only. Saved queries use getvariable('cmp_id')."""
    from workbench.analysis.queries import run_query

    def go() -> None:
        if fmt not in ("table", "csv", "json"):
            raise ValueError(f"--format {fmt!r}: expected table, csv or json")
        text = run_query(catalog, sql, fmt=fmt, cmp_id=cmp_id, limit=limit)
        typer.echo(text, nl=not text.endswith("\n"))

    guarded(go)


@app.command("queries")
def list_queries() -> None:
    """List the saved queries (use their names with `wb query NAME`)."""
    from workbench.analysis.queries import saved_queries

    for name, (path, title) in saved_queries().items():
        typer.echo(f"{name:28s} {title}   ({path})")


@app.command()
def precheck(
    path: Annotated[Path, typer.Argument(help="An ATB op folder, a group (layer) folder or a token folder of a dump.")],
    thresholds: Annotated[
        Path | None, typer.Option("--thresholds", help="TOML file overriding pass/fail bounds.")
    ] = None,
    show_all: Annotated[bool, typer.Option("--all", help="Also list ops that pass.")] = False,
) -> None:
    """Re-run ATB ops alone on their dumped inputs with a float32/64 reference; report the ops that disagree."""
    from workbench.analysis.precheck import precheck_group
    from workbench.compare.thresholds import Thresholds

    def go() -> int:
        th = Thresholds.load(thresholds)
        if not path.is_dir():
            raise ValueError(f"{path}: no such folder")
        results = precheck_group(path, thresholds=th)  # an op folder yields itself
        failed = 0
        for r in results:
            label = r.name or r.op_dir
            if not r.supported:
                if show_all:
                    typer.echo(f"skip  {label}  ({r.reason})")
                continue
            if r.passed is False:
                failed += 1
                worst = ", ".join(
                    f"out{o.index}: {','.join(o.failed_metrics) or o.reason}" for o in r.outputs if o.passed is False
                )
                typer.echo(f"FAIL  {label}  {worst}" + (f"  ({r.reason})" if r.reason else ""))
            elif r.passed is None:
                typer.echo(f"?     {label}  ({r.reason})")
            elif show_all:
                typer.echo(f"ok    {label}")
        checked = sum(1 for r in results if r.supported)
        typer.echo(
            f"{checked} ops re-run, {failed} disagree with their dumped outputs, {len(results) - checked} not supported"
        )
        return 1 if failed else 0

    code = guarded(go)
    if code:
        raise typer.Exit(code)


@app.command("open")
def open_cmd(
    golden: Annotated[Path, typer.Argument(help="Golden dump folder, or a catalog.duckdb to open.")],
    test: Annotated[Path | None, typer.Argument(help="Test dump folder.")] = None,
    mapping: Annotated[Path | None, typer.Option("-mf", "--mapping", help="Mapping file or folder.")] = None,
    out: Annotated[Path, typer.Option("-o", "--output", help="Folder for the catalog when comparing.")] = Path(
        "wb_out"
    ),
    theme: Annotated[str | None, typer.Option("--theme", help="Theme name from themes/.")] = None,
) -> None:
    """Open the workbench app on two dumps (ingested and compared first) or on an existing catalog."""
    from workbench.catalog import CATALOG_NAME

    def go() -> int:
        from workbench.app.launch import launch

        if test is None:
            if golden.is_dir():
                cat = golden / CATALOG_NAME
                if not cat.exists():
                    raise ValueError(f"{golden}: a dump folder needs a TEST folder too (or pass a catalog file)")
                return launch(catalog=cat, theme=theme)
            if not golden.exists():
                raise ValueError(f"{golden}: no such catalog")
            return launch(catalog=golden, theme=theme)
        for p in (golden, test):
            if not p.exists():
                raise ValueError(f"{p}: no such folder")
        out.mkdir(parents=True, exist_ok=True)
        return launch(catalog=out / CATALOG_NAME, golden=golden, test=test, mapping=mapping, theme=theme)

    code = guarded(go)
    if code:
        raise typer.Exit(code)


@app.command()
def demo(
    out: Annotated[Path, typer.Option("--out", "-o", help="Folder for the demo dumps and catalog.")] = Path("wb_demo"),
    no_tui: Annotated[bool, typer.Option("--no-tui", help="Stop after the summary; do not open the app.")] = False,
    defect: Annotated[
        str | None, typer.Option("--defect", help="Planted defect (see `wb demo --list-defects`).")
    ] = None,
    stack: Annotated[
        str, typer.Option("--stack", help="Test stack: atb (ATB-structured, bf16) or torch (HF bf16).")
    ] = "atb",
    list_defects: Annotated[bool, typer.Option("--list-defects", help="List the defects the demo can plant.")] = False,
    theme: Annotated[str | None, typer.Option("--theme", help="Theme for the app.")] = None,
) -> None:
    """Build a small Llama, dump a golden (fp32) and a test run (bf16, one planted defect), compare, open the app."""
    from workbench import demo as demo_mod

    if list_defects:
        for name, text in demo_mod.available_defects(stack).items():
            typer.echo(f"{name:16s} {text}")
        return

    def go() -> Any:
        plan = demo_mod.make_demo(out, stack=stack, defect=defect, log=typer.echo)
        res = run_compare_cli(plan.golden, plan.test, out, plan.mapping, None, None, None)
        typer.echo(f"planted defect: {plan.description}")
        typer.echo(f"expected: error born at {plan.expected} (token {plan.expected_token})")
        return res

    res = guarded(go)
    interactive = sys.stdin.isatty() and sys.stdout.isatty() and not os.environ.get("CI")
    if no_tui or not interactive:
        return
    from workbench.catalog import CATALOG_NAME

    def launch_app() -> int:
        from workbench.app.launch import launch

        return launch(catalog=out / CATALOG_NAME, theme=theme, cmp_id=res.cmp_id)

    code = guarded(launch_app)
    if code:
        raise typer.Exit(code)


def main() -> None:
    """The `wb` console script. Ends the process without the interpreter's teardown: every catalog and
    file is closed by then, and tearing down pandas/DuckDB/numpy objects costs ~0.15 s per command."""
    code: int = 0
    try:
        app()
    except SystemExit as exc:
        code = exc.code if isinstance(exc.code, int) else (0 if exc.code is None else 1)
        if isinstance(exc.code, str):
            sys.stderr.write(exc.code + "\n")
    for stream in (sys.stdout, sys.stderr):
        with contextlib.suppress(Exception):
            stream.flush()
    os._exit(code)


if __name__ == "__main__":
    main()
