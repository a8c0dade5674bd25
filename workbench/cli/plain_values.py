"""Option values of the plain kinds (`str`, `int`, `bool`, `Path`, and repeatable options of them) coerced without
pydantic.

typer (0.2x on) coerces every option value through a pydantic `TypeAdapter` built on first use, and loading
pydantic for that is ~0.05 s of every command's CPU. An ordinary value of these kinds (a string, digits, a flag, a path)
is coerced here to what typer's adapter returns; anything else (a constraint such as `min`, an unusual value, a
path that is not readable: an error to report) goes to typer's own coercion, so values and messages stay typer's.
Older typer (no `typer._coercion`) has no adapters: nothing is changed.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any, get_args, get_origin

try:  # typer's private coercion layer: where it is missing or changed, typer's own coercion is left as it is
    from typer._coercion import RuntimeParam, build_runtime_param
except ImportError:  # pragma: no cover - older typer
    RuntimeParam = None  # type: ignore[assignment,misc]

_PLAIN = (str, int, bool, Path)
_INT_DIGITS = 18  # plain digits up to this many: int() and pydantic agree (no size limits reached)
_OTHER = object()  # not a plain value: typer's own coercion decides


def install(params: list[Any]) -> None:
    """Give each not yet coerced option of a plain kind (single-value, or repeatable: `list[Path]`) the coercion of
    this module. A repeatable option's runtime coercion is built even when it is not given, so one such option
    would load pydantic for its whole command (`wb query --attach`: ~0.07 s)."""
    if RuntimeParam is None:
        return
    for param in params:
        desc = getattr(param, "type_descriptor", None)
        if desc is None or getattr(param, "_runtime_param", False) is not None:
            continue
        kind = _plain_kind(param, desc)
        if kind is None:
            continue
        runtime = _PlainParam if kind is desc.annotation else _PlainListParam
        try:
            param._runtime_param = runtime(parameter_info=desc.parameter_info, annotation=desc.annotation)
        except TypeError:  # a typer whose coercion contract changed: its own coercion, as without this module
            return


def _plain_kind(param: Any, desc: Any) -> type | None:
    """The plain kind of an option's value (of each value, for a repeatable `list[...]` option), or None where
    typer's own coercion must decide."""
    if desc.file_annotation is not None or param.nargs != 1:
        return None
    kind = desc.annotation
    if param.multiple:
        args = get_args(kind)
        if get_origin(kind) is not list or len(args) != 1:
            return None
        kind = args[0]
    if kind not in _PLAIN or not _plain(desc.parameter_info, kind):
        return None
    return kind


def _plain(info: Any, kind: type) -> bool:
    if getattr(info, "parser", None) is not None or getattr(info, "click_type", None) is not None:
        return False
    if kind is int:
        return info.min is None and info.max is None and not info.clamp
    if kind is Path:
        return (
            info.path_type is None
            and not info.exists
            and not info.resolve_path
            and info.file_okay
            and info.dir_okay
            and not info.writable
            and not info.allow_dash
        )
    return True


def plain_value(annotation: type, readable: bool, value: Any) -> Any:
    """`value` coerced to `annotation` as typer's adapter would, or `_OTHER` when typer's coercion must decide."""
    if annotation is str:
        return value if type(value) is str else _OTHER
    if annotation is bool:  # an on/off flag's value (a flag not given comes as None, which never gets here)
        return value if type(value) is bool else _OTHER
    if annotation is int:
        if type(value) is int:
            return value
        if type(value) is str and 0 < len(value) <= _INT_DIGITS and value.isascii() and value.isdigit():
            return int(value)
        return _OTHER
    if isinstance(value, Path):
        path = value
    elif type(value) is str and value and "\0" not in value:
        path = Path(value)
    else:
        return _OTHER
    if readable:
        try:
            os.stat(path)
        except OSError:
            return path  # typer checks an existing path only
        if not os.access(path, os.R_OK):
            return _OTHER  # typer's message: "... is not readable."
    return path


if RuntimeParam is not None:

    @dataclass(frozen=True)
    class _PlainParam(RuntimeParam):
        """A plain option's coercion: `plain_value`, else typer's own."""

        def _coerce_value(self, value: Any, param: Any, ctx: Any) -> Any:
            out = plain_value(self.annotation, self.parameter_info.readable, value)
            if out is _OTHER:
                return build_runtime_param(param.type_descriptor)._coerce_value(value, param=param, ctx=ctx)
            return out

    @dataclass(frozen=True)
    class _PlainListParam(RuntimeParam):
        """A repeatable option of a plain kind: each value by `plain_value`, into a list (as typer's adapter makes
        it); when one value is not plain, typer's own coercion takes them all."""

        def _coerce_value(self, value: Any, param: Any, ctx: Any) -> Any:
            kind = get_args(self.annotation)[0]
            if type(value) in (tuple, list):
                out = [plain_value(kind, self.parameter_info.readable, v) for v in value]
                if not any(v is _OTHER for v in out):
                    return out
            return build_runtime_param(param.type_descriptor)._coerce_value(value, param=param, ctx=ctx)
