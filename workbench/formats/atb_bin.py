"""ATB `.bin` tensor files: the text header, the payload, reading (memory-mapped) and writing.

Layout (what the ATB probe / Mki `BinFile` writes)::

    $Version=1.0
    $Object.Count=1
    $Object.Length=<payload bytes>
    format=<aclFormat>
    dtype=<aclDataType>
    dims=d0,d1,...
    [max=..  min=..  mean=..  l2norm=..]      statistics-only files, with $Object.Count=0
    $Object.data=<offset>,<length>
    $End=1
    <payload>

Attributes may come in any order and unknown keys are ignored. Every size is checked
against the file before anything is allocated.
"""

from __future__ import annotations

import os
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from workbench.core.text import ascii_int, quote_bytes
from workbench.formats.model import DumpError, TensorStats, check_shape
from workbench.formats.staging import Staging

MAX_HEADER_BYTES = 64 * 1024

# aclDataType code -> (torch dtype name, numpy storage dtype, bytes per element)
ACL_DTYPES: dict[int, tuple[str, str, int]] = {
    0: ("float32", "<f4", 4),
    1: ("float16", "<f2", 2),
    2: ("int8", "i1", 1),
    3: ("int32", "<i4", 4),
    4: ("uint8", "u1", 1),
    6: ("int16", "<i2", 2),
    7: ("uint16", "<u2", 2),
    8: ("uint32", "<u4", 4),
    9: ("int64", "<i8", 8),
    10: ("uint64", "<u8", 8),
    11: ("float64", "<f8", 8),
    12: ("bool", "?", 1),
    27: ("bfloat16", "<u2", 2),  # raw bf16 words
}
DTYPE_TO_ACL: dict[str, int] = {name: code for code, (name, _np, _size) in ACL_DTYPES.items()}
ACL_FORMATS: dict[int, str] = {
    -1: "UNDEFINED",
    0: "NCHW",
    1: "NHWC",
    2: "ND",
    3: "NC1HWC0",
    4: "FRACTAL_Z",
    12: "NC1HWC0_C04",
    16: "HWCN",
    27: "NDHWC",
    29: "FRACTAL_NZ",
    30: "NCDHW",
    32: "NDC1HWC0",
    33: "FRACTAL_Z_3D",
}
FORMAT_ND = 2


@dataclass(slots=True)
class BinHeader:
    """The parsed header of one `.bin` file."""

    path: str
    dtype: str
    acl_dtype: int
    shape: tuple[int, ...]
    layout: str
    payload_offset: int  # absolute offset of the tensor bytes in the file
    payload_length: int
    stats: TensorStats | None = None
    attrs: dict[str, str] = field(default_factory=dict)

    @property
    def has_data(self) -> bool:
        return self.payload_length > 0 or (self.stats is None and 0 in self.shape)


def _header_int(text: str) -> int | None:
    return ascii_int(text.strip())


def _parse_stat(value: str | None) -> float | None:
    if value is None or value.strip().upper() in {"N/A", "NA", ""} or not value.isascii():
        return None
    try:
        return float(value)
    except ValueError:
        return None


def read_header(path: str | Path) -> BinHeader:
    """Parse and validate a `.bin` header; raises `DumpError` naming the file on any lie."""
    p = str(path)
    try:
        size = os.path.getsize(p)
        with open(p, "rb") as fh:
            head = fh.read(MAX_HEADER_BYTES)
    except OSError as exc:
        raise DumpError(p, f"cannot read: {exc.strerror or exc}") from None
    if not head:
        raise DumpError(p, "empty file")
    attrs: dict[str, str] = {}
    pos = 0
    end_seen = False
    while True:
        nl = head.find(b"\n", pos)
        if nl < 0:
            raise DumpError(p, "not an ATB tensor file: header has no '$End=1' line")
        line = head[pos:nl]
        pos = nl + 1
        try:
            text = line.decode("ascii")
        except UnicodeDecodeError:
            raise DumpError(p, "not an ATB tensor file: header is not ASCII text") from None
        key, sep, value = text.partition("=")
        if not sep:
            raise DumpError(p, f"malformed header line {quote_bytes(line)}")
        if key == "$End":
            end_seen = True
            break
        attrs[key] = value
    assert end_seen
    payload_start = pos
    if "dtype" not in attrs:
        raise DumpError(p, "header has no dtype")
    acl_or_none = _header_int(attrs["dtype"])
    if acl_or_none is None:
        raise DumpError(p, f"header dtype {quote_bytes(attrs['dtype'])} is not an integer")
    acl = acl_or_none
    if acl not in ACL_DTYPES:
        raise DumpError(p, f"unsupported ATB dtype code {acl}")
    dtype, _np, itemsize = ACL_DTYPES[acl]
    dims_text = attrs.get("dims", "")
    dims = [_header_int(d) for d in dims_text.split(",") if d.strip() != ""]
    if any(d is None for d in dims):
        raise DumpError(p, f"header dims {quote_bytes(dims_text, 24)} are not integers")
    shape = check_shape(p, [d for d in dims if d is not None], "header dims")
    fmt_or_none = _header_int(attrs.get("format", str(FORMAT_ND)))
    if fmt_or_none is None:
        raise DumpError(p, f"header format {quote_bytes(attrs.get('format', ''))} is not an integer")
    fmt_code = fmt_or_none
    layout = ACL_FORMATS.get(fmt_code, f"format{fmt_code}")
    numel = 1
    for d in shape:
        numel *= d
    need = numel * itemsize
    available = size - payload_start
    stats = None
    if any(k in attrs for k in ("max", "min", "mean", "l2norm")):
        stats = TensorStats(
            max=_parse_stat(attrs.get("max")),
            min=_parse_stat(attrs.get("min")),
            mean=_parse_stat(attrs.get("mean")),
            norm=_parse_stat(attrs.get("l2norm")),
        )
    count = attrs.get("$Object.Count", "1")
    if count.strip() == "0" or ("$Object.data" not in attrs and available == 0 and stats is not None):
        # header-only file (statistics mode or -sd): nothing to read
        return BinHeader(p, dtype, acl, shape, layout, payload_start, 0, stats, attrs)
    offset, length = 0, available
    if "$Object.data" in attrs:
        parts = [_header_int(x) for x in attrs["$Object.data"].split(",")]
        if len(parts) != 2 or parts[0] is None or parts[1] is None:
            raise DumpError(p, f"malformed $Object.data {quote_bytes(attrs['$Object.data'], 24)}")
        offset, length = parts[0], parts[1]
        if offset < 0 or length < 0:
            raise DumpError(p, "negative $Object.data offset or length")
        if offset + length > available:
            raise DumpError(
                p,
                f"header says {offset + length} payload bytes but the file holds {available} "
                "(truncated file or lying header)",
            )
    if need != length:
        # msit reads "everything after $End"; accept that when it accounts for the dims exactly
        if need == available and offset == 0:
            length = available
        else:
            raise DumpError(p, f"header dims {list(shape)} x {dtype} need {need} bytes but the payload has {length}")
    return BinHeader(p, dtype, acl, shape, layout, payload_start + offset, length, stats, attrs)


def read_bin(path: str | Path, header: BinHeader | None = None, staging: Staging | None = None) -> np.ndarray:
    """Memory-map the payload of a `.bin` file as a numpy array (bf16 comes back as raw uint16); read it into
    `staging` instead when given and the payload fits."""
    hdr = header or read_header(path)
    if hdr.payload_length == 0 and 0 not in hdr.shape:
        raise DumpError(hdr.path, "statistics-only file: no tensor data")
    np_dtype = np.dtype(ACL_DTYPES[hdr.acl_dtype][1])
    if 0 in hdr.shape:
        return np.zeros(hdr.shape, dtype=np_dtype)
    staged = None if staging is None else staging.values(hdr.path, hdr.payload_offset, np_dtype, hdr.shape)
    if staged is not None:
        return staged
    return np.memmap(hdr.path, dtype=np_dtype, mode="r", offset=hdr.payload_offset, shape=hdr.shape)


def encode_header(
    dtype: str,
    shape: tuple[int, ...],
    payload_length: int,
    *,
    layout_code: int = FORMAT_ND,
    stats: TensorStats | None = None,
) -> bytes:
    """The header bytes ATB's probe writes, in its line order."""
    acl = DTYPE_TO_ACL[dtype]
    lines = ["$Version=1.0"]
    if stats is None:
        lines += ["$Object.Count=1", f"$Object.Length={payload_length}"]
    else:
        lines += ["$Object.Count=0", "$Object.Length=0"]
    lines += [f"format={layout_code}", f"dtype={acl}", "dims=" + ",".join(str(d) for d in shape)]
    if stats is not None:

        def fmt(v: float | None) -> str:
            return "N/A" if v is None else repr(float(v))

        lines += [
            f"max={fmt(stats.max)}",
            f"min={fmt(stats.min)}",
            f"mean={fmt(stats.mean)}",
            f"l2norm={fmt(stats.norm)}",
        ]
    else:
        lines.append(f"$Object.data=0,{payload_length}")
    lines.append("$End=1")
    return ("\n".join(lines) + "\n").encode("ascii")


def write_bin(path: str | Path, data: np.ndarray, dtype: str, *, layout_code: int = FORMAT_ND) -> None:
    """Write one tensor as ATB's probe does. `data` holds the raw storage (bf16 as uint16 words)."""
    arr = np.ascontiguousarray(data)
    payload = arr.tobytes()
    with open(path, "wb") as fh:
        fh.write(encode_header(dtype, tuple(arr.shape), len(payload), layout_code=layout_code))
        fh.write(payload)


def write_bin_stats(
    path: str | Path, dtype: str, shape: tuple[int, ...], stats: TensorStats, *, layout_code: int = FORMAT_ND
) -> None:
    """Write a statistics-only `.bin` (header with max/min/mean/l2norm, no payload)."""
    with open(path, "wb") as fh:
        fh.write(encode_header(dtype, shape, 0, layout_code=layout_code, stats=stats))
