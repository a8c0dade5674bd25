"""Text safe to print on one line: file names and file content can hold anything."""

from __future__ import annotations

import re

# C0/C1 controls, DEL, lone surrogates (undecodable bytes of a file name) and Unicode line separators
_UNSAFE = re.compile(r"[\x00-\x1f\x7f-\x9f\ud800-\udfff\u2028\u2029]")


def _escape(m: re.Match[str]) -> str:
    ch = m.group(0)
    code = ord(ch)
    if 0xDC80 <= code <= 0xDCFF:  # a byte os.fsdecode could not decode (surrogateescape)
        return f"\\x{code - 0xDC00:02x}"
    return {"\n": "\\n", "\r": "\\r", "\t": "\\t"}.get(ch, f"\\x{code:02x}" if code < 0x100 else f"\\u{code:04x}")


def printable(text: object) -> str:
    """`text` with control characters, line separators and undecodable bytes escaped (`\\n`, `\\x1b`, `\\xff`):
    a printed path stays one line and cannot spoof another line or drive the terminal."""
    s = str(text)
    return _UNSAFE.sub(_escape, s) if _UNSAFE.search(s) else s


def quote_bytes(data: bytes | str, limit: int = 8) -> str:
    """At most `limit` bytes of a file's content, escaped and quoted (a problem line never leaks more)."""
    raw = data.encode("utf-8", "surrogateescape") if isinstance(data, str) else data
    shown = raw[:limit].decode("ascii", "backslashreplace")
    return repr(printable(shown) + ("..." if len(raw) > limit else ""))


def storable(text: str) -> str:
    """`text` as valid UTF-8 for the catalog: undecodable bytes of a file name become `\\xNN`."""
    try:
        text.encode("utf-8")
        return text
    except UnicodeEncodeError:
        return text.encode("utf-8", "surrogateescape").decode("utf-8", "backslashreplace")


_ASCII_INT = re.compile(r"-?[0-9]+")


def ascii_int(text: object) -> int | None:
    """The integer a name or field from disk spells in ASCII digits (a leading `-` allowed), else None.

    `int()` alone also reads `٣` or `３` as 3, and accepts spaces and `1_0`: a crafted folder name would pass
    for another one (`npu١_2` for device 1)."""
    s = str(text)
    return int(s) if _ASCII_INT.fullmatch(s) else None


def has_foreign_digit(name: str) -> bool:
    """Whether a name holds a digit that is not ASCII (`١`, `²`, `３`): such a name never passes for a number."""
    return any(c.isdigit() and not c.isascii() for c in name)


# msit's rule for a CSV cell a spreadsheet would run (msprobe `MALICIOUS_CSV_PATTERN`), plus TAB and CR: a cell that
# starts with one of `FORMULA_STARTS`, or holds `;` and then one of `_FORMULA_TRIGGERS` (text starting otherwise and
# holding no `;` is safe as it is: the quick check, here and in `core.output.report_line_sql`'s SQL)
_FORMULA_TRIGGERS = "=+-@%\uff1d\uff0b\uff0d\uff20"
FORMULA_STARTS = _FORMULA_TRIGGERS + "\t\r"
_FORMULA = re.compile(f"^[{re.escape(FORMULA_STARTS)}]|;[{re.escape(_FORMULA_TRIGGERS)}]")


def csv_safe(value: object) -> object:
    """A CSV cell a spreadsheet will not evaluate: text starting with `= + - @ %`, TAB or CR (or holding
    `;=`, `;+`...) gets a leading `'`, as msit does; numbers, and text that reads as a number (`-0.5`), stay."""
    # text starting otherwise and holding no `;` cannot match: checked before the search, which scans a whole path
    if not isinstance(value, str) or (value[:1] not in FORMULA_STARTS and ";" not in value):
        return value
    if not _FORMULA.search(value):
        return value
    try:
        float(value)
        return value
    except ValueError:
        return "'" + value
