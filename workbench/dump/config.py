"""`DumpConfig`: what to dump, with msit's argument names and meanings, validated up front.

Unlike msit's config it is a plain object (no singleton): every `DumpConfig(...)` call means what it
says, and two models can be hooked with two configs in one process.
"""

from __future__ import annotations

import json
import os
import re
from collections.abc import Callable, Iterable
from pathlib import Path
from typing import Any

from torch import nn

from workbench.core.files import REDUMP_ENV
from workbench.dump.seed import seed_all

MODES = ("module", "api")
DEFAULT_QUEUE_BYTES = 1 << 30


class DumpConfigError(ValueError):
    """An invalid `DumpConfig` argument; the message names the argument and the reason."""


def glob_to_regex(pattern: str) -> str:
    """msit's `layer_name` glob: only `*` is special (any run of characters), anchored at both ends."""
    return "^" + ".*".join(re.escape(part) for part in pattern.split("*")) + "$"


def _writable_dir_or_creatable(path: Path) -> str | None:
    """Why `path` cannot be used as an output folder, or None when it can."""
    probe = path
    while not probe.exists():
        if probe.parent == probe:
            return "no existing parent folder"
        probe = probe.parent
    if not probe.is_dir():
        return f"'{probe}' is not a folder"
    if not os.access(probe, os.W_OK | os.X_OK):
        return f"'{probe}' is not writable"
    return None


def _int_list(name: str, value: Any) -> list[int]:
    if isinstance(value, (str, bytes)) or not isinstance(value, Iterable):
        raise DumpConfigError(f"DumpConfig: {name} must be a list of non-negative ints, got {value!r}")
    items = list(value)
    for item in items:
        if isinstance(item, bool) or not isinstance(item, int) or item < 0:
            raise DumpConfigError(f"DumpConfig: {name} must hold non-negative ints, got {item!r}")
    return items


class DumpConfig:
    """What and where to dump; arguments as in msit's `DumpConfig`, plus writer tuning.

    dump_path: output root (default "./"); token_range: root forward-call indices to dump (default [0]);
    analyze: also append `tensor_analyze.csv`; module_list: module classes (or class names) to dump;
    api_list: torch API functions (or names) to dump in api mode; tensor_part: 0 inputs, 1 outputs,
    2 both; device_id: dump only when the model is on that device index; dump_statistics_mode: 0 tensors,
    1 statistics.csv only, 2 both; dump_last_logits: dump only the last submodule output of each token;
    mode: "module", "api" or a list of both; dump_weight: save every parameter once; layer_name: glob
    (`*` only) on module/API names; seed: call `seed_all(seed)` now.
    follow_tokens: a golden dump folder (or a list of ids): at every root call the model's output logits are
    replaced, after they are dumped, by ones whose only choice is the golden run's token, so `generate()` feeds
    the test run the golden run's tokens and every token stays comparable.
    fx: dump the model's aten graph instead of its modules: `register_hook` compiles the model's forward with
    `torch.compile` and a backend that saves every aten node's inputs and outputs in msit's FX layout
    (TorchAir's golden side, `workbench.dump.fx`); token_range and dump_path apply.
    writer_threads: background writer threads (default: by CPU count, at least 2 on storage where creating a
    folder is slow); max_queue_bytes: bound on the
    bytes of tensors waiting to be written (the model waits when it is reached).
    """

    def __init__(
        self,
        dump_path: str | os.PathLike[str] | None = None,
        token_range: Iterable[int] | None = None,
        analyze: bool = False,
        module_list: Iterable[type[nn.Module] | str] | None = None,
        api_list: Iterable[Callable[..., Any] | str] | None = None,
        tensor_part: int = 2,
        device_id: int | None = None,
        dump_statistics_mode: int = 0,
        dump_last_logits: bool = False,
        mode: str | Iterable[str] | None = None,
        dump_weight: bool = False,
        layer_name: str | None = None,
        seed: int | None = None,
        follow_tokens: str | os.PathLike[str] | Iterable[int] | None = None,
        writer_threads: int | None = None,
        max_queue_bytes: int = DEFAULT_QUEUE_BYTES,
        fx: bool = False,
    ) -> None:
        if dump_path is not None and not isinstance(dump_path, (str, os.PathLike)):
            raise DumpConfigError(f"DumpConfig: dump_path must be a path, got {dump_path!r}")
        self.dump_path = Path(dump_path if dump_path is not None else "./")
        problem = _writable_dir_or_creatable(self.dump_path)
        if problem:
            raise DumpConfigError(f"DumpConfig: dump_path '{self.dump_path}' cannot be used: {problem}")

        self.token_range: list[int] = _int_list("token_range", [0] if token_range is None else token_range)
        self.token_set = frozenset(self.token_range)

        for name, flag in (("analyze", analyze), ("dump_last_logits", dump_last_logits), ("dump_weight", dump_weight)):
            if not isinstance(flag, bool):
                raise DumpConfigError(f"DumpConfig: {name} must be True or False, got {flag!r}")
        if not isinstance(fx, bool):
            raise DumpConfigError(f"DumpConfig: fx must be True or False, got {fx!r}")
        self.fx = fx
        self.analyze = analyze
        self.dump_last_logits = dump_last_logits
        self.dump_weight = dump_weight

        self.module_list: list[type[nn.Module] | str] = self._module_list(module_list)
        self.api_list: list[Callable[..., Any] | str] = self._api_list(api_list)

        for name, value, allowed in (
            ("tensor_part", tensor_part, (0, 1, 2)),
            ("dump_statistics_mode", dump_statistics_mode, (0, 1, 2)),
        ):
            if isinstance(value, bool) or value not in allowed:
                raise DumpConfigError(f"DumpConfig: {name} must be 0, 1 or 2, got {value!r}")
        self.tensor_part = tensor_part
        self.dump_statistics_mode = dump_statistics_mode

        if device_id is not None and (isinstance(device_id, bool) or not isinstance(device_id, int) or device_id < 0):
            raise DumpConfigError(f"DumpConfig: device_id must be a non-negative int or None, got {device_id!r}")
        self.device_id = device_id

        modes = ["module"] if mode is None else [mode] if isinstance(mode, str) else mode
        if isinstance(modes, (bytes, dict)) or not isinstance(modes, Iterable):
            raise DumpConfigError(f"DumpConfig: mode must be 'module', 'api' or a list of them, got {mode!r}")
        self.mode: list[str] = list(modes)
        if not self.mode or any(m not in MODES for m in self.mode):
            raise DumpConfigError(f"DumpConfig: mode must be 'module', 'api' or a list of them, got {mode!r}")

        if layer_name is not None and (not isinstance(layer_name, str) or not layer_name):
            raise DumpConfigError(f"DumpConfig: layer_name must be a non-empty glob string, got {layer_name!r}")
        self.layer_name = layer_name
        self.layer_regex = re.compile(glob_to_regex(layer_name)) if layer_name else None

        if seed is not None and (isinstance(seed, bool) or not isinstance(seed, int)):
            raise DumpConfigError(f"DumpConfig: seed must be an int or None, got {seed!r}")
        self.seed = seed

        self.follow_tokens, self.follow_ids = self._follow(follow_tokens)

        self.writer_threads_auto = writer_threads is None  # the dumper may add a thread for slow storage
        if writer_threads is None:
            writer_threads = min(4, max(1, (os.cpu_count() or 1) // 4))
        if isinstance(writer_threads, bool) or not isinstance(writer_threads, int) or not 1 <= writer_threads <= 64:
            raise DumpConfigError(f"DumpConfig: writer_threads must be an int in 1..64, got {writer_threads!r}")
        self.writer_threads = writer_threads
        if isinstance(max_queue_bytes, bool) or not isinstance(max_queue_bytes, int) or max_queue_bytes < 1:
            raise DumpConfigError(f"DumpConfig: max_queue_bytes must be a positive int, got {max_queue_bytes!r}")
        self.max_queue_bytes = max_queue_bytes

        if seed is not None:
            seed_all(seed)
        self.redump = self._apply_redump_env()

    def _apply_redump_env(self) -> dict[str, Any] | None:
        """`wb redump` re-runs the recorded command with `WB_REDUMP` set: full tensors in and out of just the
        op and token it names, written where it says (whatever the script's own DumpConfig asked for)."""
        text = os.environ.get(REDUMP_ENV)
        if not text:
            return None
        try:
            spec = json.loads(text)
            self.dump_path = Path(spec["dump_path"])
            self.token_range = _int_list("token_range", spec["token_range"])
            self.layer_name = str(spec["layer_name"])
        except (ValueError, KeyError, TypeError) as exc:
            raise DumpConfigError(f"DumpConfig: {REDUMP_ENV} is not a redump request ({exc})") from None
        self.token_set = frozenset(self.token_range)
        self.layer_regex = re.compile(glob_to_regex(self.layer_name))
        self.module_list = []
        self.tensor_part = 2
        self.dump_statistics_mode = 0
        self.dump_last_logits = False
        self.dump_weight = True
        return dict(spec)

    @staticmethod
    def _follow(value: str | os.PathLike[str] | Iterable[int] | None) -> tuple[str | None, list[int] | None]:
        """(what to record as the source, the ids to pick) of `follow_tokens`."""
        if value is None:
            return None, None
        if isinstance(value, (str, os.PathLike)):
            from workbench.formats.model import DumpError
            from workbench.formats.token_ids import generated_ids

            try:
                return str(value), generated_ids(value)
            except DumpError as exc:
                raise DumpConfigError(f"DumpConfig: follow_tokens: {exc}") from None
        ids = _int_list("follow_tokens", value)
        if not ids:
            raise DumpConfigError("DumpConfig: follow_tokens is empty")
        return f"{len(ids)} ids given", ids

    @staticmethod
    def _module_list(value: Iterable[type[nn.Module] | str] | None) -> list[type[nn.Module] | str]:
        if value is None:
            return []
        if isinstance(value, (str, type)) or not isinstance(value, Iterable):
            raise DumpConfigError(f"DumpConfig: module_list must be a list of module classes, got {value!r}")
        items = list(value)
        for item in items:
            if not (isinstance(item, str) or (isinstance(item, type) and issubclass(item, nn.Module))):
                raise DumpConfigError(
                    f"DumpConfig: module_list items must be nn.Module subclasses or class names, got {item!r}"
                )
        return items

    @staticmethod
    def _api_list(value: Iterable[Callable[..., Any] | str] | None) -> list[Callable[..., Any] | str]:
        if value is None:
            return []
        if isinstance(value, str) or not isinstance(value, Iterable):
            raise DumpConfigError(f"DumpConfig: api_list must be a list of functions or names, got {value!r}")
        items = list(value)
        for item in items:
            if not (isinstance(item, str) or callable(item)):
                raise DumpConfigError(f"DumpConfig: api_list items must be functions or names, got {item!r}")
        return items

    @property
    def dump_module(self) -> bool:
        return "module" in self.mode

    @property
    def dump_api(self) -> bool:
        return "api" in self.mode

    def name_selected(self, name: str) -> bool:
        """Whether `layer_name` lets `name` (a module or API folder name) through."""
        return self.layer_regex is None or self.layer_regex.match(name) is not None

    def module_selected(self, name: str, module: nn.Module) -> bool:
        """Whether a module is dumped: `layer_name` glob and `module_list` (isinstance or class name)."""
        if not self.name_selected(name):
            return False
        if not self.module_list:
            return True
        names = {cls.__name__ for cls in type(module).__mro__}
        return any((m in names) if isinstance(m, str) else isinstance(module, m) for m in self.module_list)

    def api_selected(self, func: Callable[..., Any]) -> bool:
        """Whether an API function passes `api_list` (empty: every API)."""
        if not self.api_list:
            return True
        fname = getattr(func, "__name__", "")
        return any(a == fname if isinstance(a, str) else a is func for a in self.api_list)

    def to_json(self) -> dict[str, Any]:
        """The configuration as JSON-ready values (classes and functions by name)."""
        return {
            "dump_path": str(self.dump_path),
            "token_range": self.token_range,
            "analyze": self.analyze,
            "module_list": [m if isinstance(m, str) else m.__name__ for m in self.module_list],
            "api_list": [a if isinstance(a, str) else getattr(a, "__name__", repr(a)) for a in self.api_list],
            "tensor_part": self.tensor_part,
            "device_id": self.device_id,
            "dump_statistics_mode": self.dump_statistics_mode,
            "dump_last_logits": self.dump_last_logits,
            "mode": self.mode,
            "dump_weight": self.dump_weight,
            "layer_name": self.layer_name,
            "seed": self.seed,
            "follow_tokens": self.follow_tokens,
            "writer_threads": self.writer_threads,
            "max_queue_bytes": self.max_queue_bytes,
        }

    def __repr__(self) -> str:
        return "DumpConfig(" + ", ".join(f"{k}={v!r}" for k, v in self.to_json().items()) + ")"
