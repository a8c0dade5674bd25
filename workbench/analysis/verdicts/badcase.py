"""Bad cases: which cases of two result files (golden run, test run) flipped pass/fail or produce other outputs.

Inputs, each read as it is:
- msit `llm analyze` CSV: `queries,input_token_ids,output_token_ids,passed` (key: `queries`);
- msit `llm bcanalyze` CSV: `key,passed` (msit also accepts `pass`), optional `queries` and token id columns;
- JSONL: one object per line with `id`, `prompt`, and `output` (text) or `output_ids` (ids), optional `passed`.
`passed` accepts msit's spellings (true/false, correct/wrong, pass/fail, 1/0). The first differing output
position is counted in token ids when both sides have ids, else in characters of the output text.
"""

from __future__ import annotations

import csv
import itertools
import json
import re
from array import array
from collections.abc import Iterable, Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import IO, Any

from workbench.core.capped import RESULTS, FileRefused, open_capped
from workbench.core.text import printable

_TRUE = {"true", "correct", "pass", "passed", "1", "yes"}
_FALSE = {"false", "wrong", "fail", "failed", "0", "no"}
_INT_RE = re.compile(r"-?[0-9]+")


class BadCaseError(ValueError):
    """A malformed result file; the message names the file and the line."""


@dataclass(slots=True)
class Case:
    """One case of one result file."""

    key: str
    line: int
    prompt: str | None = None
    output_ids: list[int] | None = None
    output: str | None = None
    passed: bool | None = None


@dataclass(slots=True)
class BadCase:
    """A case whose verdict flipped or whose outputs differ."""

    key: str
    prompt: str | None
    passed_golden: bool | None
    passed_test: bool | None
    flipped: bool
    outputs_differ: bool | None  # None: no outputs to compare
    first_diff: int | None  # first differing output position
    unit: str | None  # "token" (ids) or "char" (text)
    golden_at: str | None  # the golden side's id / character there ("" past its end)
    test_at: str | None

    def as_dict(self) -> dict[str, Any]:
        return {
            "key": self.key,
            "prompt": self.prompt,
            "passed_golden": self.passed_golden,
            "passed_test": self.passed_test,
            "flipped": self.flipped,
            "outputs_differ": self.outputs_differ,
            "first_diff": self.first_diff,
            "unit": self.unit,
            "golden_at": self.golden_at,
            "test_at": self.test_at,
        }


def _passed(value: Any, where: str) -> bool | None:
    if value is None or (isinstance(value, str) and not value.strip()):
        return None
    if isinstance(value, bool):
        return value
    text = str(value).strip().lower()
    if text in _TRUE:
        return True
    if text in _FALSE:
        return False
    raise BadCaseError(f"{where}: passed {value!r} is not true/false, correct/wrong, pass/fail or 1/0")


def _ids(value: Any, where: str, column: str) -> list[int] | None:
    if value is None:
        return None
    if isinstance(value, list):
        if not all(isinstance(v, int) and not isinstance(v, bool) for v in value):
            raise BadCaseError(f"{where}: {column} must be a list of integers")
        return list(value)
    text = str(value).strip()
    if not text:
        return None
    leftover = _INT_RE.sub("", text).strip("[](), \t;")
    if re.sub(r"[\s,;\[\]()]", "", leftover):
        raise BadCaseError(f"{where}: {column} {text[:60]!r} is not a list of token ids")
    return [int(v) for v in _INT_RE.findall(text)]


def _open(p: Path) -> IO[str]:
    try:
        return open_capped(p, RESULTS, encoding="utf-8-sig", newline="")
    except FileNotFoundError:
        raise BadCaseError(f"{p}: no such file") from None
    except FileRefused as exc:
        raise BadCaseError(str(exc)) from None
    except OSError as exc:
        raise BadCaseError(f"{p}: cannot read ({exc.strerror or exc})") from None


def iter_cases(path: str | Path) -> Iterator[Case]:
    """The cases of one result file (CSV from msit's bad-case tools, or JSONL), read as a stream: one line at a
    time, never the whole file. `BadCaseError` naming the file (and line) when it is malformed, not a regular
    file or over the `RESULTS` cap."""
    p = Path(path)
    with _open(p) as fh:
        try:
            head: list[str] = []
            for line in fh:
                head.append(line)
                if line.strip():
                    break
            lines = itertools.chain(head, fh)
            if head and head[-1].lstrip().startswith("{"):
                yield from _read_jsonl(p, lines)
            else:
                yield from _read_csv(p, lines)
        except UnicodeDecodeError as exc:
            raise BadCaseError(f"{p}: cannot read ({exc})") from None
        except OSError as exc:
            raise BadCaseError(f"{p}: cannot read ({exc.strerror or exc})") from None


def read_cases(path: str | Path) -> list[Case]:
    """Every case of one result file, in a list (small files; `wb badcase` streams with `find_bad_cases`)."""
    cases = list(iter_cases(path))
    seen: dict[str, int] = {}
    for c in cases:
        if c.key in seen:
            raise BadCaseError(f"{path}:{c.line}: case {c.key!r} repeats line {seen[c.key]}")
        seen[c.key] = c.line
    return cases


def _read_jsonl(p: Path, lines: Iterable[str]) -> Iterator[Case]:
    for n, line in enumerate(lines, 1):
        if not line.strip():
            continue
        where = f"{p}:{n}"
        try:
            obj = json.loads(line)
        except json.JSONDecodeError as exc:
            raise BadCaseError(f"{where}: not valid JSON ({exc.msg})") from None
        except RecursionError:
            raise BadCaseError(f"{where}: JSON nested too deeply to read") from None
        if not isinstance(obj, dict):
            raise BadCaseError(f"{where}: expected a JSON object")
        if "id" not in obj:
            raise BadCaseError(f"{where}: no 'id'")
        if "output" not in obj and "output_ids" not in obj:
            raise BadCaseError(f"{where}: neither 'output' nor 'output_ids'")
        output = obj.get("output")
        if output is not None and not isinstance(output, str):
            raise BadCaseError(f"{where}: 'output' must be text")
        _ids(obj.get("input_ids"), where, "input_ids")  # checked, not kept: nothing compares them
        yield Case(
            key=str(obj["id"]),
            line=n,
            prompt=None if obj.get("prompt") is None else str(obj["prompt"]),
            output_ids=_ids(obj.get("output_ids"), where, "output_ids"),
            output=output,
            passed=_passed(obj.get("passed"), where),
        )


def _read_csv(p: Path, lines: Iterable[str]) -> Iterator[Case]:
    try:
        reader = csv.DictReader(lines)
        header = [h.strip() for h in (reader.fieldnames or [])]
    except csv.Error as exc:
        raise BadCaseError(f"{p}:1: not a CSV file ({exc})") from None
    cols = set(header)
    if "pass" in cols and "passed" not in cols:
        cols.add("passed")
    if "key" in cols:
        key_col = "key"
    elif {"queries", "output_token_ids"} <= cols:
        key_col = "queries"
    else:
        raise BadCaseError(
            f"{p}:1: expected msit's bad-case columns (key,passed or queries,input_token_ids,output_token_ids,passed), "
            f"got {printable(','.join(header)[:100])}"
        )
    if "passed" not in cols and "output_token_ids" not in cols:
        raise BadCaseError(f"{p}:1: no 'passed' column and no outputs to compare")
    try:
        for row in reader:
            n = reader.line_num
            where = f"{p}:{n}"
            if None in row or any(v is None for v in row.values()):
                raise BadCaseError(f"{where}: the number of fields differs from the header's {len(header)}")
            row = {str(k).strip(): v for k, v in row.items()}
            key = (row.get(key_col) or "").strip()
            if not key:
                raise BadCaseError(f"{where}: empty {key_col}")
            _ids(row.get("input_token_ids"), where, "input_token_ids")
            prompt = row.get("queries") or None
            yield Case(
                key=key,
                line=n,
                prompt=key if prompt == key else prompt,  # msit's analyze CSV: the key is the prompt, kept once
                output_ids=_ids(row.get("output_token_ids"), where, "output_token_ids"),
                passed=_passed(row.get("passed", row.get("pass")), where),
            )
    except csv.Error as exc:
        raise BadCaseError(f"{p}:{reader.line_num}: malformed CSV ({exc})") from None


def first_difference(golden: Sequence[Any], test: Sequence[Any]) -> int | None:
    """The first position where two sequences differ (one ending early counts), None when equal."""
    for i, (a, b) in enumerate(zip(golden, test, strict=False)):
        if a != b:
            return i
    return None if len(golden) == len(test) else min(len(golden), len(test))


def _at(seq: Sequence[Any], i: int) -> str:
    return str(seq[i]) if i < len(seq) else ""


class _Kept:
    """One case of the file held in memory, compactly: output ids packed 8 bytes each, no input ids."""

    __slots__ = ("golden_line", "ids", "line", "output", "passed", "prompt")

    def __init__(self, c: Case, where: str) -> None:
        self.line = c.line
        self.passed = c.passed
        self.ids = _pack(c.output_ids, where)
        self.output = c.output
        self.prompt = c.prompt
        self.golden_line: int | None = None  # the golden case it was compared with


def _pack(ids: list[int] | None, where: str) -> bytes | None:
    if ids is None:
        return None
    try:
        return array("q", ids).tobytes()
    except OverflowError:
        raise BadCaseError(f"{where}: a token id does not fit 64 bits") from None


def _unpack(data: bytes) -> array[int]:
    a = array("q")
    a.frombytes(data)
    return a


@dataclass(slots=True)
class CaseCounts:
    """What `find_bad_cases` saw besides the bad cases."""

    common: int = 0  # cases in both files
    only_golden: int = 0
    only_test: int = 0


def find_bad_cases(golden: str | Path, test: str | Path, counts: CaseCounts) -> Iterator[BadCase]:
    """The bad cases, in golden order, streaming the golden file against the test file's cases held compactly
    (memory ~ the test file's keys and outputs, not its text or both files' parsed rows); `counts` is filled
    in as it goes. `BadCaseError` when either file is malformed or repeats a key."""
    _open(Path(golden)).close()  # a missing or refused golden file is named before the test file is read
    kept: dict[str, _Kept] = {}
    for c in iter_cases(test):
        first = kept.get(c.key)
        if first is not None:
            raise BadCaseError(f"{test}:{c.line}: case {c.key!r} repeats line {first.line}")
        kept[c.key] = _Kept(c, f"{test}:{c.line}")
    only_golden: dict[str, int] = {}
    for g in iter_cases(golden):
        t = kept.get(g.key)
        if t is None:
            if g.key in only_golden:
                raise BadCaseError(f"{golden}:{g.line}: case {g.key!r} repeats line {only_golden[g.key]}")
            only_golden[g.key] = g.line
            continue
        if t.golden_line is not None:
            raise BadCaseError(f"{golden}:{g.line}: case {g.key!r} repeats line {t.golden_line}")
        t.golden_line = g.line
        counts.common += 1
        bad = _judge(g, t, f"{golden}:{g.line}")
        if bad is not None:
            yield bad
    counts.only_golden = len(only_golden)
    counts.only_test = sum(1 for t in kept.values() if t.golden_line is None)


def _judge(g: Case, t: _Kept, where: str) -> BadCase | None:
    flipped = g.passed is not None and t.passed is not None and g.passed != t.passed
    diff: int | None = None
    unit: str | None = None
    differ: bool | None = None
    g_at = t_at = None
    g_seq: Sequence[Any] | None = None
    t_seq: Sequence[Any] | None = None
    if g.output_ids is not None and t.ids is not None:
        unit = "token"
        if _pack(g.output_ids, where) == t.ids:
            differ = False
        else:
            g_seq, t_seq = g.output_ids, _unpack(t.ids)
    elif g.output is not None and t.output is not None:
        unit = "char"
        if g.output == t.output:
            differ = False
        else:
            g_seq, t_seq = g.output, t.output
    else:
        unit = None
    if g_seq is not None and t_seq is not None:
        diff = first_difference(g_seq, t_seq)
        differ = diff is not None
        if diff is not None:
            g_at, t_at = _at(g_seq, diff), _at(t_seq, diff)
    if not (flipped or differ):
        return None
    return BadCase(g.key, g.prompt or t.prompt, g.passed, t.passed, flipped, differ, diff, unit, g_at, t_at)


def compare_cases(golden: list[Case], test: list[Case]) -> tuple[list[BadCase], list[str], list[str]]:
    """(bad cases in golden order, keys only in golden, keys only in test), for cases already in memory."""
    by_key = {c.key: _Kept(c, c.key) for c in test}
    out: list[BadCase] = []
    for g in golden:
        t = by_key.get(g.key)
        if t is not None:
            t.golden_line = g.line
            bad = _judge(g, t, g.key)
            if bad is not None:
                out.append(bad)
    g_keys = {c.key for c in golden}
    return out, [c.key for c in golden if c.key not in by_key], [c.key for c in test if c.key not in g_keys]


def next_dump(case: BadCase) -> list[str]:
    """What to dump next for a bad case: both runs, tokens 0 .. the first differing one."""
    if case.first_diff is None:
        last = None
        note = "(its verdict flipped while its outputs are equal or unknown: start with its first tokens)"
        tokens = "[0, 1, 2, 3]"
    else:
        last = case.first_diff
        tokens = f"list(range({last + 1}))"
        note = (
            f"(output token {last} is the first that differs)"
            if case.unit == "token"
            else f"(character {last} is the first that differs; its token index is at most {last})"
        )
    prompt = (case.prompt or "")[:60]
    return [
        f"next: dump case {case.key!r}"
        + (f" (prompt {prompt!r})" if prompt else "")
        + f", tokens 0-{last if last is not None else 3} {note}:",
        f'  golden: register_hook(model, DumpConfig(dump_path="./golden", token_range={tokens}))',
        f'  test:   register_hook(model, DumpConfig(dump_path="./test", token_range={tokens}, '
        'follow_tokens="./golden"))',
        '  ATB:    msit llm dump --exec "<your run of this case>" --type model tensor -er 0,'
        + (str(last) if last is not None else "3")
        + "   (execute counts: add 1 to both ends when MindIE runs a warmup first)",
        "  then:   wb compare -gp ./golden -mp ./test -o out/",
    ]


def run_command(template: str, case: BadCase) -> tuple[list[str], int]:
    """Run `template` for a bad case, `{prompt}`, `{key}`, `{tokens}` (`0,1,..,N`) and `{last_token}` filled in
    (each as one argument); returns (the argv, its exit status). `BadCaseError` when it cannot be started."""
    import shlex
    import subprocess

    last = case.first_diff if case.first_diff is not None else 3
    values = {
        "prompt": case.prompt or "",
        "key": case.key,
        "tokens": ",".join(str(t) for t in range(last + 1)),
        "last_token": str(last),
    }
    try:
        parts = shlex.split(template)
    except ValueError as exc:
        raise BadCaseError(f"--run {template!r}: {exc}") from None
    if not parts:
        raise BadCaseError("--run: empty command")
    try:
        argv = [p.format(**values) for p in parts]
    except (KeyError, IndexError, ValueError) as exc:
        raise BadCaseError(
            f"--run {template!r}: unknown placeholder {exc} (use {{prompt}}, {{key}}, {{tokens}}, {{last_token}})"
        ) from None
    for i, (part, arg) in enumerate(zip(parts, argv)):
        # a case's text (a prompt from the evaluation file) must not reach the program as one of its options
        if arg.startswith("-") and not part.startswith("-") and "--" not in parts[:i]:
            raise BadCaseError(
                f"--run {template!r}: the case's {part} starts with '-' ({arg[:30]!r}) and would reach "
                f"{argv[0]} as an option; pass it as a value (--prompt={part}) or after --"
            )
    try:
        proc = subprocess.run(argv, check=False)
    except OSError as exc:
        raise BadCaseError(f"--run: cannot start {argv[0]!r} ({exc.strerror or exc})") from None
    return argv, proc.returncode
