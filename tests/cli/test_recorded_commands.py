"""Issue 21, items 1 and 2: a recorded command runs only after the user's yes, and no command replaces what it did
not create (`wb redump`, the app's `d`, `wb demo --out`, `badcase -o`, `logits -o`)."""

from __future__ import annotations

import os
import pty
import shutil
import subprocess
import sys
from pathlib import Path

import duckdb
import pytest

from tests.fixtures.recorded_commands import (
    EXIT_NOT_CONFIRMED,
    MODULES,
    crafted_catalog,
    env_record,
    recorded_meta,
    set_test_meta,
    shell_record,
    tree_state,
    wb_cli,
)

REFUSED = "wb: error: not run: a recorded command needs your yes (--yes, or y on a terminal)"


def test_a_shell_one_liner_in_a_manifest_is_shown_and_not_run_without_yes(tmp_path: Path) -> None:
    pwned = tmp_path / "pwned"
    catalog = crafted_catalog(tmp_path, shell_record(pwned, tmp_path))
    r = wb_cli("redump", "root.b", "--token", "0", "-c", catalog)
    assert r.returncode == EXIT_NOT_CONFIRMED, r.stdout + r.stderr
    assert r.stderr.strip().splitlines() == [REFUSED]
    out = r.stdout.splitlines()
    assert f"  command: sh -c 'id > {pwned}'" in out
    assert f"  in folder: {tmp_path}" in out
    assert any(ln.startswith("  env: WB_REDUMP=") for ln in out) and any("WB_EXEC_DUMP=" in ln for ln in out)
    assert "  warning: recorded elsewhere or edited: no signature" in r.stdout
    assert not pwned.exists() and not (catalog.parent / "wb_redump").exists()
    # --yes: the same command, exactly as shown, runs (no shell of ours: sh is the recorded program)
    r = wb_cli("redump", "root.b", "--token", "0", "-c", catalog, "--yes")
    assert pwned.exists() and "uid=" in pwned.read_text()
    assert r.returncode == 2 and "the re-run wrote no dump" in r.stderr  # it was no dumper


def test_an_edited_catalog_record_is_flagged_and_not_run_without_yes(tmp_path: Path) -> None:
    from workbench.core.trust import SIGNATURE_KEY, sign

    first, second = tmp_path / "first", tmp_path / "second"
    record = env_record(first, tmp_path)
    signed = {**record, SIGNATURE_KEY: sign(record)}  # this user's key, as the dumper signs
    catalog = crafted_catalog(tmp_path, signed)
    r = wb_cli("redump", "root.b", "-c", catalog)
    assert r.returncode == EXIT_NOT_CONFIRMED and "warning:" not in r.stdout  # recorded here by this user
    assert f"  command: /usr/bin/env /bin/sh -c 'id > {first}'" in r.stdout.splitlines()
    # the shared catalog is edited: another command, the old signature kept
    meta = recorded_meta(catalog)
    meta["command"] = ["/bin/sh", "-c", f"id > {second}"]
    set_test_meta(catalog, meta)
    r = wb_cli("redump", "root.b", "-c", catalog)
    assert r.returncode == EXIT_NOT_CONFIRMED and r.stderr.strip().splitlines() == [REFUSED]
    assert "  warning: recorded elsewhere or edited: the signature (by " in r.stdout
    assert f"  command: /usr/bin/env /bin/sh -c 'id > {second}'" in r.stdout.splitlines()
    assert not first.exists() and not second.exists()
    r = wb_cli("redump", "root.b", "-c", catalog, "-y")
    assert second.exists() and not first.exists()


def test_a_record_signed_by_another_key_is_flagged(tmp_path: Path) -> None:
    from workbench.core.trust import SIGNATURE_KEY

    record = env_record(tmp_path / "x", tmp_path)
    forged = {**record, SIGNATURE_KEY: {"by": "mallory@elsewhere", "hmac": "0" * 64}}
    catalog = crafted_catalog(tmp_path, forged)
    r = wb_cli("redump", "root.b", "-c", catalog)
    assert r.returncode == EXIT_NOT_CONFIRMED
    assert "recorded elsewhere or edited: the signature (by mallory@elsewhere) does not match" in r.stdout
    assert not (tmp_path / "x").exists()


def _on_a_terminal(args: list[str | Path], answer: bytes) -> tuple[int, str]:
    """Run wb with a pseudo-terminal as stdin and `answer` typed into it."""
    master, slave = pty.openpty()
    try:
        os.write(master, answer)
        r = wb_cli(*args, stdin=slave)
    finally:
        os.close(slave)
        os.close(master)
    return r.returncode, r.stdout + r.stderr


def test_the_question_on_a_terminal(tmp_path: Path) -> None:
    ran = tmp_path / "ran"
    catalog = crafted_catalog(tmp_path, shell_record(ran, tmp_path))
    code, text = _on_a_terminal(["redump", "root.b", "-c", catalog], b"n\n")
    assert code == EXIT_NOT_CONFIRMED and "not run (answered no)" in text and not ran.exists()
    code, text = _on_a_terminal(["redump", "root.b", "-c", catalog], b"y\n")
    assert "run it? [y/N]" in text and ran.exists(), text


def test_no_run_without_confirmation_in_the_job(tmp_path: Path) -> None:
    from workbench.catalog.readonly import connect_read_only
    from workbench.jobs.redump import RedumpError, plan_redump, run_redump

    ran = tmp_path / "ran"
    catalog = crafted_catalog(tmp_path, shell_record(ran, tmp_path))
    con = connect_read_only(catalog)
    try:
        plan = plan_redump(con, 1, "root.b", 0, catalog)
    finally:
        con.close()
    assert plan.untrusted is not None and plan.argv == ["sh", "-c", f"id > {ran}"]
    with pytest.raises(RedumpError, match="only after the user confirmed"):
        run_redump(catalog, plan, confirmed=False)
    assert not ran.exists() and not plan.out_dir.exists()


@pytest.mark.anyio
@pytest.mark.parametrize("anyio_backend", ["asyncio"])
async def test_app_d_asks_first_cancel_runs_nothing_confirm_runs(tmp_path: Path, anyio_backend: str) -> None:
    from tests.app.test_app_pilot import _text, ready, wait_for
    from workbench.app.launch import make_app
    from workbench.app.opcause import ConfirmRedumpScreen

    ran = tmp_path / "ran"
    catalog = crafted_catalog(tmp_path, shell_record(ran, tmp_path))
    con = duckdb.connect(str(catalog), read_only=True)
    row = con.execute(
        "SELECT n.node_id FROM nodes n JOIN comparisons c ON n.run_id = c.golden_run WHERE n.name = ?", [MODULES[1]]
    ).fetchone()
    con.close()
    assert row is not None
    app = make_app(catalog=catalog)
    async with app.run_test(size=(160, 48)) as pilot:
        screen = await ready(pilot, app)
        screen.set_token(0)
        screen.select_node(int(row[0]))
        await pilot.pause(0.2)
        await pilot.press("d")
        await wait_for(pilot, lambda: isinstance(app.screen, ConfirmRedumpScreen), timeout=60)
        confirm = app.screen
        assert f"command: sh -c 'id > {ran}'" in _text(confirm.query_one("#confirm-command"))
        assert f"in folder: {tmp_path}" in _text(confirm.query_one("#confirm-command"))
        assert "recorded elsewhere or edited: no signature" in _text(confirm.query_one("#confirm-warning"))
        await pilot.press("n")
        await wait_for(pilot, lambda: app.screen is screen, timeout=30)
        await pilot.pause(0.5)
        assert not ran.exists() and not (catalog.parent / "wb_redump").exists()
        await pilot.press("d")
        await wait_for(pilot, lambda: isinstance(app.screen, ConfirmRedumpScreen), timeout=60)
        await pilot.press("y")
        await wait_for(pilot, lambda: ran.exists(), timeout=120)
        await wait_for(pilot, lambda: app.screen is screen and app.explorer is not None, timeout=120)
    assert "uid=" in ran.read_text()


# ---------------------------------------------------------------------------------------------- item 2


def test_demo_refuses_a_folder_of_the_users(tmp_path: Path) -> None:
    victim = tmp_path / "victim"
    (victim / "golden").mkdir(parents=True)
    (victim / "golden" / "keep.txt").write_text("mine")
    (victim / "catalog.duckdb").write_text("not a database")
    before = tree_state(victim)
    r = wb_cli("demo", "--out", victim, "--no-tui")
    assert r.returncode == 2 and len(r.stderr.strip().splitlines()) == 1, r.stderr
    assert r.stderr.startswith(f"wb: error: {victim}: not empty and not an earlier `wb demo` output")
    assert tree_state(victim) == before and (victim / "golden" / "keep.txt").read_text() == "mine"


def test_demo_again_replaces_only_its_own_files_and_redump_keeps_it(tmp_path: Path) -> None:
    """`wb demo --out same` twice works; a user's file inside what the demo made is named, one beside stays;
    `wb redump` of the demo's recorded `wb demo --out same` is refused and changes nothing."""
    same = tmp_path / "same"
    r = wb_cli("demo", "--stack", "torch", "--no-tui", "--out", same)
    assert r.returncode == 0, r.stderr[-2000:]
    (same / "notes.txt").write_text("beside the demo")
    (same / "golden" / "keep.txt").write_text("inside the demo's folder")
    r = wb_cli("demo", "--stack", "torch", "--no-tui", "--out", same)
    assert r.returncode == 2 and f"{same / 'golden' / 'keep.txt'}: not written by the earlier `wb demo`" in r.stderr
    (same / "golden" / "keep.txt").unlink()
    r = wb_cli("demo", "--stack", "torch", "--no-tui", "--out", same)
    assert r.returncode == 0, r.stderr[-2000:]
    assert (same / "notes.txt").read_text() == "beside the demo"
    assert len(list(same.glob("msit_cmp_report_*.csv"))) == 1  # the earlier report was the demo's: replaced
    catalog = same / "catalog.duckdb"
    before = tree_state(same)
    r = wb_cli("redump", "root.model.layers.0.mlp", "--token", "0", "-c", catalog, "--yes")
    assert r.returncode == 2 and len(r.stderr.strip().splitlines()) == 1, r.stdout + r.stderr
    assert f"the recorded command writes to {same}, which holds" in r.stderr
    assert tree_state(same) == before and not (same / "wb_redump").exists()
    shutil.rmtree(same / "golden")  # not needed any more; keeps the test's folder small


def test_badcase_and_logits_do_not_overwrite_a_users_file(tmp_path: Path) -> None:
    from workbench.core.owned import OwnedFolderError, check_replaceable

    mine = tmp_path / "report.csv"
    mine.write_text("my,own\n1,2\n")
    (tmp_path / "g.jsonl").write_text('{"key": "a", "prompt": "p", "pass": true}\n')
    r = wb_cli("badcase", "-gp", tmp_path / "g.jsonl", "-mp", tmp_path / "g.jsonl", "-o", mine)
    assert r.returncode == 2 and "report.csv: exists and is not an earlier `wb badcase` output" in r.stderr
    assert mine.read_text() == "my,own\n1,2\n"
    with pytest.raises(OwnedFolderError, match="not an earlier `wb logits` output"):
        check_replaceable(mine, "token_id,passed", "logits")
    ours = tmp_path / "ours.csv"
    ours.write_text("token_id,passed\n0,True\n")
    check_replaceable(ours, "token_id,passed", "logits")  # an earlier output of the command: may be replaced
    os.symlink(ours, tmp_path / "link.csv")
    with pytest.raises(OwnedFolderError, match="not a regular file"):
        check_replaceable(tmp_path / "link.csv", "token_id,passed", "logits")


def test_the_key_is_private_and_made_once(tmp_path: Path) -> None:
    code = (
        "import os, stat; from workbench.core import trust; k = trust.user_key(create=True); p = trust.key_path(); "
        "print(oct(stat.S_IMODE(os.stat(p).st_mode)), oct(stat.S_IMODE(os.stat(p.parent).st_mode)), "
        "trust.user_key(create=True) == k, p)"
    )
    env = {**os.environ, "XDG_CONFIG_HOME": str(tmp_path), "PYTHONPATH": str(Path(__file__).resolve().parents[2])}
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env)
    assert r.stdout.split() == ["0o600", "0o700", "True", str(tmp_path / "wb" / "dump.key")], r.stderr
    (tmp_path / "wb" / "dump.key").chmod(0o644)  # readable by others: no longer trusted to sign or verify
    code = "from workbench.core import trust; print(trust.user_key(create=True))"
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env)
    assert r.stdout.strip() == "None", r.stderr


@pytest.mark.anyio
@pytest.mark.parametrize("anyio_backend", ["asyncio"])
async def test_mapping_editor_never_saves_over_a_file_it_cannot_read_as_its_own(
    small_catalog: Path, tmp_path: Path, anyio_backend: str
) -> None:
    """`-mf FILE` naming a file that is not a wb-mapping file (msit's, or anything else): Ctrl+S leaves it as it is
    and writes `FILE.wb.json` beside it; the next save goes there too."""
    from tests.app.test_app_pilot import open_mapping_editor
    from workbench.app.launch import make_app
    from workbench.compare.pairing.mapping import MappingFile

    mine = tmp_path / "notes.json"
    mine.write_text('{"my": "own notes"}\n')
    app = make_app(catalog=small_catalog, mapping=mine)
    async with app.run_test(size=(140, 44)) as pilot:
        editor = await open_mapping_editor(pilot, app)
        await pilot.press("ctrl+s")
        await pilot.pause(0.5)
        assert mine.read_text() == '{"my": "own notes"}\n'
        saved = tmp_path / "notes.wb.json"
        assert saved.is_file() and editor.target == saved
        assert "notes.json is not a wb mapping file and stays as it is" in str(editor.query_one("#map-status").render())
        await pilot.press("ctrl+s")
        await pilot.pause(0.5)
    assert MappingFile.load(saved).is_empty() and not (tmp_path / "notes.wb.2.json").exists()
