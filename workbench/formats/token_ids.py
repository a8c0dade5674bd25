"""The token ids a run fed its model: recorded by our dumpers, or read from the embedding's integer inputs.

Our torch dumper records every root call's input ids (`token_ids`) and the generated ids (`generated`) in
`wb_manifest.json`; our ATB stack records the prompt (`input_ids`) and `generated`. Dumps from other dumpers
(msit, msprobe, real ATB) hold the ids as the integer input of the word embedding (`embed_tokens`,
`WordEmbedding`), when inputs were dumped.
"""

from __future__ import annotations

import os
import re
from collections.abc import Iterable
from pathlib import Path
from typing import Any

from workbench.core.files import MANIFEST_NAME
from workbench.core.text import ascii_int
from workbench.formats.model import DumpError, token_number
from workbench.formats.scan import read_json

_EMBED_RE = re.compile(r"word_?embed|embed_tokens|tok_embeddings|\bwte\b|embedding", re.IGNORECASE)
_NOT_EMBED_RE = re.compile(r"position|rotary|rope", re.IGNORECASE)
INT_DTYPES = frozenset({"int64", "int32", "int16", "uint8", "int8", "uint16", "uint32", "uint64"})


def is_embedding_node(name: str, node_type: str | None) -> bool:
    """A word-embedding module or op (its integer input is the token ids); positional embeddings are not."""
    text = f"{name} {node_type or ''}"
    return bool(_EMBED_RE.search(text)) and not _NOT_EMBED_RE.search(text)


def _int_list(value: Any) -> list[int] | None:
    if isinstance(value, list) and all(isinstance(v, int) and not isinstance(v, bool) for v in value):
        return list(value)
    return None


def _flat_ids(value: Any) -> list[int] | None:
    """A prompt recorded as `[ids]` or `[[ids]]` (batch 1)."""
    if isinstance(value, list) and len(value) == 1 and isinstance(value[0], list):
        value = value[0]
    return _int_list(value)


def recorded_input_ids(meta: dict[str, Any]) -> dict[int, list[int]]:
    """Token -> the ids the model was fed at that token, from a run's manifest (empty when none recorded)."""
    out: dict[int, list[int]] = {}
    per_call = meta.get("token_ids")
    if isinstance(per_call, dict):
        for key, ids in per_call.items():
            flat = _int_list(ids)
            tok = ascii_int(key)
            if tok is not None and tok >= 0 and flat is not None:
                out[tok] = flat
        return out
    atb = meta.get("wb_manifest")
    if isinstance(atb, dict):
        prompt = _flat_ids(atb.get("input_ids"))
        generated = _int_list(atb.get("generated"))
        if prompt is not None:
            out[0] = prompt
            for step, tok in enumerate(generated or []):
                out[step + 1] = [tok]
    return out


def recorded_generated(meta: dict[str, Any]) -> list[int] | None:
    """The ids a run generated (one per root call, prefill first), when its manifest records them."""
    generated = _int_list(meta.get("generated"))
    if generated is None and isinstance(meta.get("wb_manifest"), dict):
        generated = _int_list(meta["wb_manifest"].get("generated"))
    return generated


def follows(meta: dict[str, Any]) -> bool:
    """Whether the run picked another run's tokens (`follow_tokens`), so its inputs equal that run's."""
    for source in (meta, meta.get("wb_manifest") or {}, meta.get("config") or {}):
        if isinstance(source, dict) and source.get("follow_tokens"):
            return True
    return False


def read_ids(path: str | Path) -> list[int]:
    """The integer tensor in one file, flattened to its last row (batch 1): the token ids."""
    from workbench.formats.arrays import read_array  # numpy only: torch costs 1.5 s of start-up

    raw = read_array(path)
    if raw.dtype.startswith(("float", "bfloat", "complex")):
        raise DumpError(path, f"holds {raw.dtype}, not token ids")
    arr = raw.array
    if arr.ndim >= 2:
        arr = arr.reshape(-1, arr.shape[-1])[0]
    return [int(v) for v in arr.reshape(-1).tolist()]


def find_manifest(path: str | os.PathLike[str]) -> Path:
    """The `wb_manifest.json` of the dump at `path` (any level msit accepts, or the file itself)."""
    p = Path(path)
    if p.is_file():
        if p.name == MANIFEST_NAME:
            return p
        raise DumpError(p, f"expected a dump folder or its {MANIFEST_NAME}")
    if not p.is_dir():
        raise DumpError(p, "no such dump folder")
    for up in (p, *list(p.parents)[:4]):
        if (up / MANIFEST_NAME).is_file():
            return up / MANIFEST_NAME
    found = sorted(_below(p, 4))
    if not found:
        raise DumpError(p, f"no {MANIFEST_NAME} here: the generated ids are recorded only by wb's dumpers")
    if len(found) > 1:
        raise DumpError(p, f"{len(found)} dumps here ({found[0].parent}, ...): point at one of them")
    return found[0]


def _below(p: Path, depth: int) -> Iterable[Path]:
    if depth == 0:
        return
    try:
        children = sorted(p.iterdir())
    except OSError:
        return
    for child in children:
        if child.name == MANIFEST_NAME and child.is_file():
            yield child
        elif child.is_dir() and token_number(child.name) is None:  # token folders hold no manifest
            yield from _below(child, depth - 1)


def generated_ids(path: str | os.PathLike[str]) -> list[int]:
    """The ids a dumped run generated (its `wb_manifest.json`), for `follow_tokens`; `DumpError` when absent."""
    manifest = find_manifest(path)
    data = read_json(manifest)
    if not isinstance(data, dict):
        raise DumpError(manifest, "not a wb manifest (no JSON object)")
    ids = recorded_generated(data)
    if not ids:
        raise DumpError(manifest, "records no generated ids (dumped by an older wb, or the run generated nothing)")
    return ids
