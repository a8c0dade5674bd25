"""What a new user hit the second time (issue 26 items 6 and 8), through the real CLI (help text in process)."""

from __future__ import annotations

import logging
import os
import pty
import re
import subprocess
import warnings
from pathlib import Path

import pytest

from tests.conftest import ROOT, WB, invoke_wb, run_wb


def test_help_keeps_each_description_whole() -> None:
    res = invoke_wb("--help", columns=80)
    assert res.returncode == 0, res.stderr
    rows = "".join(line.strip("│ \n") + " " for line in res.stdout.splitlines())
    assert "redump Re-dump one op at one token with full tensors: the run's recorded command, shown first, run " in (
        re.sub(r"\s+", " ", rows)
    )
    res = invoke_wb("redump", "--help", columns=80)
    # paragraphs wrap to the terminal: no line ends mid-sentence where the docstring's line ended
    lines = [ln.strip() for ln in res.stdout.splitlines()]
    assert not any(ln.endswith("or `y` on a") for ln in lines), res.stdout
    assert not any(ln.startswith("terminal);") for ln in lines), res.stdout


def test_demo_decoding_warns_nothing(caplog: pytest.LogCaptureFixture) -> None:
    from workbench.demo import build_model, decode, demo_prompt

    model = build_model()
    with warnings.catch_warnings(record=True) as caught, caplog.at_level(logging.WARNING):
        warnings.simplefilter("always")
        tokens = decode(model, demo_prompt(), 3)
    assert len(tokens) == 3
    said = [str(w.message) for w in caught] + [r.getMessage() for r in caplog.records]
    assert not [s for s in said if "past_key_values" in s or "deprecated" in s], said


def _on_a_terminal(*args: str, env_extra: dict[str, str] | None = None) -> tuple[int, str, str]:
    """`wb ARGS` with stderr on a pseudo-terminal (where the progress line is drawn): rc, stdout, terminal text."""
    master, slave = pty.openpty()
    env = {**os.environ, "PYTHONPATH": str(ROOT), "COLUMNS": "200", **(env_extra or {})}
    proc = subprocess.Popen([*WB, *args], stdout=subprocess.PIPE, stderr=slave, cwd=ROOT, env=env, text=True)
    os.close(slave)
    chunks: list[bytes] = []
    while True:
        try:
            data = os.read(master, 65536)
        except OSError:  # the child closed its side
            break
        if not data:
            break
        chunks.append(data)
    out, _ = proc.communicate(timeout=600)
    os.close(master)
    return proc.returncode, out, b"".join(chunks).decode("utf-8", "replace")


def test_compare_progress_on_a_terminal_is_printed_once_and_agrees(demo_catalog: Path, tmp_path: Path) -> None:
    demo = demo_catalog.parent
    golden = next((demo / "golden").glob("msit_dump_*"))
    test = next((demo / "test").glob("msit_dump_*"))
    rc, out, tty = _on_a_terminal("compare", "-gp", str(golden), "-mp", str(test), "-o", str(tmp_path / "out"))
    assert rc == 0, tty[-2000:]
    lines = [seg.strip() for seg in re.split(r"[\r\n]+", tty) if seg.strip()]
    done = [ln for ln in lines if (m := re.search(r": (\d+)/(\d+)", ln)) and m.group(1) == m.group(2) != "0"]
    compare_done = [ln for ln in done if ln.startswith("compare (")]
    assert len(compare_done) == 1, compare_done  # the finished line once, not twice
    label = re.match(r"compare \((\d+) pairs", compare_done[0])
    summary = re.search(r"pairs compared: (\d+)", out)
    assert label and summary and label.group(1) == summary.group(1), (compare_done[0], out[:400])


@pytest.mark.slow
def test_the_first_compare_after_an_install_says_it_compiles_the_kernels(tmp_path: Path) -> None:
    """No kernel machine code kept yet (a plain `pip install`): the workers compile the entries the pairs run, a few
    seconds in which the progress line says so instead of standing at 0 (on one terminal row), and the compare
    then ends as usual."""
    from tests.fixtures.hostile_cases import big_pair
    from workbench.compare.execution.executor import KERNELS_COMPILING

    golden, test = big_pair(tmp_path)
    rc, out, tty = _on_a_terminal(
        "compare",
        "-gp",
        str(golden),
        "-mp",
        str(test),
        "-o",
        str(tmp_path / "out"),
        "-j",
        "2",
        env_extra={"NUMBA_CACHE_DIR": str(tmp_path / "kernels")},
    )
    assert rc == 0, tty[-2000:]
    rows = [seg for seg in re.split(r"[\r\n]+", tty) if seg.strip()]
    said = [r for r in rows if KERNELS_COMPILING in r]
    assert said and all(r.startswith("compare (") and len(r.replace("\x1b[K", "")) < 80 for r in said), rows[:20]
    assert "pairs compared:" in out
    assert list((tmp_path / "kernels" / "wb_kernels").glob("wb_kernel-pass_pair-float32-float32-*.o"))


def test_redump_on_an_atb_run_names_the_format(demo_catalog: Path) -> None:
    res = invoke_wb("redump", "root.model.layers.1.post_attention_layernorm", "--token", "0", "-c", str(demo_catalog))
    assert res.returncode == 2, res.stdout + res.stderr
    assert "a atb" not in res.stderr
    assert "this run is an ATB dump: re-dump works only on dumps written by wb's torch dumper" in res.stderr


def test_precheck_of_an_atb_dump_honours_token_and_node(demo_catalog: Path) -> None:
    """`--token` and `--node` on an ATB dump were ignored: every op of every token ran (the guide's example)."""
    test = next((demo_catalog.parent / "test").glob("msit_dump_*"))
    res = run_wb("precheck", str(test), "--token", "2", "--node", "11_Decoder_layer/3_RmsNormOperation")
    assert res.returncode == 1, res.stdout + res.stderr  # the demo's planted epsilon, judged against its peers
    assert res.stdout.splitlines()[-1].startswith("1 ops ran: 0 ok, 1 disagree"), res.stdout
    assert "FAIL  11_Decoder_layer/3_RmsNormOperation" in res.stdout and "token 1" not in res.stdout
    group = run_wb("precheck", str(test), "--token", "2", "--node", "13_Decoder_layer/1_Attention")
    assert group.returncode == 0 and "ops ran: " in group.stdout, group.stdout + group.stderr
    ran = int(group.stdout.splitlines()[-1].split()[0])
    assert 1 < ran < 10, group.stdout  # the attention group's ops, not the token's
    for args, said in (
        (("--node", "root.model.layers.3.self_attn"), "no ATB op 'root.model.layers.3.self_attn' here"),
        (("--token", "9"), "no token 9 here (tokens: 0, 1, 2, 3)"),
    ):
        bad = run_wb("precheck", str(test), *args)
        assert bad.returncode == 2 and said in bad.stderr, bad.stdout + bad.stderr
        assert "Traceback" not in bad.stderr and len(bad.stderr.strip().splitlines()) == 1


def test_a_progress_line_fits_one_row_with_its_counts_whole() -> None:
    """A long stage label (a compare with unpaired tensors' statistics) is cut before the counts, never the counts;
    a message goes last, cut or left out where the row has no room for it."""
    from workbench.cli.common import _one_row

    stage = "compare (448 pairs in 400 tasks + 1232 unpaired tensors' statistics)"
    row = _one_row(stage, ": 128/1632 64/s", "", 79)
    assert len(row) == 79 and row.endswith("...: 128/1632 64/s") and row.startswith("compare (448 pairs")
    assert _one_row("compare (836 pairs)", ": 0/836", "compiling the metric kernels (once per install)", 79) == (
        "compare (836 pairs): 0/836  compiling the metric kernels (once per install)"
    )
    cut = _one_row("compare (836 pairs)", ": 0/836", "compiling the metric kernels (once per install)", 60)
    assert cut == "compare (836 pairs): 0/836  compiling the metric kernels..." and len(cut) <= 60
    assert _one_row(stage, ": 0/1632", "compiling the metric kernels", 79).endswith(": 0/1632")
