"""API-level capture (msit's `mode="api"`) through a `TorchFunctionMode`, not monkey-patching.

A mode sees every `torch.*` / `torch.nn.functional.*` call made while it is active and needs no
patched attributes, so removing it restores torch exactly. Only public functions of those two
namespaces count as APIs (tensor methods and internals are passed through untouched).
"""

from __future__ import annotations

from collections.abc import Callable
from functools import cache
from typing import Any

import torch
import torch.nn.functional as F
from torch.overrides import TorchFunctionMode

ApiCallback = Callable[[Callable[..., Any], tuple[Any, ...], dict[str, Any], Any], None]


@cache
def api_functions() -> frozenset[int]:
    """ids of the public callables of `torch` and `torch.nn.functional` (classes and modules excluded)."""
    ids: set[int] = set()
    for namespace in (torch, F):
        for name in dir(namespace):
            if name.startswith("_"):
                continue
            obj = getattr(namespace, name, None)
            if callable(obj) and not isinstance(obj, type):
                ids.add(id(obj))
    return frozenset(ids)


class ApiDumpMode(TorchFunctionMode):
    """Calls `callback(func, args, kwargs, output)` after each torch API call; `busy` mutes it."""

    def __init__(self, callback: ApiCallback) -> None:
        super().__init__()
        self.callback = callback
        self.busy = False
        self.entered = False
        self._apis = api_functions()

    def __torch_function__(
        self, func: Callable[..., Any], types: Any, args: tuple[Any, ...] = (), kwargs: dict[str, Any] | None = None
    ) -> Any:
        kwargs = kwargs or {}
        output = func(*args, **kwargs)
        if not self.busy and id(func) in self._apis:
            self.busy = True
            try:
                self.callback(func, args, kwargs, output)
            finally:
                self.busy = False
        return output

    def activate(self) -> None:
        """Make the mode active (idempotent)."""
        if not self.entered:
            self.__enter__()
            self.entered = True

    def pop(self) -> None:
        """Deactivate the mode if it is active."""
        if self.entered:
            self.entered = False
            self.__exit__(None, None, None)
