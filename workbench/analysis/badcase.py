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
import json
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Any

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
    input_ids: list[int] | None = None
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


def read_cases(path: str | Path) -> list[Case]:
    """The cases of one result file (CSV from msit's bad-case tools, or JSONL); `BadCaseError` when malformed."""
    p = Path(path)
    try:
        text = p.read_text(encoding="utf-8-sig")
    except FileNotFoundError:
        raise BadCaseError(f"{p}: no such file") from None
    except (OSError, UnicodeDecodeError) as exc:
        raise BadCaseError(f"{p}: cannot read ({getattr(exc, 'strerror', None) or exc})") from None
    first = next((ln for ln in text.splitlines() if ln.strip()), "")
    cases = _read_jsonl(p, text) if first.lstrip().startswith("{") else _read_csv(p, text)
    seen: dict[str, int] = {}
    for c in cases:
        if c.key in seen:
            raise BadCaseError(f"{p}:{c.line}: case {c.key!r} repeats line {seen[c.key]}")
        seen[c.key] = c.line
    return cases


def _read_jsonl(p: Path, text: str) -> list[Case]:
    cases = []
    for n, line in enumerate(text.splitlines(), 1):
        if not line.strip():
            continue
        where = f"{p}:{n}"
        try:
            obj = json.loads(line)
        except json.JSONDecodeError as exc:
            raise BadCaseError(f"{where}: not valid JSON ({exc.msg})") from None
        if not isinstance(obj, dict):
            raise BadCaseError(f"{where}: expected a JSON object")
        if "id" not in obj:
            raise BadCaseError(f"{where}: no 'id'")
        if "output" not in obj and "output_ids" not in obj:
            raise BadCaseError(f"{where}: neither 'output' nor 'output_ids'")
        output = obj.get("output")
        if output is not None and not isinstance(output, str):
            raise BadCaseError(f"{where}: 'output' must be text")
        cases.append(
            Case(
                key=str(obj["id"]),
                line=n,
                prompt=None if obj.get("prompt") is None else str(obj["prompt"]),
                input_ids=_ids(obj.get("input_ids"), where, "input_ids"),
                output_ids=_ids(obj.get("output_ids"), where, "output_ids"),
                output=output,
                passed=_passed(obj.get("passed"), where),
            )
        )
    return cases


def _read_csv(p: Path, text: str) -> list[Case]:
    try:
        reader = csv.DictReader(text.splitlines())
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
            f"got {','.join(header)[:100]}"
        )
    if "passed" not in cols and "output_token_ids" not in cols:
        raise BadCaseError(f"{p}:1: no 'passed' column and no outputs to compare")
    cases = []
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
            cases.append(
                Case(
                    key=key,
                    line=n,
                    prompt=row.get("queries") or None,
                    input_ids=_ids(row.get("input_token_ids"), where, "input_token_ids"),
                    output_ids=_ids(row.get("output_token_ids"), where, "output_token_ids"),
                    passed=_passed(row.get("passed", row.get("pass")), where),
                )
            )
    except csv.Error as exc:
        raise BadCaseError(f"{p}:{reader.line_num}: malformed CSV ({exc})") from None
    return cases


def first_difference(golden: list[Any] | str, test: list[Any] | str) -> int | None:
    """The first position where two sequences differ (one ending early counts), None when equal."""
    for i, (a, b) in enumerate(zip(golden, test, strict=False)):
        if a != b:
            return i
    return None if len(golden) == len(test) else min(len(golden), len(test))


def _at(seq: list[int] | str, i: int) -> str:
    return str(seq[i]) if i < len(seq) else ""


def compare_cases(golden: list[Case], test: list[Case]) -> tuple[list[BadCase], list[str], list[str]]:
    """(bad cases in golden order, keys only in golden, keys only in test)."""
    by_key = {c.key: c for c in test}
    out: list[BadCase] = []
    for g in golden:
        t = by_key.get(g.key)
        if t is None:
            continue
        flipped = g.passed is not None and t.passed is not None and g.passed != t.passed
        diff: int | None = None
        unit: str | None = None
        differ: bool | None = None
        g_at = t_at = None
        g_seq: list[int] | str | None
        t_seq: list[int] | str | None
        if g.output_ids is not None and t.output_ids is not None:
            g_seq, t_seq, unit = g.output_ids, t.output_ids, "token"
        elif g.output is not None and t.output is not None:
            g_seq, t_seq, unit = g.output, t.output, "char"
        else:
            g_seq = t_seq = None
        if g_seq is not None and t_seq is not None:
            diff = first_difference(g_seq, t_seq)
            differ = diff is not None
            if diff is not None:
                g_at, t_at = _at(g_seq, diff), _at(t_seq, diff)
        if flipped or differ:
            out.append(
                BadCase(g.key, g.prompt or t.prompt, g.passed, t.passed, flipped, differ, diff, unit, g_at, t_at)
            )
    keys = set(by_key)
    g_keys = {c.key for c in golden}
    return out, [c.key for c in golden if c.key not in keys], [c.key for c in test if c.key not in g_keys]


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
    try:
        proc = subprocess.run(argv, check=False)
    except OSError as exc:
        raise BadCaseError(f"--run: cannot start {argv[0]!r} ({exc.strerror or exc})") from None
    return argv, proc.returncode
