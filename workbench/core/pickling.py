"""Pickling slotted dataclasses by their fields, as the tasks and dumps a compare sends between processes are.

Python 3.11's `dataclass(slots=True)` pickles through a generated `__getstate__`/`__setstate__` that looks up the
class's fields for every object (~7 us each way): a 13,000-file dump sent back by the worker that read it took
0.09 s to unpickle, all of it on the compare's critical path. `by_fields` pickles an object as its class called with
its field values (what `dataclasses.astuple` would give, not recursing): half of that.
"""

from __future__ import annotations

import dataclasses
import operator
from collections.abc import Callable
from typing import Any, TypeVar

C = TypeVar("C", bound=type)


def by_fields(cls: C) -> C:
    """Class decorator (above `@dataclass`): pickle instances as `cls(*fields)`. Every field must be a positional
    `__init__` parameter and `__init__` must keep what it is given (no `__post_init__`), so the copy is equal."""
    fields = dataclasses.fields(cls)
    if any(not f.init or f.kw_only for f in fields) or hasattr(cls, "__post_init__"):
        raise TypeError(f"{cls.__name__}: by_fields needs every field a positional __init__ parameter")
    names = tuple(f.name for f in fields)
    values: Callable[[Any], tuple[Any, ...]]
    if len(names) == 1:
        one = operator.attrgetter(names[0])
        values = lambda obj: (one(obj),)  # noqa: E731
    else:
        values = operator.attrgetter(*names)

    def __reduce__(self: Any) -> tuple[type, tuple[Any, ...]]:
        return (cls, values(self))

    cls.__reduce__ = __reduce__  # type: ignore[assignment]
    return cls
