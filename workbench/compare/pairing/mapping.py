"""Mapping files: which golden op is compared with which test op.

Two formats are read (documented in docs/mapping.md):

* ours (`wb-mapping`, written by the app's mapping editor)::

    {"format": "wb-mapping", "version": 1,
     "pairs":    [{"golden": "root.model.layers.0.mlp.down_proj", "test": "2_Prefill_layer/9_LinearOperation",
                   "golden_tensor": "out:0", "test_tensor": "out:0",
                   "fingerprint": {"golden": {"type": "Linear", "token": 0, "tensors": {"out:0": "float32[1,5,64]"}},
                                   "test": {...}}}],
     "rules":    [{"golden": "root.model.layers.*.mlp.down_proj", "test": "*_Prefill_layer/9_LinearOperation"}],
     "types":    {"RmsNormOperation": ["LlamaRMSNorm"]},
     "unpaired": [{"golden": "...", "test": "..."}],
     "fingerprint": {"version": 1, "saved_at": "...", "golden": {"path": "...", "kind": "msit_torch",
                     "nodes": 61, "digest": "..."}, "test": {...}}}

  In `rules`, `*` matches within one name segment, and a golden node is paired with a test
  node only when both match and both have the same layer index (the layer wildcard).
  Tensor selectors: `out:0`, `in:1`, `out` (every output, by index), `in`, `*` (default:
  inputs and outputs, by index). The fingerprints (written by the editor, checked by
  `workbench.compare.pairing.fingerprint`) say what the dumps looked like when the mapping was saved.

* msit's `op_mapping_file.json` (`-mf DIR` reads `DIR/op_mapping_file.json`): a flat
  `{"AtbType[_file]": "TorchType[_file]" | [...]}` type map; a string value is one type
  (msit iterates it character by character; we do not).
"""

from __future__ import annotations

import hashlib
import json
import re
from collections import defaultdict
from collections.abc import Callable, Collection, Iterable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, NamedTuple

from workbench.core.capped import MAPPING, FileRefused, read_text

MAPPING_FORMAT = "wb-mapping"
MAPPING_VERSION = 1
MSIT_MAPPING_NAME = "op_mapping_file.json"
WB_MAPPING_NAME = "wb_mapping.json"
MAX_MAPPING_CHECK = 256 << 20  # a mapping file larger than this is not one wb wrote
_MSIT_KEY = re.compile(r"^[A-Za-z0-9_]+$")


class MappingError(ValueError):
    """A mapping file that cannot be used; the message names the file."""


@dataclass(frozen=True, slots=True)
class TensorSel:
    """Which tensors of a node take part: role `in`/`out`/None (both), index or None (all)."""

    role: str | None = None
    index: int | None = None

    @classmethod
    def parse(cls, text: str | None) -> TensorSel:
        if text is None or text.strip() in ("", "*", "all"):
            return cls()
        role, _, idx = text.strip().partition(":")
        role = {"input": "in", "output": "out"}.get(role, role)
        if role not in ("in", "out"):
            raise ValueError(f"tensor selector {text!r}: expected in[:N], out[:N] or *")
        if idx in ("", "*"):
            return cls(role, None)
        if not (idx.isascii() and idx.isdigit()):
            raise ValueError(f"tensor selector {text!r}: index must be a number")
        return cls(role, int(idx))

    def __str__(self) -> str:
        if self.role is None:
            return "*"
        return self.role if self.index is None else f"{self.role}:{self.index}"

    def accepts(self, role: str, index: int) -> bool:
        return (self.role is None or self.role == role) and (self.index is None or self.index == index)


@dataclass(frozen=True, slots=True)
class PairSpec:
    """One golden node paired with one test node (exact names)."""

    golden: str
    test: str
    golden_tensor: TensorSel = TensorSel()
    test_tensor: TensorSel = TensorSel()

    def to_json(self) -> dict[str, str]:
        out = {"golden": self.golden, "test": self.test}
        if self.golden_tensor != TensorSel() or self.test_tensor != TensorSel():
            out["golden_tensor"] = str(self.golden_tensor)
            out["test_tensor"] = str(self.test_tensor)
        return out


@dataclass(frozen=True, slots=True)
class RuleSpec:
    """A pattern pair with `*` wildcards; matched nodes pair when their layer indices agree."""

    golden: str
    test: str
    golden_tensor: TensorSel = TensorSel()
    test_tensor: TensorSel = TensorSel()

    @staticmethod
    def _regex(pattern: str) -> re.Pattern[str]:
        parts = [re.escape(p) for p in pattern.split("*")]
        return re.compile("^" + r"[^./]*".join(parts) + "$")

    def golden_regex(self) -> re.Pattern[str]:
        return self._regex(self.golden)

    def test_regex(self) -> re.Pattern[str]:
        return self._regex(self.test)

    def to_json(self) -> dict[str, str]:
        out = {"golden": self.golden, "test": self.test}
        if self.golden_tensor != TensorSel() or self.test_tensor != TensorSel():
            out["golden_tensor"] = str(self.golden_tensor)
            out["test_tensor"] = str(self.test_tensor)
        return out


_NUMBER = re.compile(r"[0-9]+")


def rule_across_layers(
    golden: str,
    test: str,
    golden_nodes: Iterable[tuple[str, int | None]],
    test_nodes: Iterable[tuple[str, int | None]],
    golden_tensor: TensorSel = TensorSel(),
    test_tensor: TensorSel = TensorSel(),
) -> RuleSpec | None:
    """The layer rule pairing `golden` with `test` in every layer. In each name, the number that becomes `*` is
    the one whose wildcard reaches the same op in the most layers among that side's nodes, given as (name, layer):
    `root.model.layers.2.act_fn` -> `root.model.layers.*.act_fn`, `2_Prefill_layer/9_LinearOperation` ->
    `*_Prefill_layer/9_LinearOperation` (9 numbers ops within a layer). None when no number reaches two layers."""
    patterns = []
    for name, nodes in ((golden, list(golden_nodes)), (test, list(test_nodes))):
        best: tuple[int, int, str] | None = None  # (layers reached, -nodes matched, pattern)
        for m in _NUMBER.finditer(name):
            pattern = name[: m.start()] + "*" + name[m.end() :]
            rx = RuleSpec._regex(pattern)
            hits = [layer for n, layer in nodes if rx.match(n)]
            score = (len({x for x in hits if x is not None}), -len(hits), pattern)
            if best is None or score[:2] > best[:2]:
                best = score
        if best is None or best[0] < 2:
            return None
        patterns.append(best[2])
    return RuleSpec(patterns[0], patterns[1], golden_tensor, test_tensor)


def expand_rule(
    rule: RuleSpec,
    golden: Iterable[tuple[str, int | None]],
    test: Iterable[tuple[str, int | None]],
    taken: Collection[str] = (),
) -> list[tuple[str, str]]:
    """The (golden, test) node names a layer rule pairs among nodes given as (name, layer): each golden node it
    matches with the one test node it matches in the same layer (none when there are several), skipping `taken`."""
    gre, tre = rule.golden_regex(), rule.test_regex()
    by_layer: dict[int | None, list[str]] = defaultdict(list)
    for name, layer in test:
        if tre.match(name):
            by_layer[layer].append(name)
    out = []
    for name, layer in golden:
        cands = by_layer.get(layer, [])
        if name not in taken and len(cands) == 1 and gre.match(name):
            out.append((name, cands[0]))
    return out


@dataclass(slots=True)
class TypeRule:
    """msit-style type mapping: test op type substring -> golden type substrings, optional tensor files."""

    test_type: str
    golden_types: list[str]
    test_tensor: TensorSel = TensorSel()
    golden_tensors: list[TensorSel] = field(default_factory=list)  # one per golden type; default: all outputs

    def __post_init__(self) -> None:
        if not self.golden_tensors:
            self.golden_tensors = [TensorSel("out", None)] * len(self.golden_types)


def _file_sel(file_part: str) -> TensorSel:
    """msit's tensor-file suffix (`outtensor0`, `output_0`, `intensor1`, `input_0`, `output`) as a selector."""
    m = re.fullmatch(r"(outtensor|intensor|output|input)_?([0-9]*)", file_part)
    if not m:
        return TensorSel()
    role = "out" if m.group(1) in ("outtensor", "output") else "in"
    return TensorSel(role, int(m.group(2)) if m.group(2) else None)


def _split_msit(entry: str) -> tuple[str, TensorSel]:
    typ, _, file_part = entry.partition("_")
    return typ, (_file_sel(file_part) if file_part else TensorSel("out", None))


@dataclass(slots=True)
class MappingFile:
    """A mapping: explicit pairs, layer-wildcard rules, type rules and rejected pairs."""

    pairs: list[PairSpec] = field(default_factory=list)
    rules: list[RuleSpec] = field(default_factory=list)
    types: list[TypeRule] = field(default_factory=list)
    unpaired: list[tuple[str, str]] = field(default_factory=list)
    source: str | None = None
    # what both nodes of each explicit pair looked like when the mapping was saved (golden, test) -> prints,
    # and the whole dumps' prints; None: a file saved without a fingerprint (see compare/pairing/fingerprint.py)
    pair_prints: dict[tuple[str, str], dict[str, Any]] = field(default_factory=dict)
    fingerprint: dict[str, Any] | None = None

    # ------------------------------------------------------------------ reading
    @classmethod
    def load(cls, path: str | Path) -> MappingFile:
        """Read `-mf PATH`: a wb-mapping file, msit's op_mapping_file.json, or a folder holding either/both."""
        p = Path(path)
        if p.is_dir():
            found = [p / WB_MAPPING_NAME, p / MSIT_MAPPING_NAME]
            files = [f for f in found if f.is_file()]
            if not files:
                raise MappingError(f"{p}: no {WB_MAPPING_NAME} or {MSIT_MAPPING_NAME} in this folder")
            merged = cls(source=str(p))
            for f in files:
                merged.merge(cls._load_file(f))
            return merged
        if not p.exists():
            raise MappingError(f"{p}: mapping file not found")
        return cls._load_file(p)

    @classmethod
    def _load_file(cls, p: Path) -> MappingFile:
        try:
            data = _decode_streamed(read_text(p, MAPPING), {"pairs": _PairReader()})
        except FileRefused as exc:
            raise MappingError(str(exc)) from None
        except (OSError, UnicodeDecodeError) as exc:
            raise MappingError(f"{p}: cannot read ({exc})") from None
        except json.JSONDecodeError as exc:
            raise MappingError(f"{p}: not valid JSON (line {exc.lineno}: {exc.msg})") from None
        except RecursionError:
            raise MappingError(f"{p}: JSON nested too deeply to read") from None
        except (ValueError, TypeError, KeyError) as exc:
            raise MappingError(f"{p}: {exc}") from None
        if not isinstance(data, dict):
            raise MappingError(f"{p}: expected a JSON object")
        try:
            if data.get("format") == MAPPING_FORMAT:
                out = cls._from_wb(data)
            else:
                out = cls._from_msit(data)
        except (ValueError, TypeError, KeyError) as exc:
            raise MappingError(f"{p}: {exc}") from None
        except RecursionError:
            raise MappingError(f"{p}: mapping nested too deeply to read") from None
        out.source = str(p)
        return out

    @classmethod
    def _from_wb(cls, data: dict[str, Any]) -> MappingFile:
        version = data.get("version", 1)
        if not isinstance(version, int) or version > MAPPING_VERSION:
            raise ValueError(f"mapping version {version!r} is newer than this wb understands ({MAPPING_VERSION})")
        out = cls()
        for item in data.get("pairs", []):
            if not isinstance(item, _LoadedPair):
                raise ValueError("'pairs' entries must be objects with golden and test")
            out.pairs.append(item.spec)
            if item.prints is not None:
                out.pair_prints[(item.spec.golden, item.spec.test)] = item.prints
        fingerprint = data.get("fingerprint")
        if fingerprint is not None and not isinstance(fingerprint, dict):
            raise ValueError("'fingerprint' must be an object")
        out.fingerprint = fingerprint
        for item in data.get("rules", []):
            out.rules.append(
                RuleSpec(
                    str(item["golden"]),
                    str(item["test"]),
                    TensorSel.parse(item.get("golden_tensor")),
                    TensorSel.parse(item.get("test_tensor")),
                )
            )
        types = data.get("types", {})
        if not isinstance(types, dict):
            raise ValueError("'types' must be an object of test type -> golden type(s)")
        out.types.extend(cls._type_rules(types))
        for item in data.get("unpaired", []):
            out.unpaired.append((str(item["golden"]), str(item["test"])))
        return out

    @classmethod
    def _from_msit(cls, data: dict[str, Any]) -> MappingFile:
        for key, value in data.items():
            values = value if isinstance(value, list) else [value]
            if not _MSIT_KEY.match(key) or not all(isinstance(v, str) and _MSIT_KEY.match(v) for v in values):
                raise ValueError(f"entry {key!r}: msit mapping keys and values are letters, digits and '_' only")
        return cls(types=cls._type_rules(data))

    @staticmethod
    def _type_rules(data: dict[str, Any]) -> list[TypeRule]:
        rules = []
        for key, value in data.items():
            values = value if isinstance(value, list) else [value]
            test_type, test_sel = _split_msit(key)
            goldens = [_split_msit(v) for v in values]
            rules.append(TypeRule(test_type, [g for g, _ in goldens], test_sel, [s for _, s in goldens]))
        return rules

    # ------------------------------------------------------------------ editing
    def merge(self, other: MappingFile) -> None:
        self.pairs.extend(p for p in other.pairs if p not in self.pairs)
        self.rules.extend(r for r in other.rules if r not in self.rules)
        self.types.extend(other.types)
        self.unpaired.extend(u for u in other.unpaired if u not in self.unpaired)
        for key, prints in other.pair_prints.items():
            self.pair_prints.setdefault(key, prints)
        if self.fingerprint is None:
            self.fingerprint = other.fingerprint

    def add_pair(self, pair: PairSpec) -> None:
        """Pair two nodes (drops an earlier rejection of the same pair)."""
        self.unpaired = [u for u in self.unpaired if u != (pair.golden, pair.test)]
        if pair not in self.pairs:
            self.pairs.append(pair)

    def remove_pair(self, golden: str, test: str) -> None:
        """Unpair two nodes: drop an explicit pair, and reject an automatic one."""
        self.drop_pair(golden, test)
        if (golden, test) not in self.unpaired:
            self.unpaired.append((golden, test))

    def add_rule(self, rule: RuleSpec) -> None:
        if rule not in self.rules:
            self.rules.append(rule)

    def drop_rule(self, rule: RuleSpec) -> None:
        self.rules = [r for r in self.rules if r != rule]

    def drop_pair(self, golden: str, test: str) -> None:
        """Forget an explicit pair (a stale one, say) without rejecting the two nodes for other methods."""
        self.pairs = [p for p in self.pairs if (p.golden, p.test) != (golden, test)]
        self.pair_prints.pop((golden, test), None)

    # ------------------------------------------------------------------ writing
    def to_json(self) -> dict[str, Any]:
        out = self._head()
        out["pairs"] = list(self._pair_items())
        return out

    def _pair_items(self) -> Iterator[dict[str, Any]]:
        for p in self.pairs:
            item: dict[str, Any] = dict(p.to_json())
            if (p.golden, p.test) in self.pair_prints:
                item["fingerprint"] = self.pair_prints[(p.golden, p.test)]
            yield item

    def json_chunks(self, *, sort_keys: bool = False) -> Iterator[str]:
        """`json.dumps(self.to_json(), sort_keys=sort_keys)` in pieces, one pair at a time (a million pairs never
        exist as a million dicts, nor their text twice)."""
        head = self._head()
        head["pairs"] = None
        keys = sorted(head) if sort_keys else list(head)
        yield "{"
        for n, key in enumerate(keys):
            yield (", " if n else "") + json.dumps(key) + ": "
            if key == "pairs":
                yield "["
                for i, item in enumerate(self._pair_items()):
                    yield (", " if i else "") + json.dumps(item, sort_keys=sort_keys)
                yield "]"
            else:
                yield json.dumps(head[key], sort_keys=sort_keys)
        yield "}"

    def _head(self) -> dict[str, Any]:
        """`to_json` without its pairs (their key is there, in its place)."""
        types: dict[str, list[str]] = {}
        for t in self.types:
            key = (
                t.test_type if t.test_tensor == TensorSel("out", None) else f"{t.test_type}_{_sel_file(t.test_tensor)}"
            )
            vals = [
                g if s == TensorSel("out", None) else f"{g}_{_sel_file(s, torch=True)}"
                for g, s in zip(t.golden_types, t.golden_tensors)
            ]
            types.setdefault(key, []).extend(vals)
        out: dict[str, Any] = {
            "format": MAPPING_FORMAT,
            "version": MAPPING_VERSION,
            "pairs": [],
            "rules": [r.to_json() for r in self.rules],
            "types": types,
            "unpaired": [{"golden": g, "test": t} for g, t in self.unpaired],
        }
        if self.fingerprint is not None:
            out["fingerprint"] = self.fingerprint
        return out

    def save(self, path: str | Path) -> Path:
        """Write the mapping as a wb-mapping JSON file (atomically); a folder gets `wb_mapping.json`. Callers
        that did not just read `path` as a wb-mapping file use `save_path` first (never over another file)."""
        p = Path(path)
        if p.is_dir():
            p = p / WB_MAPPING_NAME
        tmp = p.with_name(p.name + ".tmp")
        tmp.write_text(json.dumps(self.to_json(), indent=2) + "\n", encoding="utf-8")
        tmp.replace(p)
        return p

    def digest(self) -> str:
        """A short content hash, so a comparison knows which mapping produced it."""
        h = hashlib.sha256()
        saved = self.fingerprint
        if isinstance(saved, dict):  # when it was saved is no part of what it says
            self.fingerprint = {k: v for k, v in saved.items() if k != "saved_at"}
        try:
            for chunk in self.json_chunks(sort_keys=True):  # the bytes of json.dumps(to_json(), sort_keys=True)
                h.update(chunk.encode())
        finally:
            self.fingerprint = saved
        return h.hexdigest()[:16]

    def is_empty(self) -> bool:
        return not (self.pairs or self.rules or self.types or self.unpaired)


class _LoadedPair(NamedTuple):
    spec: PairSpec
    prints: dict[str, Any] | None


class _PairReader:
    """One `pairs` entry of a wb mapping, made compact as it is decoded: selectors and fingerprints that repeat
    (most of them: one per op kind and shape) are one shared object, never mutated."""

    def __init__(self) -> None:
        self._sels: dict[Any, TensorSel] = {}
        self._prints: dict[str, dict[str, Any]] = {}

    def _sel(self, text: Any) -> TensorSel:
        sel = self._sels.get(text)
        if sel is None:
            sel = self._sels[text] = TensorSel.parse(text)
        return sel

    def __call__(self, item: Any) -> Any:
        if not isinstance(item, dict):
            return item
        spec = PairSpec(
            str(item["golden"]),
            str(item["test"]),
            self._sel(item.get("golden_tensor")),
            self._sel(item.get("test_tensor")),
        )
        fp = item.get("fingerprint")
        if not isinstance(fp, dict):
            return _LoadedPair(spec, None)
        key = json.dumps(fp, sort_keys=True, separators=(",", ":"))
        return _LoadedPair(spec, self._prints.setdefault(key, fp))


_WS = re.compile(r"[ \t\n\r]*")


def _decode_streamed(text: str, readers: dict[str, Callable[[Any], Any]]) -> Any:
    """`json.loads(text)`, except that the entries of a top-level array under a key of `readers` are decoded
    one at a time and handed to its reader (what it returns is kept): a million-pair mapping never exists as a
    million dicts at once. `json.JSONDecodeError` (positions in `text`) as `json.loads` would raise."""
    dec = json.JSONDecoder()

    def ws(i: int) -> int:
        m = _WS.match(text, i)
        return m.end() if m else i

    def expect(i: int, chars: str, what: str) -> str:
        if i >= len(text) or text[i] not in chars:
            raise json.JSONDecodeError(f"Expecting {what}", text, i)
        return text[i]

    i = ws(0)
    if not text.startswith("{", i):
        return json.loads(text)
    out: dict[str, Any] = {}
    i = ws(i + 1)
    if text.startswith("}", i):
        i += 1
    else:
        while True:
            expect(i, '"', "property name enclosed in double quotes")
            key, i = dec.raw_decode(text, i)
            i = ws(i)
            expect(i, ":", "':' delimiter")
            i = ws(i + 1)
            reader = readers.get(key)
            if reader is not None and text.startswith("[", i):
                items: list[Any] = []
                i = ws(i + 1)
                if text.startswith("]", i):
                    i += 1
                else:
                    while True:
                        item, i = dec.raw_decode(text, i)
                        items.append(reader(item))
                        i = ws(i)
                        if expect(i, ",]", "',' delimiter") == "]":
                            i += 1
                            break
                        i = ws(i + 1)
                out[key] = items
            else:
                out[key], i = dec.raw_decode(text, i)
            i = ws(i)
            if expect(i, ",}", "',' delimiter") == "}":
                i += 1
                break
            i = ws(i + 1)
    i = ws(i)
    if i != len(text):
        raise json.JSONDecodeError("Extra data", text, i)
    return out


def _sel_file(sel: TensorSel, torch: bool = False) -> str:
    if torch:
        base = "output" if sel.role == "out" else "input"
        return base if sel.index is None else f"{base}_{sel.index}"
    base = "outtensor" if sel.role == "out" else "intensor"
    return base if sel.index is None else f"{base}{sel.index}"


def is_wb_mapping(path: Path) -> bool:
    """Whether `path` is a wb-mapping file (one wb wrote and may write again)."""
    try:
        if not path.is_file() or path.stat().st_size > MAX_MAPPING_CHECK:
            return False
        data = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, ValueError, RecursionError):
        return False
    return isinstance(data, dict) and data.get("format") == MAPPING_FORMAT


def save_path(path: Path) -> Path:
    """Where a save to `path` goes: `path` when it is free or a wb-mapping file, else a free name beside it
    (`x.wb.json`, `x.wb.2.json`, ...): msit's `op_mapping_file.json` or any other file of the user's is
    never overwritten."""
    if path.is_dir():
        path = path / WB_MAPPING_NAME
    if not path.exists() or is_wb_mapping(path):
        return path
    n = 1
    while True:
        cand = path.with_name(f"{path.stem}.wb{'' if n == 1 else f'.{n}'}.json")
        if not cand.exists() or is_wb_mapping(cand):
            return cand
        n += 1
