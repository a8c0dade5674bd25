"""The hostile-input set (issue 15): crafted files, broken catalogs, kills and full disks, one case each.

Every case builds its own input under a temporary folder, runs the real code (the CLI as a subprocess
where the promise is about what a user sees) and returns what it got and whether that is what a user
is promised. `tests/test_hostile.py` runs each as a test; `bench/hostile.py` prints them as a table.
"""

from __future__ import annotations

import contextlib
import hashlib
import os
import resource
import signal
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import TypeVar

import duckdb

from tests.hostile_files import (
    atb_dump,
    bin_with_dims,
    crafted_pth,
    deep_json,
    deep_toml,
    nested_folders,
    torch_dump,
)

T = TypeVar("T")
ROOT = Path(__file__).resolve().parents[1]
WB = [sys.executable, "-m", "workbench.cli"]
MODULES = ["root.a", "root.b", "root.c"]


@dataclass(frozen=True)
class Outcome:
    got: str
    ok: bool


@dataclass(frozen=True)
class Case:
    item: int  # the item number
    name: str
    expected: str
    run: Callable[[Path], Outcome]
    needs_root: bool = False


CASES: list[Case] = []


def case(item: int, name: str, expected: str, needs_root: bool = False) -> Callable[..., Callable[[Path], Outcome]]:
    def deco(fn: Callable[[Path], Outcome]) -> Callable[[Path], Outcome]:
        CASES.append(Case(item, name, expected, fn, needs_root))
        return fn

    return deco


# ---------------------------------------------------------------------------------------------- helpers


def wb(*args: str | Path, timeout: int = 240, **kw: object) -> subprocess.CompletedProcess[str]:
    """The real CLI, as a subprocess."""
    env = {**os.environ, "PYTHONPATH": str(ROOT), "COLUMNS": "200", "PYTHONDONTWRITEBYTECODE": "1"}
    return subprocess.run(  # type: ignore[call-overload, no-any-return]
        [*WB, *map(str, args)], capture_output=True, text=True, cwd=ROOT, env=env, timeout=timeout, **kw
    )


def one_line_error(r: subprocess.CompletedProcess[str], *needles: str, code: int = 2) -> Outcome:
    """rc `code`, exactly one stderr line starting `wb: error:` holding every needle, no traceback."""
    err = r.stderr.strip()
    lines = err.splitlines()
    ok = (
        r.returncode == code
        and len(lines) == 1
        and lines[0].startswith("wb: error:")
        and "Traceback" not in r.stderr + r.stdout
        and all(n in err for n in needles)
    )
    return Outcome(f"rc {r.returncode}: {err[:150]}", ok)


def problem_lines(out: str, needle: str) -> list[str]:
    return [ln for ln in out.splitlines() if ln.startswith("problem:") and needle in ln]


def pair_pair(tmp: Path, tokens: list[int] | None = None) -> tuple[Path, Path]:
    """A golden and a test torch dump of three modules (outputs differ a little)."""
    toks = tokens or [0, 1]
    g = torch_dump(tmp / "golden" / "cpu_1", MODULES, toks)
    t = torch_dump(tmp / "test" / "cpu_1", MODULES, toks, seed=5, noise=1e-4)
    return g, t


def compared_pairs(catalog: Path) -> int:
    con = duckdb.connect(str(catalog), read_only=True)
    try:
        row = con.execute("SELECT count(*) FROM comparison WHERE passed IS NOT NULL").fetchone()
    finally:
        con.close()
    return int(row[0]) if row else 0


def make_catalog(tmp: Path) -> Path:
    from workbench.catalog.store import open_catalog

    cat = tmp / "catalog.duckdb"
    open_catalog(cat).close()
    return cat


@contextlib.contextmanager
def small_disk(mount: Path, size_kb: int) -> Iterator[str]:
    """A small tmpfs at `mount` (root only); yields how the full disk is simulated."""
    mount.mkdir(parents=True, exist_ok=True)
    r = subprocess.run(["mount", "-t", "tmpfs", "-o", f"size={size_kb}k", "tmpfs", str(mount)], capture_output=True)
    if r.returncode != 0:
        raise OSError("cannot mount a tmpfs")
    try:
        yield "tmpfs"
    finally:
        subprocess.run(["umount", "-l", str(mount)], capture_output=True)


def can_mount() -> bool:
    if os.geteuid() != 0:
        return False
    probe = Path(f"/tmp/wb-mount-probe-{os.getpid()}")
    try:
        with small_disk(probe, 64):
            return True
    except OSError:
        return False
    finally:
        with contextlib.suppress(OSError):
            probe.rmdir()


def fill(folder: Path) -> Path:
    """Fill the file system of `folder` to the last byte."""
    filler = folder / "filler"
    with open(filler, "wb", buffering=0) as fh:
        for chunk in (65536, 1):
            with contextlib.suppress(OSError):
                while True:
                    fh.write(b"\0" * chunk)
    return filler


def fsize_limit(limit: int) -> Callable[[], None]:
    """A subprocess pre-exec: files may not grow past `limit` bytes, and SIGXFSZ is ignored (writes fail EFBIG)."""

    def pre() -> None:
        signal.signal(signal.SIGXFSZ, signal.SIG_IGN)
        resource.setrlimit(resource.RLIMIT_FSIZE, (limit, limit))

    return pre


# ---------------------------------------------------------------------------------------------- 1 SQL


_ESCAPES = {
    "COPY TO": "COPY (SELECT 1) TO '{out}/copied.csv'",
    "EXPORT DATABASE": "EXPORT DATABASE '{out}/exported'",
    "SET log_query_path": "SET log_query_path = '{out}/log.txt'",
    "read_csv": "SELECT * FROM read_csv('/etc/passwd')",
    "read_blob": "SELECT * FROM read_blob('/etc/hostname')",
    "read_text": "SELECT * FROM read_text('/etc/hostname')",
    "glob": "SELECT * FROM glob('/etc/*')",
    "INSTALL httpfs": "INSTALL httpfs",
    "ATTACH sqlite": "ATTACH '{out}/x.sqlite' AS s (TYPE sqlite)",
    "ATTACH duckdb": "ATTACH '{out}/other.duckdb' AS o",
    "re-enable access": "SET enable_external_access = true",
    "profiling output": "PRAGMA enable_profiling = 'json'",
}


def _sql_escape(label: str, sql: str) -> Callable[[Path], Outcome]:
    def run(tmp: Path) -> Outcome:
        from workbench.analysis.queries import run_query

        cat = make_catalog(tmp)
        out = tmp / "out"
        out.mkdir()
        duckdb.connect(str(out / "other.duckdb")).close()
        import sqlite3

        sqlite3.connect(out / "x.sqlite").close()
        before = sorted(p.name for p in out.iterdir())
        try:
            text = run_query(cat, sql.format(out=out))
            return Outcome(f"ran: {text.strip()[:80]}", False)
        except ValueError as exc:
            msg = str(exc)
        created = sorted(p.name for p in out.iterdir()) != before
        return Outcome(msg[:140], "\n" not in msg and not created and msg.startswith("SQL error"))

    return run


for _label, _sql in _ESCAPES.items():
    case(1, f"SQL: {_label}", "refused, one line, no file written")(_sql_escape(_label, _sql))


@case(1, "SQL: app console connection", "catalog.readonly.connect_read_only (the Explorer's) is the confined one")
def _explore_confined(tmp: Path) -> Outcome:
    from workbench.catalog.readonly import connect_read_only

    con = connect_read_only(make_catalog(tmp))
    try:
        con.execute("SELECT * FROM read_text('/etc/hostname')").fetchall()
        return Outcome("read /etc/hostname", False)
    except duckdb.Error as exc:
        return Outcome(str(exc).splitlines()[0][:120], "disabled by configuration" in str(exc))
    finally:
        con.close()


@case(1, "SQL: wb query --attach", "named CSV and DuckDB files usable, nothing else")
def _attach(tmp: Path) -> Outcome:
    cat = make_catalog(tmp)
    (tmp / "extra.csv").write_text("a,b\n1,2\n3,4\n")
    other = duckdb.connect(str(tmp / "side.duckdb"))
    other.execute("CREATE TABLE t AS SELECT 42 AS x")
    other.close()
    r = wb(
        "query",
        "SELECT (SELECT CAST(sum(a) AS INTEGER) FROM extra) AS s, (SELECT x FROM side.t) AS x",
        "-c",
        cat,
        "--attach",
        tmp / "extra.csv",
        "--attach",
        tmp / "side.duckdb",
        "-f",
        "csv",
    )
    r2 = wb("query", "SELECT * FROM read_csv('/etc/passwd')", "-c", cat, "--attach", tmp / "extra.csv")
    ok = r.returncode == 0 and "4,42" in r.stdout and r2.returncode == 2 and "root:" not in r2.stdout + r2.stderr
    return Outcome(f"rc {r.returncode} {r.stdout.strip()[-10:]!r}; other file: rc {r2.returncode}", ok)


# ---------------------------------------------------------------------------------------------- 2 stray files


@case(2, "compare with stray files", "one problem line per file; every good pair compared")
def _stray(tmp: Path) -> Outcome:
    g, t = pair_pair(tmp)
    bad = t / "0" / "root.b"
    crafted_pth(bad / "output_1.pth", (2**63,), (1,))  # dimension >= 2^63
    crafted_pth(bad / "output_2.pth", (-5, 3), (3, 1))  # negative dimension
    crafted_pth(bad / "output_3.pth", (2**30, 2**30), (0, 0))  # stride-0 view of 2^60 elements
    for d in ("99999999999", "\u00b2", "\u0663"):  # INT32 overflow, superscript two, Arabic-Indic three
        (t / d / "root.a").mkdir(parents=True)
        crafted_pth(t / d / "root.a" / "output.pth", (2, 2), (2, 1))
    raw = os.fsencode(t / "0") + b"/root.\xff\xfe"  # a folder name that is not UTF-8
    os.mkdir(raw)
    crafted_pth(Path(os.fsdecode(raw)) / "output.pth", (2, 2), (2, 1))
    out = tmp / "out"
    r = wb("compare", "-gp", g, "-mp", t, "-o", out)
    wanted = ["output_1.pth", "output_2.pth", "output_3.pth", "99999999999", "\u00b2", "\u0663", "root.\\xff\\xfe"]
    missing = [w for w in wanted if len(problem_lines(r.stdout, w)) != 1]
    n = compared_pairs(out / "catalog.duckdb") if (out / "catalog.duckdb").exists() else 0
    ok = r.returncode == 0 and not missing and n >= 2 * len(MODULES) * 2 and "Traceback" not in r.stderr
    return Outcome(f"rc {r.returncode}, {n} pairs judged, missing lines: {missing}", ok)


@case(2, "ATB .bin stats header with a huge dim", "one problem line naming the file")
def _bin_huge(tmp: Path) -> Outcome:
    from workbench.formats import open_dump

    root = atb_dump(tmp / "msit_dump_1")
    op = root / "tensors" / "0_77" / "0" / "0_Prefill_layer" / "0_RmsNormOperation"
    bin_with_dims(op / "after" / "outtensor1.bin", [2**63, 2], stats=True)
    d = open_dump(root)
    lines = [p for p in d.problems if "outtensor1.bin" in p]
    good = [x for x in d.tensors if x.error is None]
    return Outcome("; ".join(lines)[-90:], len(lines) == 1 and "2^62" in lines[0] and len(good) == 2)


@case(2, "msprobe ATB statistic.csv with crafted rows", "one problem line per row or file; good rows read")
def _atb_csv_rows(tmp: Path) -> Outcome:
    from workbench.formats import atb_csv, open_dump

    dev = tmp / "atb_dump_data" / "data" / "0_77"
    good = "0_77,{n},Prefill_layer/RmsNormOperation,RmsNormOperation,0_0,output,0,float,nd,2x4,1,0,0.5,2,N/A"
    rows = {
        "0": [good.format(n=0), "0_77,0,A,A,0,output,0,float,nd,99999999999999999999x2,1,0,0,1,N/A",
              "0_77,0,A,A,0,output,1,float,nd," + "x".join(["1"] * 40) + ",1,0,0,1,N/A",
              "0_77,0,A/B,B,0,input,0,float,nd,2,1,0,0,1,N/A"],  # two names, one id
        "1": [good.format(n=1) + "\udcff"],  # a byte that is not UTF-8: the file is not read
    }  # fmt: skip
    for n, lines in rows.items():
        (dev / n).mkdir(parents=True)
        text = ",".join(atb_csv.HEADER) + "\n" + "\n".join(lines) + "\n"
        (dev / n / atb_csv.STATS_FILE).write_bytes(text.encode("utf-8", "surrogateescape"))
    d = open_dump(tmp / "atb_dump_data")
    lines = [p for p in d.problems if atb_csv.STATS_FILE in p]
    ok = (
        len(lines) == 4
        and sum(":3:" in p or ":4:" in p or ":5:" in p for p in lines) == 3
        and [(t.token, t.node) for t in d.tensors] == [(0, "0_Prefill_layer/0_RmsNormOperation")]
    )
    return Outcome(f"{len(lines)} lines, {len(d.tensors)} tensors: " + "; ".join(lines)[-120:], ok)


# ---------------------------------------------------------------------------------------------- 3 bounded work


@case(3, "directory symlink loops in an ATB op folder", "not followed, one line each, reads at once")
def _dir_links(tmp: Path) -> Outcome:
    from workbench.formats import open_dump

    root = atb_dump(tmp / "msit_dump_1")
    op = root / "tensors" / "0_77" / "0" / "0_Prefill_layer"
    os.symlink(".", op / "1_LoopOperation")
    os.symlink(".", op / "2_LoopOperation")
    d = open_dump(root)
    lines = [p for p in d.problems if "symbolic link to a folder" in p]
    return Outcome(f"{len(lines)} lines, {len(d.nodes)} nodes", len(lines) == 2 and len(d.nodes) == 2)


@case(3, "--tokens 0-20000000 on a 2-token dump", "compares the 2 tokens, small memory")
def _token_range(tmp: Path) -> Outcome:
    g, t = pair_pair(tmp)
    before = resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss
    r = wb("compare", "-gp", g, "-mp", t, "-o", tmp / "out", "--tokens", "0-20000000")
    peak_kb = resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss
    grew = peak_kb > before
    n = compared_pairs(tmp / "out" / "catalog.duckdb") if r.returncode == 0 else 0
    ok = r.returncode == 0 and n == 2 * len(MODULES) * 2 and (not grew or peak_kb < 1_500_000)
    return Outcome(f"rc {r.returncode}, {n} pairs, peak RSS {peak_kb // 1024} MB", ok)


# ---------------------------------------------------------------------------------------------- 4 pool


def _descendants(pid: int) -> list[int]:
    kids: dict[int, list[int]] = {}
    for p in os.listdir("/proc"):
        if p.isdigit():
            try:
                ppid = int(Path(f"/proc/{p}/stat").read_text().rsplit(")", 1)[1].split()[1])
            except (OSError, IndexError, ValueError):
                continue
            kids.setdefault(ppid, []).append(int(p))
    out, stack = [], [pid]
    while stack:
        for k in kids.get(stack.pop(), []):
            out.append(k)
            stack.append(k)
    return out


def _running(pid: int) -> bool:
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except OSError:
        return False
    return state != "Z"


def big_pair(tmp: Path) -> tuple[Path, Path]:
    """Dumps big enough for `wb compare` to start its process pool (32 MB golden, 16 MB test)."""
    import torch

    dumps = []
    for side, seed in (("golden", 1), ("test", 2)):
        dev = tmp / side / "cpu_1"
        torch_dump(dev, MODULES, [0])
        gen = torch.Generator().manual_seed(seed)
        for m in MODULES:
            torch.save(torch.randn(3 << 20, generator=gen), dev / "0" / m / "output_1.pth")
        dumps.append(dev)
    return dumps[0], dumps[1]


def _start_piped_compare(tmp: Path, sig: int) -> tuple[subprocess.Popen[bytes], int, list[int]]:
    g, t = big_pair(tmp)
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    cmd = f"'{sys.executable}' -m workbench.cli compare -gp '{g}' -mp '{t}' -o '{tmp / 'out'}' -j 2 | cat"
    p = subprocess.Popen(
        ["sh", "-c", cmd], stdout=subprocess.PIPE, stderr=subprocess.PIPE, env=env, start_new_session=True
    )
    main, family, t0 = 0, [], time.monotonic()
    while time.monotonic() - t0 < 120 and p.poll() is None:
        for d in _descendants(p.pid):
            with contextlib.suppress(OSError):
                if b"workbench.cli" in Path(f"/proc/{d}/cmdline").read_bytes():
                    main = d
        if main:
            family = _descendants(main)
            if len(family) >= 3:  # resource tracker, forkserver, a worker
                break
        time.sleep(0.01)
    if main:
        os.kill(main, sig)
    return p, main, family


def _orphans(tmp: Path, sig: int) -> Outcome:
    p, _main, family = _start_piped_compare(tmp, sig)
    if len(family) < 3:
        p.communicate(timeout=300)
        return Outcome(f"the pool never started (children seen: {len(family)})", False)
    try:
        _out, err = p.communicate(timeout=20)
        ended = True
    except subprocess.TimeoutExpired:
        ended, err = False, b""
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline and any(_running(c) for c in family):
        time.sleep(0.1)
    left = [c for c in family if _running(c)]
    for c in left:
        with contextlib.suppress(OSError):
            os.kill(c, signal.SIGKILL)
    if not ended:
        with contextlib.suppress(OSError):
            os.killpg(p.pid, signal.SIGKILL)
        p.communicate()
    text = err.decode(errors="replace").strip().splitlines()
    ok = ended and not left
    if sig == signal.SIGTERM:
        ok = ok and bool(text) and "terminated" in text[-1] and "Traceback" not in err.decode(errors="replace")
    got = f"{len(family)} pool processes, {len(left)} left after kill; `| cat` {'ended' if ended else 'hangs'}"
    return Outcome(got + (f"; {text[-1][:60]}" if sig == signal.SIGTERM and text else ""), ok)


@case(4, "kill -9 wb during compare", "pool processes gone within seconds, `| cat` ends")
def _kill9(tmp: Path) -> Outcome:
    return _orphans(tmp, signal.SIGKILL)


@case(4, "SIGTERM wb during compare", "ends like Ctrl-C: one line, pool gone")
def _sigterm(tmp: Path) -> Outcome:
    return _orphans(tmp, signal.SIGTERM)


# ---------------------------------------------------------------------------------------------- 5 shapes


@case(5, ".bin with 100 dims and negative .pth dims", "one problem line each")
def _shapes(tmp: Path) -> Outcome:
    from workbench.formats import open_dump

    root = atb_dump(tmp / "msit_dump_1")
    op = root / "tensors" / "0_77" / "0" / "0_Prefill_layer" / "0_RmsNormOperation"
    bin_with_dims(op / "after" / "outtensor1.bin", [1] * 100)
    d = open_dump(root)
    dev = torch_dump(tmp / "torch" / "cpu_1", MODULES, [0])
    crafted_pth(dev / "0" / "root.a" / "output_1.pth", (-1, 4), (4, 1))
    d2 = open_dump(dev)
    a = [p for p in d.problems if "outtensor1.bin" in p and "100 dimensions" in p]
    b = [p for p in d2.problems if "output_1.pth" in p and "negative" in p]
    return Outcome(f"{len(a)} + {len(b)} lines", len(a) == 1 and len(b) == 1)


@case(5, "token folders named ² and ٣", "ignored with a line; ٣ is not token 3")
def _unicode_tokens(tmp: Path) -> Outcome:
    from workbench.formats import open_dump

    dev = torch_dump(tmp / "cpu_1", MODULES, [0])
    for name in ("\u00b2", "\u0663"):
        (dev / name / "root.a").mkdir(parents=True)
        crafted_pth(dev / name / "root.a" / "output.pth", (2, 2), (2, 1))
    d = open_dump(dev)
    lines = [p for p in d.problems if "not ASCII digits" in p]
    return Outcome(f"tokens {d.tokens}, {len(lines)} lines", d.tokens == [0] and len(lines) == 2)


@case(5, "wb precheck on an op with a 100-dim input", "one line naming the file, no traceback")
def _precheck_dims(tmp: Path) -> Outcome:
    root = atb_dump(tmp / "msit_dump_1")
    op = root / "tensors" / "0_77" / "0" / "0_Prefill_layer" / "0_RmsNormOperation"
    bin_with_dims(op / "before" / "intensor0.bin", [1] * 100)
    (op / "op_param.json").write_text('{"layerType": 1}')
    r = wb("precheck", op, "--all")
    out = r.stdout + r.stderr
    ok = r.returncode == 4 and "Traceback" not in out and "intensor0.bin" in out and "100 dimensions" in out
    return Outcome(f"rc {r.returncode}: {out.strip().splitlines()[0][:120] if out.strip() else ''}", ok)


# ---------------------------------------------------------------------------------------------- 6 nesting

DEEP = 100_000


def _deep_reader(target: str) -> Callable[[Path], Outcome]:
    def run(tmp: Path) -> Outcome:
        from workbench.formats import open_dump

        if target == "model_tree.json" or target == "wb_manifest.json":
            dev = torch_dump(tmp / "cpu_1", MODULES, [0])
            (dev / target).write_text(deep_json(DEEP))
            d = open_dump(dev)
        else:
            root = atb_dump(tmp / "msit_dump_1")
            op = root / "tensors" / "0_77" / "0" / "0_Prefill_layer" / "0_RmsNormOperation"
            path = root / "model" / "77" / "prefill.json" if target == "ATB model JSON" else op / "op_param.json"
            path.write_text('{"nodes": ' + deep_json(DEEP) + "}")
            d = open_dump(root)
        lines = [p for p in d.problems if "nested too deeply" in p]
        return Outcome("; ".join(lines)[-80:], len(lines) == 1 and bool(d.tensors))

    return run


for _t in ("model_tree.json", "wb_manifest.json", "ATB model JSON", "op_param.json"):
    case(6, f"{_t} nested 10^5 deep", "one problem line, the dump still read")(_deep_reader(_t))


@case(6, "-mf mapping and --thresholds TOML nested 10^5 deep", "one error line each, no RecursionError")
def _deep_options(tmp: Path) -> Outcome:
    g, t = pair_pair(tmp)
    (tmp / "map.json").write_text('{"x": ' + deep_json(DEEP) + "}")
    (tmp / "th.toml").write_text(deep_toml(DEEP))
    r1 = wb("compare", "-gp", g, "-mp", t, "-o", tmp / "o1", "-mf", tmp / "map.json")
    r2 = wb("compare", "-gp", g, "-mp", t, "-o", tmp / "o2", "--thresholds", tmp / "th.toml")
    a, b = one_line_error(r1, "map.json", "nested"), one_line_error(r2, "th.toml", "nested")
    return Outcome(f"{a.got[:60]} | {b.got[:60]}", a.ok and b.ok)


@case(6, "1100 nested ATB op folders", "read and precheck: skipped with one line, no RecursionError")
def _deep_folders(tmp: Path) -> Outcome:
    from workbench.formats import open_dump

    root = atb_dump(tmp / "msit_dump_1")
    layer = root / "tensors" / "0_77" / "0" / "0_Prefill_layer"
    nested_folders(layer, 1100)
    try:
        d = open_dump(root)
        r = wb("precheck", layer)
    finally:  # shutil.rmtree recurses: it cannot remove what this made
        subprocess.run(["rm", "-rf", str(layer / "0_A")], check=False)
    lines = [p for p in d.problems if "nested deeper" in p]
    out = r.stdout + r.stderr
    # the precheck skips the deep folder with its line and checks the rest (issue 21, item 7)
    # nothing under the deep folder was checked: precheck says so with its exit code 4 (EXIT_UNCHECKED)
    ok = len(lines) == 1 and "Traceback" not in out and "nested deeper" in out and r.returncode == 4
    return Outcome(f"reader: {len(lines)} line; precheck rc {r.returncode}", ok)


# ---------------------------------------------------------------------------------------------- 7 catalogs


@case(7, "foreign DuckDB file as the catalog", "refused, file untouched")
def _foreign(tmp: Path) -> Outcome:
    g, _t = pair_pair(tmp)
    foreign = tmp / "theirs.duckdb"
    con = duckdb.connect(str(foreign))
    con.execute("CREATE TABLE users AS SELECT 1 AS id, 'x' AS name")
    con.close()
    digest = hashlib.sha256(foreign.read_bytes()).hexdigest()
    r = wb("ingest", g, "-c", foreign)
    res = one_line_error(r, "theirs.duckdb", "another program")
    same = hashlib.sha256(foreign.read_bytes()).hexdigest() == digest
    return Outcome(res.got + ("" if same else " (file modified)"), res.ok and same)


@case(7, "catalog schema version 'abc'", "one line naming the file")
def _bad_version(tmp: Path) -> Outcome:
    cat = make_catalog(tmp)
    con = duckdb.connect(str(cat))
    con.execute("UPDATE meta SET value = 'abc' WHERE key = 'schema_version'")
    con.close()
    g, _t = pair_pair(tmp)
    a = one_line_error(wb("ingest", g, "-c", cat), "catalog.duckdb", "'abc'")
    b = one_line_error(wb("query", "SELECT 1", "-c", cat), "catalog.duckdb", "'abc'")
    return Outcome(f"{a.got[:70]} | query rc {b.got[:6]}", a.ok and b.ok)


@case(7, "corrupted catalog block", "one line, no _duckdb.Error traceback")
def _corrupt(tmp: Path) -> Outcome:
    g, t = pair_pair(tmp)
    out = tmp / "out"
    r0 = wb("compare", "-gp", g, "-mp", t, "-o", out)
    cat = out / "catalog.duckdb"
    data = bytearray(cat.read_bytes())
    for off in range(3 * 4096 + 64, len(data), 4096):  # every block after the headers
        data[off : off + 32] = b"\xa5" * 32
    cat.write_bytes(bytes(data))
    r1 = wb("compare", "-gp", g, "-mp", t, "-o", out)
    r2 = wb("query", "SELECT count(*) FROM tensors", "-c", cat)
    a, b = one_line_error(r1, "catalog.duckdb"), one_line_error(r2, "catalog.duckdb")
    return Outcome(f"compare {a.got[:70]} | query {b.got[:8]}", r0.returncode == 0 and a.ok and b.ok)


# ---------------------------------------------------------------------------------------------- 8 storage


@case(8, "-o is an existing file", "one line before any dump is read")
def _out_file(tmp: Path) -> Outcome:
    (tmp / "taken").write_text("x")
    r = wb("compare", "-gp", tmp / "nowhere", "-mp", tmp / "nowhere", "-o", tmp / "taken")
    return one_line_error(r, "taken", "existing file")  # the missing dumps were never looked at


@case(8, "-o on a read-only mount", "one line before any dump is read", needs_root=True)
def _out_ro(tmp: Path) -> Outcome:
    mnt = tmp / "ro"
    mnt.mkdir()
    if subprocess.run(["mount", "-t", "tmpfs", "-o", "ro,size=64k", "tmpfs", str(mnt)]).returncode != 0:
        return Outcome("cannot mount", False)
    try:
        r = wb("compare", "-gp", tmp / "nowhere", "-mp", tmp / "nowhere", "-o", mnt / "out")
    finally:
        subprocess.run(["umount", "-l", str(mnt)])
    return one_line_error(r, "out", "Read-only file system")


@case(8, "-o inside a 555 folder (as a user)", "one line before any dump is read")
def _out_555(tmp: Path) -> Outcome:
    import shutil
    import tempfile

    from workbench.jobs.compare_dumps import check_output_dir

    if os.geteuid() == 0:  # nobody must reach the folder: under /tmp itself, not a private test folder
        tmp = Path(tempfile.mkdtemp(prefix="wb-555-", dir="/tmp"))
    locked = tmp / "locked"
    locked.mkdir()
    locked.chmod(0o555)
    if os.geteuid() != 0:
        r = wb("compare", "-gp", tmp / "nowhere", "-mp", tmp / "nowhere", "-o", locked / "out")
        locked.chmod(0o755)
        return one_line_error(r, "out", "ermission denied")
    # root writes anywhere: the check runs in a child that became nobody (the interpreter may not be
    # reachable for nobody, so no new process)
    tmp.chmod(0o755)
    rd, wr = os.pipe()
    pid = os.fork()
    if pid == 0:  # pragma: no cover - the child
        os.close(rd)
        try:
            os.setgid(65534)
            os.setuid(65534)
            check_output_dir(locked / "out", locked / "out" / "catalog.duckdb")
            msg = "accepted"
        except ValueError as exc:
            msg = str(exc)
        except BaseException as exc:
            msg = f"crashed: {exc!r}"
        os.write(wr, msg.encode())
        os._exit(0)
    os.close(wr)
    with os.fdopen(rd, "rb") as fh:
        msg = fh.read().decode()
    os.waitpid(pid, 0)
    locked.chmod(0o755)
    shutil.rmtree(tmp, ignore_errors=True)
    return Outcome(msg[:140], "out" in msg and "ermission denied" in msg and "\n" not in msg)


def _full_disk(tmp: Path, what: str) -> Outcome:
    g, t = pair_pair(tmp)
    g2 = torch_dump(tmp / "golden2" / "cpu_1", MODULES, [0, 1, 2], seed=9)
    if can_mount():
        mnt = tmp / "small"
        with small_disk(mnt, 32768) as how:
            out = mnt / "out"
            out.mkdir()
            cat = out / "catalog.duckdb"
            first = wb("compare", "-gp", g, "-mp", t, "-o", out) if what == "compare" else wb("ingest", g, "-c", cat)
            filler = fill(mnt)
            r = wb("compare", "-gp", g2, "-mp", t, "-o", out) if what == "compare" else wb("ingest", g2, "-c", cat)
            filler.unlink()
            kept = _kept(cat, what)
    else:
        how = "RLIMIT_FSIZE subprocess (SIGXFSZ ignored)"
        out = tmp / "out"
        out.mkdir()
        cat = out / "catalog.duckdb"
        first = wb("compare", "-gp", g, "-mp", t, "-o", out) if what == "compare" else wb("ingest", g, "-c", cat)
        pre = fsize_limit(4096)  # the write-ahead log outgrows it at once
        r = (
            wb("compare", "-gp", g2, "-mp", t, "-o", out, preexec_fn=pre)
            if what == "compare"
            else wb("ingest", g2, "-c", cat, preexec_fn=pre)
        )
        kept = _kept(cat, what)
    res = one_line_error(r, "catalog.duckdb", "nothing committed was lost")
    ok = first.returncode == 0 and res.ok and kept and "rollback" not in r.stderr
    return Outcome(f"[{how}] {res.got[:110]}; earlier work kept: {kept}", ok)


def _kept(cat: Path, what: str) -> bool:
    con = duckdb.connect(str(cat), read_only=True)
    try:
        table = "comparisons" if what == "compare" else "runs"
        row = con.execute(f"SELECT count(*) FROM {table}").fetchone()
    finally:
        con.close()
    return bool(row and row[0] >= 1)


@case(8, "disk full during compare", "one line: nothing committed was lost")
def _full_compare(tmp: Path) -> Outcome:
    return _full_disk(tmp, "compare")


@case(8, "disk full during ingest", "one line naming ENOSPC, not `cannot rollback`")
def _full_ingest(tmp: Path) -> Outcome:
    return _full_disk(tmp, "ingest")


# ---------------------------------------------------------------------------------------------- 9 drops, leaks


@case(9, ".pth and .bin that are folders", "one problem line each")
def _dir_files(tmp: Path) -> Outcome:
    from workbench.formats import open_dump

    dev = torch_dump(tmp / "cpu_1", MODULES, [0])
    (dev / "0" / "root.a" / "output_1.pth").mkdir()
    root = atb_dump(tmp / "msit_dump_1")
    op = root / "tensors" / "0_77" / "0" / "0_Prefill_layer" / "0_RmsNormOperation"
    (op / "after" / "outtensor1.bin").mkdir()
    a = [p for p in open_dump(dev).problems if "output_1.pth" in p]
    b = [p for p in open_dump(root).problems if "outtensor1.bin" in p]
    return Outcome(f"{(a + b)}"[:120], len(a) == 1 and len(b) == 1)


@case(9, "ATB dump without model/ and layer/", "a line says what is missing")
def _no_topology(tmp: Path) -> Outcome:
    from workbench.formats import open_dump

    d = open_dump(atb_dump(tmp / "msit_dump_1", topology=False))
    lines = [p for p in d.problems if "no model/77 or layer/77" in p]
    return Outcome("; ".join(lines)[:120], len(lines) == 1)


@case(9, ".bin symlinked to /etc/passwd", "not followed; with --follow-symlinks at most 8 bytes quoted")
def _leak(tmp: Path) -> Outcome:
    from workbench.formats import open_dump

    root = atb_dump(tmp / "msit_dump_1")
    op = root / "tensors" / "0_77" / "0" / "0_Prefill_layer" / "0_RmsNormOperation"
    os.symlink("/etc/passwd", op / "after" / "outtensor1.bin")
    d = open_dump(root)
    refused = [p for p in d.problems if "outtensor1.bin" in p and "outside the dump" in p]
    d2 = open_dump(root, follow_symlinks=True)
    quoted = [p for p in d2.problems if "outtensor1.bin" in p]
    first = Path("/etc/passwd").read_text().splitlines()[0]
    leaked = any(first[:12] in p for p in d.problems + d2.problems) or any(
        t.error and first[:12] in t.error for t in d2.tensors
    )
    ok = len(refused) == 1 and len(quoted) == 1 and not leaked
    return Outcome(f"{refused[0][-60:] if refused else 'followed'} | {quoted[0][-40:] if quoted else ''}", ok)


@case(9, "newline in a folder name", "escaped in every printed line; no spoofed summary")
def _newline(tmp: Path) -> Outcome:
    g, t = pair_pair(tmp)
    evil = "root.x\nerror born at: root.fake (token 0)"
    (t / "0" / evil).mkdir()
    (t / "0" / evil / "output_9.txt.pth").write_bytes(b"junk")
    r = wb("compare", "-gp", g, "-mp", t, "-o", tmp / "out")
    spoofed = any(ln.startswith("error born at: root.fake") for ln in r.stdout.splitlines())
    escaped = "root.x\\nerror born at" in r.stdout
    return Outcome(f"rc {r.returncode}, escaped: {escaped}, spoofed: {spoofed}", not spoofed and escaped)


# ---------------------------------------------------------------------------------------------- 10 exit codes


_CRASHER = """
import sys
from workbench.cli import common, main

@common.app.command("boom")
def boom() -> None:
    raise RuntimeError("a bug\\nsecond line")

sys.argv = ["wb", *sys.argv[1:]]
main()
"""


@case(10, "a crash (a bug in wb)", "exit 3, one line saying where to report; traceback only with --debug")
def _crash(tmp: Path) -> Outcome:
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    r = subprocess.run([sys.executable, "-c", _CRASHER, "boom"], capture_output=True, text=True, env=env, cwd=ROOT)
    d = subprocess.run(
        [sys.executable, "-c", _CRASHER, "--debug", "boom"], capture_output=True, text=True, env=env, cwd=ROOT
    )
    lines = r.stderr.strip().splitlines()
    ok = (
        r.returncode == 3
        and len(lines) == 1
        and "internal error" in lines[0]
        and "report" in lines[0]
        and "Traceback" not in r.stderr
        and d.returncode == 3
        and "Traceback" in d.stderr
    )
    return Outcome(f"rc {r.returncode}: {lines[0][:100] if lines else ''}", ok)


@case(10, "nothing comparable vs bad input", "exit 1 vs exit 2")
def _codes(tmp: Path) -> Outcome:
    g = torch_dump(tmp / "golden" / "cpu_1", ["root.a"], [0])
    t = torch_dump(tmp / "test" / "cpu_1", ["root.zzz"], [0])  # no op in common: nothing comparable
    r1 = wb("compare", "-gp", g, "-mp", t, "-o", tmp / "o")
    r2 = wb("compare", "-gp", tmp / "missing", "-mp", t, "-o", tmp / "o2")
    return Outcome(f"{r1.returncode} / {r2.returncode}", r1.returncode == 1 and r2.returncode == 2)


# ---------------------------------------------------------------------------------------------- issue 21: 1-2
# (items of issue 21: recorded commands ask first; nothing replaces what it did not create)


@case(1, "redump of a manifest recording sh -c 'id > FILE'", "shown, flagged, exit 4 without --yes; FILE absent")
def _recorded_shell(tmp: Path) -> Outcome:
    from tests.recorded_commands import EXIT_NOT_CONFIRMED, crafted_catalog, shell_record, wb_cli

    target = tmp / "pwned"
    catalog = crafted_catalog(tmp, shell_record(target, tmp))
    r = wb_cli("redump", "root.b", "-c", catalog)
    shown = f"  command: sh -c 'id > {target}'" in r.stdout.splitlines()
    flagged = "recorded elsewhere or edited" in r.stdout
    refused = one_line_error(r, "needs your yes", code=EXIT_NOT_CONFIRMED)
    ok = refused.ok and shown and flagged and not target.exists()
    return Outcome(f"{refused.got[:80]}; shown: {shown}, flagged: {flagged}, ran: {target.exists()}", ok)


@case(2, "wb demo --out a folder holding the user's files", "refused with one line; every file intact")
def _demo_victim(tmp: Path) -> Outcome:
    from tests.recorded_commands import tree_state, wb_cli

    victim = tmp / "victim"
    (victim / "golden").mkdir(parents=True)
    (victim / "golden" / "keep.txt").write_text("mine")
    (victim / "catalog.duckdb").write_text("not a database")
    before = tree_state(victim)
    r = wb_cli("demo", "--out", victim, "--no-tui")
    refused = one_line_error(r, str(victim), "not an earlier `wb demo` output")
    intact = tree_state(victim) == before
    return Outcome(f"{refused.got[:90]}; files intact: {intact}", refused.ok and intact)


# ---------------------------------------------------------------------------------------------- issue 21: dump readers
# (items 6-9 of issue 21; the numbers above are issue 15's)

_AR_ONE = "\u0661"  # ARABIC-INDIC DIGIT ONE: str.isdigit() and int() take it for 1


@case(6, "issue 21: rank folder npu١_2 beside npu1_3", "npu1_3 is rank 1; npu١_2 refused with one line")
def _foreign_rank(tmp: Path) -> Outcome:
    for name in ("npu0_7", "npu1_8"):
        torch_dump(tmp / "golden" / "torch_tensors" / name, MODULES, [0])
    for name in ("npu0_1", f"npu{_AR_ONE}_2", "npu1_3"):
        torch_dump(tmp / "test" / "torch_tensors" / name, MODULES, [0], seed=5, noise=1e-4)
    r = wb("compare", "-gp", tmp / "golden", "-mp", tmp / "test", "-o", tmp / "out")
    lines = problem_lines(r.stdout, f"npu{_AR_ONE}_2")
    paired = "rank 1: golden npu1_8, test npu1_3" in r.stdout and "paired 2 by device/rank id" in r.stdout
    ok = r.returncode == 0 and paired and len(lines) == 1 and "not ASCII" in lines[0]
    return Outcome(f"rc {r.returncode}, npu1_3 paired: {paired}, {len(lines)} line(s)", ok)


@case(7, "issue 21: ATB op folders nested 70 deep in a failing layer", "compare goes on: skipped with one line")
def _deep_compare(tmp: Path) -> Outcome:
    import numpy as np

    from workbench.formats import atb_bin

    g = atb_dump(tmp / "g" / "msit_dump_1")
    t = atb_dump(tmp / "t" / "msit_dump_1")
    layer = t / "tensors" / "0_77" / "0" / "0_Prefill_layer"
    out0 = layer / "0_RmsNormOperation" / "after" / "outtensor0.bin"
    atb_bin.write_bin(out0, np.full((2, 4), 3, np.float32), "float32")  # a wrong output: its layer is prechecked
    nested_folders(layer, 70, "1_A")
    r = wb("compare", "-gp", g, "-mp", t, "-o", tmp / "out")
    lines = problem_lines(r.stdout, "nested deeper than 64")
    born = "error born at: 0_Prefill_layer/0_RmsNormOperation" in r.stdout
    ok = r.returncode == 0 and "pairs compared: 2 " in r.stdout and born and len(lines) == 1
    return Outcome(f"rc {r.returncode}, born found: {born}, {len(lines)} line(s) {r.stderr.strip()[:60]}", ok)


@case(8, "issue 21: msit dump whose model_tree.json is nested 10^5 deep", "as many pairs as with the tree; one line")
def _broken_tree(tmp: Path) -> Outcome:
    import re
    import shutil

    from tests.conftest_peers import HAS_MSIT
    from tests.peer_dumps import dump

    if not HAS_MSIT:
        return Outcome("skipped: msit_llm is not installed", True)
    dump("msit", tmp / "msit")
    (dev,) = (tmp / "msit").glob("msit_dump_*/torch_tensors/*")
    golden, broken = tmp / "golden" / dev.name, tmp / "broken" / dev.name
    shutil.copytree(dev, golden)
    shutil.copytree(dev, broken)
    (broken / "model_tree.json").write_text(deep_json(DEEP))
    counts = []
    for test in (dev, broken):
        r = wb("compare", "-gp", golden, "-mp", test, "-o", tmp / f"out-{test.parent.name}")
        m = re.search(r"^pairs compared: ([0-9]+) ", r.stdout, re.M)
        counts.append(int(m.group(1)) if m and r.returncode == 0 else -1)
    lines = problem_lines(r.stdout, "model_tree.json")
    ok = counts[0] > 100 and counts[0] == counts[1] and len(lines) == 1 and "not used" in lines[0]
    return Outcome(f"pairs with the tree {counts[0]}, without {counts[1]}; {len(lines)} line(s)", ok)


@case(9, "issue 21: statistic.csv rows with norm -2 and min > max", "refused per tensor with a line; not failed")
def _bad_stats(tmp: Path) -> Outcome:
    import re

    from workbench.formats import atb_csv

    def row(index: int, mx: str, mn: str, mean: str, norm: str) -> str:
        op = "Prefill_layer/RmsNormOperation,RmsNormOperation,0_0"
        return f"0_77,0,{op},output,{index},float,nd,2x4,{mx},{mn},{mean},{norm},N/A"

    good = [row(0, "1", "0", "0.5", "1.5"), row(1, "1", "0", "0.5", "1.5"), row(2, "1", "0", "0.5", "1.5")]
    bad = [row(0, "1", "0", "0.5", "1.5"), row(1, "1", "0", "0.5", "-2"), row(2, "0", "3", "1", "4")]
    for side, rows in (("golden", good), ("test", bad)):
        dev = tmp / side / "atb_dump_data" / "data" / "0_77" / "0"
        dev.mkdir(parents=True)
        (dev / atb_csv.STATS_FILE).write_text(",".join(atb_csv.HEADER) + "\n" + "\n".join(rows) + "\n")
    r = wb("compare", "-gp", tmp / "golden", "-mp", tmp / "test", "-o", tmp / "out")
    lines = problem_lines(r.stdout, "impossible statistics")
    m = re.search(r"failed: ([0-9]+); not comparable: ([0-9]+)", r.stdout)
    failed, uncomparable = (int(m.group(1)), int(m.group(2))) if m else (-1, -1)
    ok = r.returncode == 0 and len(lines) == 2 and failed == 0 and uncomparable == 2 and "Traceback" not in r.stderr
    return Outcome(f"rc {r.returncode}, {len(lines)} lines, failed {failed}, not comparable {uncomparable}", ok)


# ---------------------------------------------------------------------------------------------- issue 21 (sec-db)


@case(3, "planted catalog view and macro", "read-only commands refuse it in one line; compare replaces them; no leak")
def _planted_catalog(tmp: Path) -> Outcome:
    from tests.hostile_catalog import SECRET, plant

    g, t = pair_pair(tmp)
    out = tmp / "out"
    first = wb("compare", "-gp", g, "-mp", t, "-o", out)
    for f in out.glob("*.csv"):
        f.unlink()
    cat = out / "catalog.duckdb"
    plant(cat, tmp / "secret.txt")
    q = wb("query", "SELECT golden_op_type FROM comparison", "-c", cat)
    cmp = wb("compare", "-gp", g, "-mp", t, "-o", out)
    csv_text = "".join(f.read_text() for f in out.glob("*.csv"))
    texts = [r.stdout + r.stderr for r in (q, cmp)] + [csv_text]
    leaked = any(SECRET in x or "httpfs" in x for x in texts)
    ok = (
        first.returncode == 0
        and q.returncode == 2
        and len(q.stderr.strip().splitlines()) == 1
        and "not wb's" in q.stderr
        and cmp.returncode == 0
        and "Linear" in csv_text
        and not leaked
    )
    return Outcome(f"query rc {q.returncode}: {q.stderr.strip()[-70:]}; compare rc {cmp.returncode}, leak {leaked}", ok)


@case(4, "-mf, --thresholds, badcase -gp: /dev/zero and a FIFO", "one line naming the file, nothing read")
def _not_regular(tmp: Path) -> Outcome:
    g, t = pair_pair(tmp)
    fifo = tmp / "results.fifo"
    os.mkfifo(fifo)
    runs = [
        (wb("compare", "-gp", g, "-mp", t, "-o", tmp / "o1", "-mf", "/dev/zero", timeout=120), "/dev/zero"),
        (wb("compare", "-gp", g, "-mp", t, "-o", tmp / "o2", "--thresholds", "/dev/zero", timeout=120), "/dev/zero"),
        (wb("badcase", "-gp", fifo, "-mp", fifo, timeout=120), str(fifo)),
    ]
    outs = [one_line_error(r, where, "not a regular file") for r, where in runs]
    return Outcome(" | ".join(o.got[-50:] for o in outs), all(o.ok for o in outs))


@case(4, "6 GB sparse op_param.json", "precheck and the reader: one line with the limit, no MemoryError")
def _sparse_param(tmp: Path) -> Outcome:
    from workbench.formats import open_dump

    root = atb_dump(tmp / "msit_dump_1")
    op = root / "tensors" / "0_77" / "0" / "0_Prefill_layer" / "0_RmsNormOperation"
    with open(op / "op_param.json", "wb") as fh:
        fh.truncate(6 << 30)
    d = open_dump(root)
    lines = [p for p in d.problems if "op_param.json" in p and "limit" in p]
    r = wb("precheck", op, "--all", timeout=120)
    out = r.stdout + r.stderr
    ok = len(lines) == 1 and "over the 16 MiB limit" in out and "MemoryError" not in out and "Traceback" not in out
    return Outcome(f"reader: {len(lines)} line; precheck rc {r.returncode}", ok)


@case(5, "badcase: escape sequences and formulas", "terminal gets them escaped; CSV cells start with '")
def _badcase_controls(tmp: Path) -> Outcome:
    import csv
    import io
    import json

    prompts = ["\x1b]0;pwned\x07", "\x1b[2Jclear", "x\rOVER", '=HYPERLINK("http://e.invalid")', "@SUM(1+1)"]
    for side, out_id in (("g", 2), ("t", 3)):
        lines = [
            json.dumps({"id": f"k{i}\x1b[31m", "prompt": p, "output_ids": [1, out_id]}) for i, p in enumerate(prompts)
        ]
        (tmp / f"{side}.jsonl").write_text("\n".join(lines) + "\n")
    r = wb("badcase", "-gp", tmp / "g.jsonl", "-mp", tmp / "t.jsonl", "-o", tmp / "bad.csv", "--run", "true {prompt}")
    raw = any(c in r.stdout + r.stderr for c in ("\x1b", "\x07", "\r"))
    cells = {row["prompt"] for row in csv.DictReader(io.StringIO((tmp / "bad.csv").read_text()))}
    safe = {'\'=HYPERLINK("http://e.invalid")', "'@SUM(1+1)"} <= cells
    return Outcome(
        f"rc {r.returncode}, raw control chars: {raw}, formulas neutralised: {safe}",
        r.returncode == 0 and not raw and safe,
    )


@case(11, "badcase with 10^5 cases and a 10^5-pair -mf", "streamed: all cases in the CSV, a 50-row table")
def _big_inputs(tmp: Path) -> Outcome:
    import json

    n = 100_000
    for side, out_id in (("g", 2), ("t", 3)):
        with open(tmp / f"{side}.jsonl", "w") as fh:
            for i in range(n):
                fh.write(json.dumps({"id": i, "output_ids": [1, out_id if i % 10 == 0 else 2]}) + "\n")
    r = wb("badcase", "-gp", tmp / "g.jsonl", "-mp", tmp / "t.jsonl", "-o", tmp / "bad.csv")
    rows = (tmp / "bad.csv").read_text().count("\n") - 1 if (tmp / "bad.csv").exists() else -1
    pairs = [{"golden": f"root.m{i}", "test": f"t{i}", "fingerprint": {"golden": {"type": "L"}}} for i in range(n)]
    (tmp / "map.json").write_text(json.dumps({"format": "wb-mapping", "pairs": pairs}))
    from workbench.compare.mapping import MappingFile

    m = MappingFile.load(tmp / "map.json")
    shared = m.pair_prints[("root.m0", "t0")] is m.pair_prints[("root.m1", "t1")]
    ok = r.returncode == 0 and rows == n // 10 and "and 9950 more" in r.stdout and len(m.pairs) == n and shared
    return Outcome(f"rc {r.returncode}, {rows} CSV rows; mapping {len(m.pairs)} pairs, prints shared: {shared}", ok)


# ---------------------------------------------------------------------------------------------- issue 21, items 10-11


@case(11, "stride-0 views 64x their 4 MB storage", "each refused in one problem line; the rest compared")
def _repeat_budget(tmp: Path) -> Outcome:
    g, t = pair_pair(tmp)
    stored = 1 << 20  # 4 MB of float32: the 64x ratio let each show 64 Mi elements (1 GB per worker)
    names = [f"output_{i}.pth" for i in range(4)]
    for dump in (g, t):
        for name in names:
            crafted_pth(dump / "0" / "root.b" / name, (64, stored), (0, 1), storage_numel=stored)
    out = tmp / "out"
    r = wb("compare", "-gp", g, "-mp", t, "-o", out)
    lines = {n: len(problem_lines(r.stdout, n)) for n in names}
    n = compared_pairs(out / "catalog.duckdb") if (out / "catalog.duckdb").exists() else 0
    ok = r.returncode == 0 and all(c == 2 for c in lines.values()) and n >= 2 * len(MODULES) * 2
    ok = ok and "Traceback" not in r.stderr and all("refused" in ln for ln in problem_lines(r.stdout, "output_"))
    return Outcome(f"rc {r.returncode}, {n} pairs judged, problem lines per file: {lines}", ok)


def proc_stat(pid: int) -> tuple[bytes, int, int] | None:
    """(state, ppid, session) of a process, None when it is gone (read here, not by the code under test)."""
    try:
        fields = Path(f"/proc/{pid}/stat").read_bytes().rsplit(b")", 1)[-1].split()
    except OSError:
        return None
    return fields[0], int(fields[1]), int(fields[3])


def proc_title(pid: int) -> str:
    try:
        return Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace").strip()
    except OSError:
        return ""


def in_session(sid: int) -> dict[int, str]:
    """The live processes (not zombies) of session `sid`, with their titles."""
    out = {}
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            st = proc_stat(int(entry.name))
            if st is not None and st[2] == sid and st[0] not in (b"Z", b"X"):
                out[int(entry.name)] = proc_title(int(entry.name))
    return out


def wait_for(what: Callable[[], T | None], timeout: float) -> T | None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        got = what()
        if got:
            return got
        time.sleep(0.05)
    return None


def cluster_host(wb_pid: int) -> int | None:
    """The pid (and session) of the process hosting `wb`'s local cluster: its child running ray_guard."""
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            st = proc_stat(int(entry.name))
            if st is not None and st[1] == wb_pid and "workbench.compare.ray_guard" in proc_title(int(entry.name)):
                return int(entry.name)
    return None


def with_agents(sid: int) -> dict[int, str] | None:
    """The session's processes once both Ray agents (what a killed wb used to leave running) are among them."""
    procs = in_session(sid)
    titles = " ".join(procs.values())
    return procs if "ray::DashboardAgent" in titles and "ray::RuntimeEnvAgent" in titles else None


@case(10, "wb compare --ray local killed with -9", "no process of its cluster left (agents included)")
def _ray_local_killed(tmp: Path) -> Outcome:
    import importlib.util

    if importlib.util.find_spec("ray") is None:
        return Outcome("skipped: ray is not installed", True)
    toks = list(range(200))
    g = torch_dump(tmp / "golden" / "cpu_1", MODULES, toks)
    t = torch_dump(tmp / "test" / "cpu_1", MODULES, toks, seed=5, noise=1e-4)
    env = {**os.environ, "PYTHONPATH": str(ROOT), "PYTHONDONTWRITEBYTECODE": "1"}
    args = ["compare", "-gp", str(g), "-mp", str(t), "-o", str(tmp / "out"), "--ray", "local", "-j", "1"]
    p = subprocess.Popen([*WB, *args], cwd=ROOT, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        sid = wait_for(lambda: cluster_host(p.pid), 120)
        if sid is None:
            return Outcome("no cluster host process started", False)
        seen = wait_for(lambda: with_agents(sid), 240)
        alive = p.poll() is None
        p.kill()
        p.wait()
    finally:
        if p.poll() is None:
            p.kill()
            p.wait()
    gone = wait_for(lambda: not in_session(sid) or None, 60)
    left = in_session(sid)
    ok = bool(seen) and alive and bool(gone)
    return Outcome(f"{len(seen or {})} cluster processes before kill -9, {len(left)} left: {sorted(left.values())}", ok)
