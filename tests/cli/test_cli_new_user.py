"""What a new user typed wrong or misread (issue 14), through the real CLI: a subprocess where the command does
its work, typer's CliRunner (`invoke_wb`) where it refuses before any work.

Each wrong input gets one clear line and a non-zero exit before any work; each number that could be
misread says what it counts.
"""

from __future__ import annotations

import csv
import io
import os
import signal
import sys
from pathlib import Path

import duckdb
import pytest
import typer

from tests.conftest import invoke_wb, run_python, run_wb
from tests.fixtures.app_catalogs import DEFECT


def test_precheck_finds_the_ops_below_any_level(demo_catalog: Path) -> None:
    demo = demo_catalog.parent
    res = run_wb("precheck", str(demo))  # the demo folder: two levels above the token folders
    assert res.returncode == 1, res.stderr  # the planted RMSNorm disagrees with its own re-run
    assert "token 1: 11_Decoder_layer/3_RmsNormOperation" in res.stdout
    assert "0 ops re-run" not in res.stdout
    device = next((demo / "test").glob("msit_dump_*/tensors/*_*"))
    res = run_wb("precheck", str(device), "--all")
    assert "skip" not in res.stdout and f"skip  {device.name}" not in res.stdout
    assert "token 0: " in res.stdout and res.returncode == 1
    empty = demo / "test" / "not_a_dump"
    empty.mkdir(exist_ok=True)
    res = invoke_wb("precheck", str(empty))  # nothing to re-run below: a clear line and a non-zero exit
    empty.rmdir()
    assert res.returncode == 2 and res.stdout == "" and res.stderr.count("\n") == 1, res.stderr


def test_demo_rejects_an_unknown_defect_before_any_work(tmp_path: Path) -> None:
    out = tmp_path / "demo"
    res = invoke_wb("demo", "--defect", "bogus", "--out", str(out), "--no-tui")
    assert res.returncode == 2 and not out.exists()  # nothing built, nothing deleted
    assert res.stderr.strip().count("\n") == 0 and "--defect 'bogus'" in res.stderr and "rmsnorm_eps" in res.stderr
    res = invoke_wb("demo", "--defect", "down_proj", "--out", str(out), "--no-tui")  # a torch-stack defect
    assert res.returncode == 2 and "is a defect of --stack torch" in res.stderr and not out.exists()
    listing = invoke_wb("demo", "--list-defects").stdout
    assert "--stack atb" in listing and "--stack torch" in listing
    atb, torch_part = listing.split("--stack torch:")
    assert "  none " in atb and "rmsnorm_eps" in atb and "down_proj" in torch_part


def test_compare_tokens_the_dumps_lack(demo_catalog: Path, tmp_path: Path) -> None:
    demo = demo_catalog.parent
    out = tmp_path / "out"
    res = invoke_wb("compare", "-gp", str(demo / "golden"), "-mp", str(demo / "test"), "--tokens", "7", "-o", str(out))
    assert res.returncode == 2
    assert "--tokens 7: the dumps have no such token; they hold tokens 0-3" in res.stderr
    assert not list(out.glob("*.csv")) if out.exists() else True  # no header-only report


def test_open_takes_the_compare_options_with_two_dumps_only(demo_catalog: Path, tmp_path: Path) -> None:
    """`wb open`'s compare options go into the app's compare request; argument checks, run in process through
    typer's CliRunner (no app starts: each fails first)."""
    res = invoke_wb("open", str(demo_catalog), "--tokens", "0")
    assert res.returncode == 2 and "--tokens, --workers and --thresholds apply when comparing two dumps" in res.stderr
    demo, out = demo_catalog.parent, tmp_path / "o"
    res = invoke_wb("open", str(demo / "golden"), str(demo / "test"), "--tokens", "3-1", "-o", str(out))
    assert res.returncode == 2 and "--tokens '3-1': range 3-1 goes backwards" in res.stderr
    assert not out.exists()  # refused before anything was written


def test_query_open_version_and_help(demo_catalog: Path, tmp_path: Path) -> None:
    res = invoke_wb("query", "nonexistent_query", "-c", str(demo_catalog))
    assert res.returncode == 2 and "'nonexistent_query': no saved query by that name" in res.stderr
    assert "Parser Error" not in res.stderr
    bad = tmp_path / "x.csv"
    bad.write_text("a,b\n1,2\n")
    res = invoke_wb("open", str(bad))
    assert res.returncode == 2 and res.stderr.count("\n") == 1
    assert "x.csv: not a DuckDB catalog" in res.stderr and "in-memory" not in res.stderr
    res = invoke_wb("open", str(demo_catalog), "--cmp", "5")
    assert res.returncode == 2 and "no comparison 5 (have 1)" in res.stderr
    res = invoke_wb("--version")
    assert res.returncode == 0 and res.stdout.startswith("wb ")
    help_open = invoke_wb("open", "--help").stdout
    assert "GOLDEN [TEST]" in help_open and "{golden}" not in help_open and "--cmp" in help_open
    help_demo = invoke_wb("demo", "--help").stdout
    assert "--no-tui" in help_demo and "<bool>" not in help_demo


def test_a_named_command_is_built_alone_and_the_others_stay_reachable() -> None:
    """`wb`'s `main` builds only the command a line names; a misspelt name still gets typer's suggestion, and
    `--help` lists every command."""
    res = run_wb("compar")
    assert res.returncode == 2 and res.stdout == ""
    assert res.stderr.startswith("wb: error: No such command 'compar'. Did you mean 'compare'? (see `")
    assert res.stderr.endswith(" --help`)\n") and res.stderr.count("\n") == 1  # (`python -m workbench.cli` here)
    listed = run_wb("--help").stdout
    assert all(name in listed for name in ("compare", "open", "demo", "report", "queries", "ingest"))
    res = run_wb("report", "--help")
    assert res.returncode == 0 and "Usage: " in res.stdout and "report" in res.stdout


def test_in_process_runs_leave_no_trace(tmp_path: Path) -> None:
    """`invoke_wb` (the in-process runs above) puts back what `wb` changes: WB_DEBUG from `--debug`, the working
    directory, sys.argv and the signal handlers, so the tests that share the process stay independent."""
    before = (dict(os.environ), os.getcwd(), list(sys.argv), signal.getsignal(signal.SIGINT))
    res = invoke_wb("--debug", "--version", cwd=tmp_path)
    assert res.returncode == 0 and res.stdout.startswith("wb ") and res.stderr == ""
    assert (dict(os.environ), os.getcwd(), list(sys.argv), signal.getsignal(signal.SIGINT)) == before


def test_one_default_catalog_for_ingest_and_query(demo_catalog: Path, tmp_path: Path) -> None:
    demo = demo_catalog.parent
    res = run_wb("ingest", str(demo / "golden"), cwd=tmp_path)
    assert res.returncode == 0, res.stderr
    assert (tmp_path / "wb_out" / "catalog.duckdb").exists() and not (tmp_path / "catalog.duckdb").exists()
    res = run_wb("query", "SELECT count(*) AS n FROM runs", "-f", "csv", cwd=tmp_path)
    assert res.returncode == 0 and res.stdout.split() == ["n", "1"]


def test_numbers_that_could_disagree_say_what_they_count(demo_catalog: Path) -> None:
    con = duckdb.connect(str(demo_catalog), read_only=True)
    rows, pairs = con.execute(
        "SELECT count(*), count(DISTINCT (golden_node_id, test_node_id)) FROM node_matches"
    ).fetchone()  # type: ignore[misc]
    con.close()
    assert rows == pairs  # one row per node pair (docs/catalog.md)
    res = run_wb("query", "layer_error_growth", "-c", str(demo_catalog), "-f", "csv")
    table = list(csv.DictReader(io.StringIO(res.stdout)))
    assert table and all(r["failed_outputs"].isdigit() for r in table)  # counts, not `6.0`


def test_nan_inf_locations_start_where_the_nan_is_made(small_catalog: Path) -> None:
    res = run_wb("query", "nan_inf_locations", "-c", str(small_catalog), "-f", "csv")
    rows = list(csv.DictReader(io.StringIO(res.stdout)))
    assert rows, res.stderr
    first = rows[0]
    # the op that made the NaN comes before the layer that holds it
    assert first["golden_node"] == DEFECT and first["io"] == "out"


def test_first_divergent_token_says_nothing_when_every_token_passes(small_catalog: Path) -> None:
    # the logits table as `wb compare` fills it: token 0 passes, token 1 fails
    con = duckdb.connect(str(small_catalog))
    cmp_id = con.execute("SELECT max(cmp_id) FROM comparisons").fetchall()[0][0]
    con.execute("DELETE FROM logits WHERE cmp_id = ?", [cmp_id])
    con.execute(
        "INSERT INTO logits (cmp_id, token_id, cosine_similarity, kl_divergence, passed) "
        "VALUES (?, 0, 0.99999, 1e-6, true), (?, 1, 0.98, 0.02, false)",
        [cmp_id, cmp_id],
    )
    con.close()
    res = run_wb("query", "first_divergent_token", "-c", str(small_catalog), "-f", "csv")
    assert res.stdout.splitlines()[1].split(",")[0] == "1"  # the first token whose logits fail
    con = duckdb.connect(str(small_catalog))
    con.execute("UPDATE logits SET passed = true")
    con.close()
    res = run_wb("query", "first_divergent_token", "-c", str(small_catalog))
    assert res.returncode == 0 and res.stdout.strip() == "(no rows)"  # never a passing token


def test_ctrl_c_while_the_command_line_loads_is_one_line() -> None:
    """A Ctrl-C that lands while Python imports typer and the commands (the first ~0.2 s of every `wb`) ends
    like any other: `wb: interrupted`, exit 130, no traceback. The signal is real, sent when typer is imported."""
    code = (
        "import os, signal, sys\n"
        "class Interrupt:\n"
        "    def find_spec(self, name, path=None, target=None):\n"
        "        if name == 'typer':\n"
        "            sys.meta_path.remove(self)\n"
        "            os.kill(os.getpid(), signal.SIGINT)\n"
        "        return None\n"
        "sys.meta_path.insert(0, Interrupt())\n"
        "sys.argv = ['wb', '--help']\n"
        "from workbench.launch import main\n"
        "main()\n"
    )
    out = run_python(code)
    assert (out.returncode, out.stderr, out.stdout) == (130, "wb: interrupted\n", "")


def test_an_interrupt_typer_swallows_still_says_so() -> None:
    """typer turns an interrupt during its parsing into a silent exit 130; `main` finds it behind the exit and says
    `wb: interrupted` (or `terminated` for SIGTERM, exit 143) instead of ending without a word."""
    from workbench.cli import _interrupt_typer_swallowed, _say_interrupted
    from workbench.cli.common import Terminated

    for raised, want in ((KeyboardInterrupt(), 130), (Terminated(), 143)):
        with pytest.raises(SystemExit) as ended:
            _raising_app(raised)(["--value", "3"])
        assert ended.value.code == 130
        interrupt = _interrupt_typer_swallowed(ended.value)
        assert interrupt is raised and _say_interrupted(interrupt) == want
    plain = typer.Typer()

    @plain.command()
    def wrong(value: int = 0) -> None:
        pass

    with pytest.raises(SystemExit) as usage:
        plain(["--value", "x"])  # a usage error: exit 2, no interrupt behind it
    assert usage.value.code == 2 and _interrupt_typer_swallowed(usage.value) is None


def _raising_app(exc: BaseException) -> typer.Typer:
    """A one-command typer app whose command raises `exc` (as a signal handler would, mid-parse)."""
    demo = typer.Typer()

    @demo.command()
    def parse(value: int = 0) -> None:
        raise exc

    return demo


def test_usage_errors_are_one_line_naming_the_help_to_read(tmp_path: Path) -> None:
    """An unknown option, a missing value or option, a value of the wrong kind: one `wb: error:` line and exit 2, as
    bad input is everywhere else; `wb` alone still shows the help."""
    cases = [
        (("report", "--bogus"), "No such option: --bogus (see `wb report --help`)"),
        (("compare", "-gp"), "Option '-gp' requires an argument (see `wb compare --help`)"),
        (("compare", "-mp", str(tmp_path)), "Missing option '-gp' / '--golden-path' (see `wb compare --help`)"),
        (("query",), "Missing argument 'sql' (see `wb query --help`)"),
        (("--bogus",), "No such option: --bogus (see `wb --help`)"),
    ]
    for args, message in cases:
        res = invoke_wb(*args)
        assert (res.returncode, res.stdout, res.stderr) == (2, "", f"wb: error: {message}\n"), args
    bad_int = invoke_wb("advise", "--top", "x")
    assert bad_int.returncode == 2 and bad_int.stderr.count("\n") == 1
    assert bad_int.stderr.startswith("wb: error: Invalid value for '--top' / '-k': ")
    bare = run_wb()
    assert bare.returncode == 2 and "Usage: " in bare.stdout and "[OPTIONS] COMMAND" in bare.stdout
