"""`wb badcase` on msit's bad-case CSVs (written by msit's own Synthesizer), bcanalyze-style `key,passed` files
and JSONL, with malformed files giving one line naming the file and the line."""

from __future__ import annotations

import csv
import importlib.util
import io
import json
import subprocess
import sys
from pathlib import Path

import pytest

from tests.conftest import invoke_wb, run_wb

QUERIES = ["what is 1+1", "capital of France", "say hello", "count to 3"]
INPUTS = [[1, 2, 3], [1, 4], [1], [7, 8]]
GOLDEN_OUT = [[5, 6, 7, 8], [9, 10], [11], [12, 13]]
TEST_OUT = [[5, 6, 70, 8], [9, 10], [11], [12, 13, 14]]
GOLDEN_PASS = ["Correct", "Correct", "Wrong", "Correct"]
TEST_PASS = ["Correct", "Wrong", "Wrong", "Correct"]


def _synthesize(folder: Path, outputs: list[list[int]], passed: list[str]) -> Path:
    """An `llm analyze` input CSV written by msit's Synthesizer (in its own process: it writes under the cwd)."""
    folder.mkdir(parents=True)
    code = (
        "import json, sys\n"
        "from msit_llm import Synthesizer\n"
        "q, i, o, p = json.loads(sys.argv[1])\n"
        "Synthesizer(queries=q, input_token_ids=i, output_token_ids=o, passed=p).to_csv()\n"
    )
    arg = json.dumps([QUERIES, INPUTS, outputs, passed])
    proc = subprocess.run([sys.executable, "-c", code, arg], cwd=folder, capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr[-2000:]
    return next(folder.rglob("*.csv"))


@pytest.mark.skipif(importlib.util.find_spec("msit_llm") is None, reason="msit_llm not installed")
def test_msit_synthesizer_csvs(tmp_path: Path) -> None:
    golden = _synthesize(tmp_path / "g", GOLDEN_OUT, GOLDEN_PASS)
    test = _synthesize(tmp_path / "t", TEST_OUT, TEST_PASS)
    assert golden.read_text().splitlines()[0] == "queries,input_token_ids,output_token_ids,passed"
    res = run_wb("badcase", "-gp", str(golden), "-mp", str(test), "-o", str(tmp_path / "bad.csv"))
    assert res.returncode == 0, res.stderr
    rows = list(csv.DictReader(io.StringIO((tmp_path / "bad.csv").read_text())))
    by_key = {r["key"]: r for r in rows}
    assert set(by_key) == {"what is 1+1", "capital of France", "count to 3"}
    assert by_key["what is 1+1"]["first_diff"] == "2" and by_key["what is 1+1"]["unit"] == "token"
    assert (by_key["what is 1+1"]["golden_at"], by_key["what is 1+1"]["test_at"]) == ("7", "70")
    assert by_key["capital of France"]["flipped"] == "True" and by_key["capital of France"]["first_diff"] == ""
    assert by_key["count to 3"]["first_diff"] == "2" and by_key["count to 3"]["golden_at"] == ""  # golden ends
    assert "3 bad case(s) of 4 in both files: 1 flipped pass/fail, 2 with other outputs" in res.stdout
    assert "next: dump case 'what is 1+1'" in res.stdout
    assert "token_range=list(range(3))" in res.stdout and 'follow_tokens="./golden"' in res.stdout


def test_bcanalyze_key_passed_files(tmp_path: Path) -> None:
    (tmp_path / "g.csv").write_text("key,passed\n1352,correct\n1353,correct\n1354,wrong\n7,correct\n")
    (tmp_path / "t.csv").write_text("key,pass,queries\n1352,correct,a\n1353,wrong,b\n1354,wrong,c\n8,wrong,d\n")
    res = run_wb("badcase", "-gp", str(tmp_path / "g.csv"), "-mp", str(tmp_path / "t.csv"))
    assert res.returncode == 0, res.stderr
    lines = res.stdout.splitlines()
    assert lines[1].split()[:3] == ["1353", "pass", "fail"]
    assert "1 bad case(s) of 3 in both files: 1 flipped pass/fail, 0 with other outputs" in res.stdout
    assert "not compared: 1 case(s) only in" in res.stdout


def test_jsonl_text_and_ids(tmp_path: Path) -> None:
    golden = [
        {"id": "a", "prompt": "hi", "output": "hello world"},
        {"id": "b", "prompt": "x", "output_ids": [1, 2, 3]},
        {"id": "c", "prompt": "same", "output": "same"},
    ]
    test = [
        {"id": "a", "prompt": "hi", "output": "hello there"},
        {"id": "b", "prompt": "x", "output_ids": [1, 2, 4]},
        {"id": "c", "prompt": "same", "output": "same"},
    ]
    (tmp_path / "g.jsonl").write_text("".join(json.dumps(x) + "\n" for x in golden))
    (tmp_path / "t.jsonl").write_text("".join(json.dumps(x) + "\n" for x in test))
    res = run_wb(
        "badcase", "-gp", str(tmp_path / "g.jsonl"), "-mp", str(tmp_path / "t.jsonl"), "-o", str(tmp_path / "o.csv")
    )
    assert res.returncode == 0, res.stderr
    rows = {r["key"]: r for r in csv.DictReader(io.StringIO((tmp_path / "o.csv").read_text()))}
    assert set(rows) == {"a", "b"}
    assert (rows["a"]["first_diff"], rows["a"]["unit"], rows["a"]["golden_at"], rows["a"]["test_at"]) == (
        "6",
        "char",
        "w",
        "t",
    )
    assert (rows["b"]["first_diff"], rows["b"]["unit"]) == ("2", "token")
    assert "next: dump case 'a'" in res.stdout and "its token index is at most 6" in res.stdout


@pytest.mark.parametrize(
    ("content", "suffix", "line", "words"),
    [
        ('{"id": "a", "output": "x"}\n{"id": "b" "output": "y"}\n', "jsonl", 2, "not valid JSON"),
        ('{"id": "a", "prompt": "p"}\n', "jsonl", 1, "neither 'output' nor 'output_ids'"),
        ("queries,input_token_ids,output_token_ids,passed\nq,[1],[2],maybe\n", "csv", 2, "passed 'maybe'"),
        ('queries,input_token_ids,output_token_ids,passed\nq,[1],"[2, x]",True\n', "csv", 2, "not a list of token ids"),
        ("queries,input_token_ids,output_token_ids,passed\nq,[1],[2],True,extra\n", "csv", 2, "number of fields"),
        ("name,score\nq,1\n", "csv", 1, "expected msit's bad-case columns"),
        ("key,passed\n1,true\n1,false\n", "csv", 3, "repeats line 2"),
    ],
)
def test_malformed_files_one_line(tmp_path: Path, content: str, suffix: str, line: int, words: str) -> None:
    good = tmp_path / f"good.{suffix}"
    good.write_text('{"id": "a", "output": "x"}\n' if suffix == "jsonl" else "key,passed\n1,true\n")
    bad = tmp_path / f"bad.{suffix}"
    bad.write_text(content)
    res = invoke_wb("badcase", "-gp", str(good), "-mp", str(bad))
    assert res.returncode == 2
    err = res.stderr.strip()
    assert len(err.splitlines()) == 1 and "Traceback" not in err
    assert f"{bad}:{line}:" in err and words in err, err


def test_missing_file(tmp_path: Path) -> None:
    res = invoke_wb("badcase", "-gp", str(tmp_path / "nope.csv"), "-mp", "x.csv")
    assert res.returncode == 2 and res.stderr.strip() == f"wb: error: {tmp_path / 'nope.csv'}: no such file"


def test_run_command_for_the_first_case(tmp_path: Path) -> None:
    (tmp_path / "g.jsonl").write_text('{"id": "a", "prompt": "two words", "output_ids": [1, 2, 3]}\n')
    (tmp_path / "t.jsonl").write_text('{"id": "a", "prompt": "two words", "output_ids": [1, 5, 3]}\n')
    record = tmp_path / "args.txt"
    script = "import sys; open(sys.argv[1], 'w').write('|'.join(sys.argv[2:]))"
    cmd = f'{sys.executable} -c "{script}" {record} {{prompt}} {{key}} {{tokens}} {{last_token}}'
    res = run_wb("badcase", "-gp", str(tmp_path / "g.jsonl"), "-mp", str(tmp_path / "t.jsonl"), "--run", cmd)
    assert res.returncode == 0, res.stderr
    assert record.read_text() == "two words|a|0,1|1"
    assert "-> exit 0" in res.stdout
    res = invoke_wb(
        "badcase", "-gp", str(tmp_path / "g.jsonl"), "-mp", str(tmp_path / "t.jsonl"), "--run", "echo {nope}"
    )
    assert res.returncode == 2 and "unknown placeholder" in res.stderr and len(res.stderr.strip().splitlines()) == 1


def test_many_cases_stream_a_capped_table_and_the_full_csv(tmp_path: Path) -> None:
    from workbench.cli.badcase_cmd import SHOWN

    n = 3 * SHOWN
    (tmp_path / "g.jsonl").write_text("".join(json.dumps({"id": i, "output_ids": [1, 2]}) + "\n" for i in range(n)))
    (tmp_path / "t.jsonl").write_text("".join(json.dumps({"id": i, "output_ids": [1, 3]}) + "\n" for i in range(n)))
    out = tmp_path / "bad.csv"
    res = run_wb("badcase", "-gp", str(tmp_path / "g.jsonl"), "-mp", str(tmp_path / "t.jsonl"), "-o", str(out))
    assert res.returncode == 0, res.stderr
    table = [ln for ln in res.stdout.splitlines() if ln.split() and ln.split()[0].isdigit() and "token" in ln]
    assert len(table) == SHOWN
    assert f"... and {n - SHOWN} more bad case(s) (all of them in {out})" in res.stdout
    assert f"{n} bad case(s) of {n} in both files" in res.stdout
    rows = list(csv.DictReader(io.StringIO(out.read_text())))
    assert [r["key"] for r in rows] == [str(i) for i in range(n)] and all(r["first_diff"] == "1" for r in rows)


def test_a_bad_line_late_in_the_golden_file_leaves_no_half_report(tmp_path: Path) -> None:
    good = "".join(json.dumps({"id": i, "output_ids": [1, 2]}) + "\n" for i in range(100))
    (tmp_path / "g.jsonl").write_text(good + "{broken\n")
    (tmp_path / "t.jsonl").write_text(good.replace("[1, 2]", "[1, 3]"))
    out = tmp_path / "bad.csv"
    res = invoke_wb("badcase", "-gp", str(tmp_path / "g.jsonl"), "-mp", str(tmp_path / "t.jsonl"), "-o", str(out))
    assert res.returncode == 2 and f"{tmp_path / 'g.jsonl'}:101: not valid JSON" in res.stderr
    assert sorted(p.name for p in tmp_path.iterdir()) == ["g.jsonl", "t.jsonl"]  # no report, no partial file


def test_a_prompt_starting_with_a_dash_never_reaches_the_program_as_an_option(tmp_path: Path) -> None:
    """A case's prompt comes from the evaluation file: filled in as a whole argument, `--output=/x` would be an
    option of the user's program. wb refuses in one line and runs nothing; `--prompt={prompt}` or `-- {prompt}`
    passes it as a value."""
    (tmp_path / "g.jsonl").write_text('{"id": "a", "prompt": "--output=/tmp/x", "output_ids": [1, 2, 3]}\n')
    (tmp_path / "t.jsonl").write_text('{"id": "a", "prompt": "--output=/tmp/x", "output_ids": [1, 5, 3]}\n')
    record = tmp_path / "args.txt"
    script = "import sys; open(sys.argv[1], 'w').write('|'.join(sys.argv[2:]))"
    pairs = ("-gp", str(tmp_path / "g.jsonl"), "-mp", str(tmp_path / "t.jsonl"))
    res = run_wb("badcase", *pairs, "--run", f'{sys.executable} -c "{script}" {record} {{prompt}}')
    assert res.returncode == 2 and not record.exists(), res.stdout + res.stderr
    assert "starts with '-'" in res.stderr and "would reach" in res.stderr and res.stderr.count("\n") == 1
    for template in (f"{record} --prompt={{prompt}}", f"{record} -- {{prompt}}"):
        res = run_wb("badcase", *pairs, "--run", f'{sys.executable} -c "{script}" {template}')
        assert res.returncode == 0, res.stderr
        assert record.read_text().endswith("--output=/tmp/x")
        record.unlink()
