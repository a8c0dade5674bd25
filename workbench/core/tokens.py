"""Token selections: `--tokens` text parsed into ranges, and token ids written back as ranges ('0-3,7')."""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass

MAX_EXPANDED = 1_000_000  # tokens a --tokens text may name when the dumps' own tokens are not known


def token_text(tokens: Iterable[int], sep: str = ",") -> str:
    """[0, 1, 2, 3, 7] -> '0-3,7' (`sep=", "`: '0-3, 7')."""
    out: list[list[int]] = []
    for t in sorted(set(tokens)):
        if out and t == out[-1][1] + 1:
            out[-1][1] = t
        else:
            out.append([t, t])
    return sep.join(str(a) if a == b else f"{a}-{b}" for a, b in out)


@dataclass(frozen=True, slots=True)
class TokenRanges:
    """A `--tokens` selection as ranges: bound to the tokens a dump holds (`among`), never expanded."""

    ranges: tuple[tuple[int, int], ...]

    def __contains__(self, token: object) -> bool:
        return isinstance(token, int) and any(a <= token <= b for a, b in self.ranges)

    @property
    def text(self) -> str:
        """The selection as it is written: '0-3,7'."""
        return ",".join(str(a) if a == b else f"{a}-{b}" for a, b in self.ranges)

    def among(self, *present: Iterable[int]) -> set[int]:
        """The selected tokens among those present (`0-1000000` on a 3-token dump: at most 3)."""
        return {t for tokens in present for t in tokens if t in self}


def token_ranges(text: str | None) -> TokenRanges | None:
    """`0-3,7` -> ranges (0, 3), (7, 7); None or empty -> None (all tokens). Checks the syntax; expands nothing."""
    if not text:
        return None
    out: list[tuple[int, int]] = []
    for part in text.split(","):
        part = part.strip()
        if not part:
            continue
        lo, sep, hi = part.partition("-")
        lo, hi = lo.strip(), hi.strip()
        ok = lo.isascii() and lo.isdigit() and (not sep or (hi.isascii() and hi.isdigit()))
        if not ok or len(lo) > 18 or len(hi) > 18:
            raise ValueError(f"--tokens {text!r}: expected numbers and ranges like 0-3,7")
        a = int(lo)
        b = int(hi) if sep else a
        if b < a:
            raise ValueError(f"--tokens {text!r}: range {part} goes backwards")
        out.append((a, b))
    return TokenRanges(tuple(out))


def parse_tokens(text: str | None, present: Iterable[int] | None = None) -> set[int] | None:
    """`0-3,7` -> {0, 1, 2, 3, 7}; None or empty -> None (all tokens).

    With `present` (the tokens the dumps hold) the result is the selected tokens among them, whatever the
    ranges span (`0-1000000` on a 3-token dump costs nothing); without it a range may span at most
    `MAX_EXPANDED` tokens."""
    sel = token_ranges(text)
    if sel is None:
        return None
    if present is not None:
        return sel.among(present)
    if sum(b - a + 1 for a, b in sel.ranges) > MAX_EXPANDED:
        raise ValueError(f"--tokens {text!r}: more than {MAX_EXPANDED} tokens")
    out: set[int] = set()
    for a, b in sel.ranges:
        out.update(range(a, b + 1))
    return out
