"""`register_hook(model, config)`: msit-compatible forward-hook dumping of an `nn.Module`.

Layout written (msit's): `{dump_path}/msit_dump_{TS}/torch_tensors/{device}_{pid}/` with
`model_tree.json`, `{token}/{module}/input_{i}.pth`, `output.pth` / `output_{i}.pth` and, in statistics
mode, `statistics.csv`; plus our `wb_manifest.json`. The token is the index of the root module's
forward call (prefill = 0). Hooks only copy tensors to the host; writer threads save them.
"""

from __future__ import annotations

import atexit
import logging
import os
import threading
import time
import weakref
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any

import torch
from torch import nn
from torch.utils.hooks import RemovableHandle

from workbench.dump.api import ApiDumpMode
from workbench.dump.capture import dumpable, flatten_inputs, flatten_outputs, has_tensor, statistics, to_host
from workbench.dump.config import DumpConfig
from workbench.dump.manifest import Manifest, write_model_tree
from workbench.dump.writer import AsyncWriter, Ready, Saved
from workbench.formats.model import DumpError

log = logging.getLogger("workbench.dump")

_CACHE_LIMIT = 4096  # tensors remembered per token for de-duplication (weak references only)
# Creating a folder slower than this marks slow storage (network filesystems; some VM disks, where we measured
# 0.3-2 ms against ~40 us on a healthy local disk and ~10 us on tmpfs). msit's layout makes a folder and a file
# per module per token, so there even a statistics-only dump has seconds of file creation to hide.
_SLOW_FOLDER_S = 200e-6

if TYPE_CHECKING:
    from workbench.dump.fx import FxHandle


def model_device(model: nn.Module) -> str:
    """msit's device tag: the last parameter's device without the colon (`cpu`, `cuda0`, `npu1`)."""
    device = "cpu"
    for param in model.parameters():
        device = str(param.device)
    return device.replace(":", "")


def _device_selected(device: str, device_id: int | None) -> bool:
    if device_id is None or device == "cpu":
        return True
    return device == f"{device.rstrip('0123456789')}{device_id}"


def _claim_dump_dir(root: Path, device: str) -> tuple[Path, float]:
    """Create `msit_dump_{TS}/torch_tensors/{device}_{pid}`; a later second of TS if it is taken.

    Also returns the seconds the last folder took to create: a new folder in a new folder, as the dump
    makes one per module per token, so it tells what the storage's metadata operations cost.
    """
    now = int(time.time())
    leaf = f"{device}_{os.getpid()}"
    for shift in range(3600):
        stamp = time.strftime("%Y%m%d_%H%M%S", time.localtime(now + shift))
        folder = root / f"msit_dump_{stamp}" / "torch_tensors" / leaf
        try:
            folder.parent.mkdir(parents=True, mode=0o750, exist_ok=True)
            start = time.perf_counter()
            folder.mkdir(mode=0o750)
            return folder, time.perf_counter() - start
        except FileExistsError:
            continue
        except OSError as exc:
            raise DumpError(folder, f"cannot create the dump folder: {exc.strerror or exc}") from None
    raise DumpError(root, "no free msit_dump_{TS} folder name within an hour of now")


class _Seen:
    """A tensor already handed to the writer in this token: its file, statistics and version."""

    __slots__ = ("ready", "ref", "saved", "stats", "version")

    def __init__(self, ref: weakref.ref[torch.Tensor], version: int) -> None:
        self.ref = ref
        self.version = version
        self.saved: Saved | None = None
        self.stats: torch.Tensor | None = None
        self.ready: Ready | None = None


class DumpHandle:
    """What `register_hook` returns: `.remove()` detaches every hook and finishes writing.

    `dump_dir` is the `{device}_{pid}` folder (None when `device_id` excludes this model's device).
    Also a context manager (`with register_hook(model, cfg): ...`).
    """

    def __init__(self, model: nn.Module, config: DumpConfig) -> None:
        self.config = config
        self.device = model_device(model)
        self.enabled = _device_selected(self.device, config.device_id)
        self.dump_dir: Path | None = None
        self.manifest: Manifest | None = None
        self._handles: list[RemovableHandle] = []
        self._errors: list[str] = []
        self._error_lock = threading.Lock()
        self._removed = False
        self.token = -1
        self.active = False
        self._order: list[str] = []
        self._stack: list[str] = []
        self._seen: dict[int, _Seen] = {}
        self._views: dict[tuple[Any, ...], _Seen] = {}
        self._api_counts: dict[str, int] = {}
        self._last: tuple[str, str, Any] | None = None
        self._mode: ApiDumpMode | None = None
        if not self.enabled:
            log.info("model is on %s, not device %s: nothing is dumped", self.device, config.device_id)
            return
        self.dump_dir, folder_seconds = _claim_dump_dir(config.dump_path, self.device)
        self._dir = str(self.dump_dir)
        self.manifest = Manifest(model, config.to_json(), self.dump_dir)
        if config.follow_ids is not None:
            self.manifest.follow_ids = config.follow_ids
            self.manifest.meta["follow_tokens"] = config.follow_tokens
        self._want_tensors = config.dump_statistics_mode != 1
        # Much to write (tensors), or slow storage: the writers take an OpenMP team so that they write while
        # the model runs (see `run_when_idle`); slow storage also gets a second thread, since file creation
        # runs in parallel.
        slow_storage = folder_seconds > _SLOW_FOLDER_S
        threads = config.writer_threads
        if slow_storage and config.writer_threads_auto:
            threads = max(2, threads)
        openmp_team = self._want_tensors or slow_storage
        self.manifest.meta["writer"] = {
            "threads": threads,
            "openmp_team": openmp_team,
            "folder_create_us": round(folder_seconds * 1e6),
        }
        self.writer = AsyncWriter(threads, config.max_queue_bytes, self._writer_error, openmp_team=openmp_team)
        self._want_stats = config.dump_statistics_mode != 0 or config.analyze
        self._analyze_csv = str(self.dump_dir.parent.parent / "tensor_analyze.csv")
        write_model_tree(model, self.dump_dir)
        self._install(model)
        if config.dump_weight:
            self._dump_weights(model)
        self.manifest.write(self.manifest.snapshot(None))
        atexit.register(self._at_exit)

    # -- installation ---------------------------------------------------------------------------
    def _install(self, model: nn.Module) -> None:
        cfg = self.config
        names: dict[int, str] = {}

        def walk(module: nn.Module, name: str) -> None:
            names.setdefault(id(module), name)
            for child_name, child in module.named_children():
                walk(child, f"{name}.{child_name}")

        walk(model, "root")
        self._handles.append(model.register_forward_pre_hook(self._token_start))
        self._handles.append(model.register_forward_pre_hook(self._record_inputs, with_kwargs=True))
        for module in dict.fromkeys(m for m in model.modules()):
            name = names[id(module)]
            selected = cfg.dump_module and cfg.module_selected(name, module)
            type_name = type(module).__name__
            self._handles.append(
                module.register_forward_pre_hook(self._make_pre(name, type_name, selected), with_kwargs=True)
            )
            self._handles.append(
                module.register_forward_hook(
                    self._make_post(name, type_name, selected, module is model), with_kwargs=True
                )
            )
        self._handles.append(model.register_forward_hook(self._token_end))
        # last: sees the output after it was dumped, and may replace it (follow_tokens)
        self._handles.append(model.register_forward_hook(self._token_choice))
        if cfg.dump_api:
            self._mode = ApiDumpMode(self._on_api)

    def _dump_weights(self, model: nn.Module) -> None:
        for pname, param in model.named_parameters():
            name = f"root.{pname}"
            if self.config.name_selected(name) and dumpable(param):
                host, ready = to_host(param)
                self.writer.save("weights", os.path.join(self._dir, "weights", f"{name}.pth"), host, ready)

    # -- hooks (model thread) -------------------------------------------------------------------
    def _token_start(self, module: nn.Module, args: tuple[Any, ...]) -> None:
        self.token += 1
        self.active = self.token in self.config.token_set
        self._seen.clear()
        self._views.clear()
        self._stack.clear()
        self._api_counts.clear()
        self._last = None
        if self.active:
            assert self.manifest is not None
            self._order = self.manifest.start_token(self.token)
            if self._mode is not None:
                self._mode.activate()

    def _token_end(self, module: nn.Module, args: tuple[Any, ...], output: Any) -> None:
        if not self.active:
            return
        if self._mode is not None:
            self._mode.pop()
        if self._last is not None:
            name, type_name, last_out = self._last
            self._dump_outputs(name, type_name, last_out)
            self._last = None
        self._seen.clear()
        self._views.clear()
        assert self.manifest is not None
        manifest = self.manifest
        snapshot = manifest.snapshot(self.token)
        self.writer.call(lambda: manifest.write(snapshot))
        self.active = False

    def _record_inputs(self, module: nn.Module, args: tuple[Any, ...], kwargs: dict[str, Any]) -> None:
        ids = kwargs.get("input_ids", args[0] if args else None)
        if isinstance(ids, torch.Tensor) and not ids.is_floating_point() and ids.numel() and dumpable(ids):
            assert self.manifest is not None
            row = ids.reshape(-1, ids.shape[-1])[0] if ids.dim() >= 2 else ids.reshape(-1)
            self.manifest.token_ids[str(self.token)] = [int(v) for v in row.tolist()]

    def _token_choice(self, module: nn.Module, args: tuple[Any, ...], output: Any) -> Any:
        """Record the top-1 of this call's last position; with `follow_tokens`, make the golden token the only
        choice (a new output object: what was dumped stays the model's own)."""
        logits = logits_of(output)
        if logits is None or not dumpable(logits) or logits.dim() == 0 or logits.numel() == 0:
            return None
        assert self.manifest is not None
        last = logits.reshape(-1, logits.shape[-1])[-1] if logits.dim() >= 2 else logits
        self.manifest.top1[str(self.token)] = int(last.argmax())
        follow = self.config.follow_ids
        if follow is None:
            return None
        if self.token >= len(follow):
            if self.token == len(follow):
                log.warning("follow_tokens: the golden run generated %d tokens; later calls choose freely", len(follow))
            return None
        tok = follow[self.token]
        if not 0 <= tok < logits.shape[-1]:
            raise DumpError(
                self.config.follow_tokens or "follow_tokens",
                f"golden token id {tok} is outside the vocabulary ({logits.shape[-1]})",
            )
        forced = logits.detach().clone()
        forced[..., -1, :] = torch.finfo(forced.dtype).min if forced.is_floating_point() else 0
        forced[..., -1, tok] = 0
        return with_logits(output, forced)

    def _make_pre(self, name: str, type_name: str, selected: bool) -> Callable[..., None]:
        cfg = self.config
        dump_inputs = selected and cfg.tensor_part != 1 and not cfg.dump_last_logits

        def pre(module: nn.Module, args: tuple[Any, ...], kwargs: dict[str, Any]) -> None:
            if not self.active:
                return
            self._order.append(name)
            self._stack.append(name)
            if dump_inputs:
                self._busy(True)
                try:
                    leaves, kw_names = flatten_inputs(args, kwargs)
                    if kw_names:
                        assert self.manifest is not None
                        self.manifest.note_kwargs(self.token, name, kw_names)
                    self._emit(name, type_name, leaves)
                finally:
                    self._busy(False)

        return pre

    def _make_post(self, name: str, type_name: str, selected: bool, is_root: bool) -> Callable[..., None]:
        cfg = self.config
        dump_outputs = selected and cfg.tensor_part != 0 and not cfg.dump_last_logits

        def post(module: nn.Module, args: tuple[Any, ...], kwargs: dict[str, Any], output: Any) -> None:
            if not self.active:
                return
            if self._stack and self._stack[-1] == name:
                self._stack.pop()
            if cfg.dump_last_logits:
                # msit keeps the last *sub*module output holding a tensor (the logits of lm_head)
                if not is_root and has_tensor(output):
                    self._last = (name, type_name, output)
                return
            if dump_outputs:
                self._dump_outputs(name, type_name, output)

        return post

    def _dump_outputs(self, name: str, type_name: str, output: Any) -> None:
        self._busy(True)
        try:
            leaves, fields = flatten_outputs(output)
            if fields:
                assert self.manifest is not None
                self.manifest.note_fields(self.token, name, fields)
            self._emit(name, type_name, leaves)
        finally:
            self._busy(False)

    def _on_api(self, func: Callable[..., Any], args: tuple[Any, ...], kwargs: dict[str, Any], output: Any) -> None:
        if not self.active:
            return
        base = f"{self._stack[-1] if self._stack else 'root'}.{getattr(func, '__name__', 'api')}"
        count = self._api_counts.get(base, 0)
        self._api_counts[base] = count + 1
        folder = base if count == 0 else f"{base}.{count}"
        self._order.append(folder)
        cfg = self.config
        if not (cfg.name_selected(folder) and cfg.api_selected(func)):
            return
        type_name = getattr(func, "__name__", "api")
        if cfg.tensor_part != 1:
            leaves, kw_names = flatten_inputs(args, kwargs)
            if kw_names:
                assert self.manifest is not None
                self.manifest.note_kwargs(self.token, folder, kw_names)
            self._emit(folder, type_name, leaves)
        if cfg.tensor_part != 0:
            self._dump_outputs(folder, type_name, output)

    def _busy(self, flag: bool) -> None:
        if self._mode is not None:
            self._mode.busy = flag

    # -- handing tensors to the writer ------------------------------------------------------------
    def _emit(self, folder_name: str, type_name: str, leaves: list[tuple[str, torch.Tensor]]) -> None:
        # Copies and reductions run with the model's own intra-op threads: a big activation is cloned
        # and reduced in parallel, and the statistics are the bits msit's hook computes (a reduction's
        # rounding depends on how it is split across threads). Small tensors never go parallel anyway.
        if leaves:
            self._emit_leaves(folder_name, type_name, leaves)

    def _emit_leaves(self, folder_name: str, type_name: str, leaves: list[tuple[str, torch.Tensor]]) -> None:
        folder = os.path.join(self._dir, str(self.token), folder_name)
        cfg = self.config
        for stem, tensor in leaves:
            if not dumpable(tensor):
                log.debug("%s/%s: no data to copy (%s tensor), skipped", folder, stem, tensor.device)
                continue
            seen = self._remember(tensor)
            if self._want_tensors:
                path = os.path.join(folder, stem + ".pth")
                if seen is not None and seen.saved is not None:
                    self.writer.copy(folder, seen.saved, path)
                else:
                    host, ready = to_host(tensor)
                    saved = self.writer.save(folder, path, host, ready)
                    if seen is not None:
                        seen.saved = saved
            if self._want_stats:
                stats: torch.Tensor | None
                if seen is not None and seen.stats is not None:
                    stats, ready = seen.stats, seen.ready
                else:
                    stats, ready = self._stats(tensor)
                    if seen is not None:
                        seen.stats, seen.ready = stats, ready
                if cfg.dump_statistics_mode != 0:
                    parts = stem.split("_")
                    head = [
                        folder_name,
                        type_name,
                        "Input" if stem.startswith("input") else "Output",
                        int(parts[-1]) if len(parts) > 1 else 0,
                        str(tensor.dtype),
                        str(tuple(tensor.shape)),
                    ]
                    self.writer.stats_row(folder, os.path.join(folder, "statistics.csv"), head, stats, ready)
                if cfg.analyze:
                    tensor_path = os.path.join(folder, stem + (".pth" if self._want_tensors else ""))
                    row = [folder_name, type_name, tensor_path, str(tensor.dtype), str(tensor.shape)]
                    self.writer.analyze_row(self._analyze_csv, row, stats, ready)

    def _stats(self, tensor: torch.Tensor) -> tuple[torch.Tensor | None, Ready | None]:
        stats = statistics(tensor, self.config.analyze)
        if stats is None:
            return None, None
        return to_host(stats, fresh=True)

    def _remember(self, tensor: torch.Tensor) -> _Seen | None:
        """The record of this tensor's data if already handed over in this token: the same tensor object, or
        another tensor object viewing the same bytes the same way (same storage, offset, shape, stride, dtype),
        and not modified since (a module returning `x.view(x.shape)` of its input: one file, two names)."""
        try:
            version = tensor._version
        except RuntimeError:  # inference tensors have no version counter: never de-duplicated
            return None
        key = id(tensor)
        seen = self._seen.get(key)
        if seen is not None and seen.ref() is tensor and seen.version == version:
            return seen
        view = (
            tensor.untyped_storage().data_ptr(),
            tensor.storage_offset(),
            tuple(tensor.shape),
            tensor.stride(),
            tensor.dtype,
            tensor.device,
        )
        same = self._views.get(view)
        if same is not None:
            earlier = same.ref()
            # the earlier tensor still alive keeps its storage alive: the address cannot have been reused;
            # views share one version counter, so an in-place change since then shows here too
            if earlier is not None and same.version == version and earlier._version == version:
                self._seen[key] = same
                return same
        if len(self._seen) >= _CACHE_LIMIT:
            self._seen.clear()
            self._views.clear()
        seen = _Seen(weakref.ref(tensor), version)
        self._seen[key] = seen
        self._views[view] = seen
        return seen

    # -- errors, flushing, removal --------------------------------------------------------------
    def _writer_error(self, message: str) -> None:
        with self._error_lock:
            first = not self._errors
            self._errors.append(message)
            if self.manifest is not None and len(self.manifest.errors) < 100:
                self.manifest.errors.append(message)
        if first:
            log.error("dump: %s", message)

    @property
    def errors(self) -> list[str]:
        """One line per file that could not be written."""
        with self._error_lock:
            return list(self._errors)

    def flush(self) -> None:
        """Wait until every tensor captured so far is on disk and the manifest is current."""
        if not self.enabled or self._removed:
            return
        assert self.manifest is not None
        manifest = self.manifest
        snapshot = manifest.snapshot(None)
        self.writer.call(lambda: manifest.write(snapshot))
        self.writer.flush()

    def remove(self) -> None:
        """Remove every hook, write what is pending and stop the writer; raise `DumpError` on write errors."""
        if self._removed:
            return
        for handle in self._handles:
            handle.remove()
        self._handles.clear()
        if self._mode is not None:
            self._mode.pop()
        self.active = False
        if self.enabled:
            self.flush()
            self.writer.close()
            atexit.unregister(self._at_exit)
        self._removed = True
        errors = self.errors
        if errors:
            raise DumpError(
                self.dump_dir or self.config.dump_path,
                f"{len(errors)} file(s) could not be written; first: {errors[0]}",
            )

    def _at_exit(self) -> None:
        try:
            self.remove()
        except DumpError as exc:
            log.error("%s", exc)

    def __enter__(self) -> DumpHandle:
        return self

    def __exit__(self, *exc: object) -> None:
        self.remove()


def logits_of(output: Any) -> torch.Tensor | None:
    """The logits in a model's output: a tensor, a ModelOutput / dict `logits`, or a tuple's first tensor."""
    if isinstance(output, torch.Tensor):
        return output
    if isinstance(output, dict):
        value = output.get("logits")
        return value if isinstance(value, torch.Tensor) else None
    if isinstance(output, (tuple, list)) and output and isinstance(output[0], torch.Tensor):
        return output[0]
    return None


def with_logits(output: Any, logits: torch.Tensor) -> Any:
    """A copy of `output` holding `logits` instead (the original object is left as it was)."""
    if isinstance(output, torch.Tensor):
        return logits
    if isinstance(output, dict):
        fields = {**output, "logits": logits}
        try:
            return type(output)(**fields)
        except TypeError:
            return fields
    if isinstance(output, tuple):
        return (logits, *output[1:])
    return [logits, *output[1:]]


def register_hook(model: nn.Module, config: DumpConfig) -> DumpHandle | FxHandle:
    """Hook every module of `model` and dump as `config` says; returns a handle with `.remove()`. With
    `config.fx` the model's forward is compiled instead and its aten nodes dumped (`workbench.dump.fx`)."""
    if not isinstance(model, nn.Module):
        raise TypeError(f"register_hook: model must be a torch.nn.Module, got {type(model).__name__}")
    if not isinstance(config, DumpConfig):
        raise TypeError(f"register_hook: config must be a DumpConfig, got {type(config).__name__}")
    if config.fx:
        from workbench.dump.fx import register_fx

        return register_fx(model, config)
    return DumpHandle(model, config)
