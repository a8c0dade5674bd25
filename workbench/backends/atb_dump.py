"""The ATB dump writer: what msit's ATB probe writes, for the ATB-structured Llama.

Layout (README section 2)::

    {dump_path}/msit_dump_{YYYYmmdd_HHMMSS}/
        tensors/{device_id}_{pid}/{executeCount}/{id}_{OpType}/[{i}_{OpType}/...]
            op_param.json, before/intensor{k}.bin, after/outtensor{k}.bin
        model/{pid}/AtbLlama_Prefill.json, AtbLlama_Decoder.json
        layer/{pid}/{OpType}_{id}.json          one per top-level graph op
        wb_manifest.json                        how to re-dump (ours; msit ignores it)

Topology naming follows the probe: an op is `{OpType}_{id path}` (`RmsNormOperation_2_0`,
`LinearOperation_2_1_0_0`), tensors are `{owner}_input_i`, `_weight_i`, `_output_i`,
`_internal_i`, a child's tensors resolved through its parent's `[inputs, outputs, internals]`.

Tensors are written by a writer thread fed through a bounded queue, so the model thread
only copies what an in-place op would change later (the KV caches).
"""

from __future__ import annotations

import json
import os
import queue
import sys
import threading
import time
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

import torch

from workbench.backends.atb_ops import Graph, LeafOp
from workbench.core.files import MANIFEST_NAME
from workbench.formats.atb_bin import write_bin, write_bin_stats
from workbench.formats.model import DumpError, TensorStats
from workbench.formats.tensor_io import dtype_name

if TYPE_CHECKING:
    from workbench.backends.atb_llama import AtbLlama

SAVE_BEFORE, SAVE_AFTER, SAVE_BOTH, SAVE_IN_BEFORE_OUT_AFTER = 0, 1, 2, 3
PART_IN, PART_OUT, PART_BOTH = 0, 1, 2
MANIFEST = MANIFEST_NAME


@dataclass(slots=True)
class AtbDumpConfig:
    """What to dump, with msit's ATB dump options (`-er`, `-time`, `-stp`, stats, warmup).

    `token_range`: execute counts (dump folders) to save, None for all. `save_time`: 0 before,
    1 after, 2 both, 3 intensors before + outtensors after (msit's default). `save_tensor_part`:
    0 inputs, 1 outputs, 2 both. `stats_only`: header-only `.bin` with max/min/mean/l2norm.
    `warmup`: one extra prefill first, as folder 0 (MindIE's warmup). `follow_tokens`: a golden dump folder
    whose generated ids the run decodes instead of its own argmax (after each step's logits are computed and
    dumped), so every token of the test run sees the golden run's inputs. `dump_root`: an existing
    `msit_dump_*` folder to write into (the ranks of a tensor-parallel run share one, as msit's do); `pid`:
    the process id its folders are named with (default this process's; each rank of a run simulated in one
    process gets its own, as separate processes would).
    """

    dump_path: str | Path
    token_range: list[int] | None = None
    save_time: int = SAVE_IN_BEFORE_OUT_AFTER
    stats_only: bool = False
    save_tensor_part: int = PART_BOTH
    warmup: bool = False
    device_id: int = 0
    seed: int | None = None
    queue_size: int = 64
    follow_tokens: str | Path | None = None
    dump_root: str | Path | None = None
    pid: int | None = None

    def __post_init__(self) -> None:
        if self.save_time not in (0, 1, 2, 3):
            raise ValueError(f"save_time {self.save_time}: expected 0, 1, 2 or 3")
        if self.save_tensor_part not in (0, 1, 2):
            raise ValueError(f"save_tensor_part {self.save_tensor_part}: expected 0, 1 or 2")
        if self.token_range is not None and any(t < 0 for t in self.token_range):
            raise ValueError(f"token_range {self.token_range}: execute counts are >= 0")
        if self.queue_size < 1:
            raise ValueError(f"queue_size {self.queue_size}: must be positive")


# ---------------------------------------------------------------- topology JSON
def _node_json(op: LeafOp | Graph, id_path: str, in_names: list[str], out_names: list[str]) -> dict[str, Any]:
    op_name = f"{op.op_type}_{id_path}"
    node: dict[str, Any] = {
        "opName": op_name,
        "opType": op.op_type,
        "param": op.param,
        "inTensors": in_names,
        "outTensors": out_names,
    }
    if isinstance(op, Graph):
        internals = [f"{op_name}_internal_{i}" for i in range(op.n_internal)]
        table = [*in_names, *out_names, *internals]
        node["internalTensors"] = internals
        node["nodes"] = [
            _node_json(child.op, f"{id_path}_{i}", [table[t] for t in child.in_ids], [table[t] for t in child.out_ids])
            for i, child in enumerate(op.nodes)
        ]
    return node


def layer_json(op: Graph, op_id: int) -> dict[str, Any]:
    """`layer/{pid}/{OpType}_{id}.json`: one graph op with its own tensor names."""
    name = f"{op.op_type}_{op_id}"
    return _node_json(
        op, str(op_id), [f"{name}_input_{i}" for i in range(op.n_in)], [f"{name}_output_{i}" for i in range(op.n_out)]
    )


def _input_kind(label: str) -> str:
    if label.endswith("_cache"):
        return "cache"
    if label.endswith("_weight") or label in ("embed", "final_norm", "lm_head"):
        return "weight"
    return "input"


def model_json(graph: Graph, base: int) -> dict[str, Any]:
    """`model/{pid}/{modelName}.json`: the model graph, top-level ops numbered from `base`."""
    m = graph.op_type
    names: list[str] = []
    counts = {"input": 0, "weight": 0}
    groups: dict[str, list[str]] = {"weight": [], "k": [], "v": []}
    for label in graph.in_labels:
        kind = _input_kind(label)
        prefix = "weight" if kind == "weight" else "input"
        name = f"{m}_{prefix}_{counts[prefix]}"
        counts[prefix] += 1
        names.append(name)
        if kind == "weight":
            groups["weight"].append(name)
        elif kind == "cache":
            groups["k" if label.endswith("k_cache") else "v"].append(name)
    outs = [f"{m}_output_{i}" for i in range(graph.n_out)]
    internals = [f"{m}_internal_{i}" for i in range(graph.n_internal)]
    table = [*names, *outs, *internals]
    nodes = [
        _node_json(node.op, str(base + i), [table[t] for t in node.in_ids], [table[t] for t in node.out_ids])
        for i, node in enumerate(graph.nodes)
    ]
    return {
        "modelName": m,
        "inTensors": names,
        "outTensors": outs,
        "internalTensors": internals,
        "weightTensors": groups["weight"],
        "kCacheTensors": groups["k"],
        "vCacheTensors": groups["v"],
        "nodes": nodes,
    }


# ---------------------------------------------------------------- writer
def _tensor_stats(t: torch.Tensor) -> TensorStats:
    if t.numel() == 0:
        return TensorStats()
    x = t.double() if t.is_floating_point() else t.to(torch.float64)
    return TensorStats(max=float(x.max()), min=float(x.min()), mean=float(x.mean()), norm=float(x.norm()))


def write_tensor(path: str, t: torch.Tensor, stats_only: bool) -> None:
    """Write one tensor as the ATB probe does (raw storage; bf16 as its 2-byte words)."""
    name = dtype_name(t.dtype)
    if stats_only:
        write_bin_stats(path, name, tuple(t.shape), _tensor_stats(t))
        return
    t = t.contiguous()
    arr = t.view(torch.int16).numpy() if t.dtype == torch.bfloat16 else t.numpy()
    write_bin(path, arr, name)


class AtbDumper:
    """Writes one run of `AtbLlama` as an ATB dump; `start_execution` hands out the op hook."""

    def __init__(self, config: AtbDumpConfig, model: AtbLlama, input_ids: torch.Tensor, max_new: int) -> None:
        from workbench.backends.atb_naming import id_base

        self.config = config
        self.model = model
        self.pid = config.pid if config.pid is not None else os.getpid()
        if config.dump_root is not None:
            root = Path(config.dump_root)
        else:
            base = Path(config.dump_path)
            stamp = time.strftime("%Y%m%d_%H%M%S")
            root = base / f"msit_dump_{stamp}"
            n = 1
            while root.exists():  # two dumps in the same second: keep both
                root = base / f"msit_dump_{stamp}_{n}"
                n += 1
        self.root = root
        self.writes_manifest = model.tp_rank == 0  # one manifest per dump folder, the first rank's
        self.tensor_root = root / "tensors" / f"{config.device_id}_{self.pid}"
        try:
            self.tensor_root.mkdir(parents=True)
            for phase, graph in model.graphs.items():
                b = id_base(phase, model.dims.num_layers)
                self._write_json(root / "model" / str(self.pid) / f"{graph.op_type}.json", model_json(graph, b))
                for i, node in enumerate(graph.nodes):
                    if isinstance(node.op, Graph):
                        self._write_json(
                            root / "layer" / str(self.pid) / f"{node.op.op_type}_{b + i}.json",
                            layer_json(node.op, b + i),
                        )
        except OSError as exc:
            raise DumpError(root, f"cannot write the dump: {exc.strerror or exc}") from None
        self.manifest = self._manifest(input_ids, max_new)
        if self.writes_manifest:
            self._write_json(root / MANIFEST, self.manifest)
        self._token_dir: Path = self.tensor_root
        self._mutable: set[int] = set()
        self._made: set[str] = set()
        self._queue: queue.Queue[tuple[str, Any] | None] = queue.Queue(maxsize=config.queue_size)
        self._error: DumpError | None = None
        self._thread = threading.Thread(target=self._writer, name="atb-dump-writer", daemon=True)
        self._thread.start()

    # ------------------------------------------------------------ manifest
    def _manifest(self, input_ids: torch.Tensor, max_new: int) -> dict[str, Any]:
        m = self.model
        c = self.config
        return {
            "format": "wb-atb-dump",
            "version": 1,
            "writer": "workbench.backends.atb_llama",
            "command": " ".join(sys.argv),
            "cwd": os.getcwd(),
            "argv": list(sys.argv),
            "pid": self.pid,
            "device_id": c.device_id,
            "model_name": "AtbLlama",
            "graphs": {phase: g.op_type for phase, g in m.graphs.items()},
            "model_config": m.config,
            "dims": asdict(m.dims),
            "dtype": dtype_name(m.dtype),
            "block_size": m.block_size,
            "tensor_parallel": {"size": m.tp_size, "vocab_parallel": m.vocab_parallel} if m.tp_size > 1 else None,
            "defect": m.defect.to_json() if m.defect is not None else None,
            "defect_description": m.defect.describe() if m.defect is not None else "none",
            "seed": c.seed,
            "input_ids": input_ids.tolist(),
            "max_new_tokens": max_new,
            "warmup": c.warmup,
            "token_range": c.token_range,
            "save_time": c.save_time,
            "save_tensor_part": c.save_tensor_part,
            "stats_only": c.stats_only,
            "follow_tokens": str(c.follow_tokens) if c.follow_tokens is not None else None,
        }

    def finish_manifest(self, generated: list[int]) -> None:
        """Record the generated tokens and where the defect is born at each dumped token."""
        m = self.model
        self.manifest["generated"] = generated
        if m.defect is not None:
            counts = range(len(generated) + (1 if self.config.warmup else 0))
            self.manifest["defect_ops"] = {
                str(t): m.defect.expected_op(t, m.dims.num_layers, dtype=m.dtype, warmup=self.config.warmup)
                for t in counts
            }
        if self.writes_manifest:
            self._write_json(self.root / MANIFEST, self.manifest)

    @staticmethod
    def _write_json(path: Path, obj: Any) -> None:
        try:
            path.parent.mkdir(parents=True, exist_ok=True)
            path.write_text(json.dumps(obj, indent=1, default=str))
        except OSError as exc:
            raise DumpError(path, f"cannot write: {exc.strerror or exc}") from None

    # ------------------------------------------------------------ hook
    def start_execution(self, count: int, phase: str, mutable: list[torch.Tensor]) -> AtbDumper | None:
        """Begin execute count `count`; returns the hook, or None when the count is not dumped."""
        self._raise_pending()
        if self.config.token_range is not None and count not in self.config.token_range:
            return None
        self._token_dir = self.tensor_root / str(count)
        self._mutable = {t.untyped_storage().data_ptr() for t in mutable}
        return self

    def _put(self, path: Path, t: torch.Tensor) -> None:
        t = t.detach()
        if t.untyped_storage().data_ptr() in self._mutable:
            t = t.clone()  # an in-place op changes it later
        self._queue.put(("bin", (str(path), t)))

    def before(self, path: str, op: LeafOp | Graph, ins: list[torch.Tensor]) -> None:
        c = self.config
        op_dir = self._token_dir / path
        self._queue.put(("json", (str(op_dir / "op_param.json"), op.param)))
        if c.save_tensor_part != PART_OUT and c.save_time in (SAVE_BEFORE, SAVE_BOTH, SAVE_IN_BEFORE_OUT_AFTER):
            for k, t in enumerate(ins):
                self._put(op_dir / "before" / f"intensor{k}.bin", t)
        if c.save_tensor_part != PART_IN and c.save_time in (SAVE_BEFORE, SAVE_BOTH):
            # only in-place outputs exist before the op runs
            for out_idx, in_idx in sorted(op.inplace.items()):
                self._put(op_dir / "before" / f"outtensor{out_idx}.bin", ins[in_idx])

    def after(self, path: str, op: LeafOp | Graph, ins: list[torch.Tensor], outs: list[torch.Tensor]) -> None:
        c = self.config
        op_dir = self._token_dir / path
        if c.save_tensor_part != PART_IN and c.save_time in (SAVE_AFTER, SAVE_BOTH, SAVE_IN_BEFORE_OUT_AFTER):
            for k, t in enumerate(outs):
                self._put(op_dir / "after" / f"outtensor{k}.bin", t)
        if c.save_tensor_part != PART_OUT and c.save_time in (SAVE_AFTER, SAVE_BOTH):
            for k, t in enumerate(ins):
                self._put(op_dir / "after" / f"intensor{k}.bin", t)

    # ------------------------------------------------------------ writer thread
    def _writer(self) -> None:
        while True:
            item = self._queue.get()
            if item is None:
                return
            if self._error is not None:
                continue  # keep draining so the model thread never blocks
            kind, (path, payload) = item
            try:
                parent = os.path.dirname(path)
                if parent not in self._made:
                    os.makedirs(parent, exist_ok=True)
                    self._made.add(parent)
                if kind == "json":
                    with open(path, "w") as fh:
                        json.dump(payload, fh)
                else:
                    write_tensor(path, payload, self.config.stats_only)
            except OSError as exc:
                self._error = DumpError(path, f"cannot write: {exc.strerror or exc}")
            except Exception as exc:  # a bug must surface on the model thread, not die silently
                self._error = DumpError(path, f"cannot write: {type(exc).__name__}: {exc}")

    def _raise_pending(self) -> None:
        if self._error is not None:
            raise self._error

    def close(self) -> None:
        """Wait for every queued tensor to be written; raises the first write error."""
        if self._thread.is_alive():
            self._queue.put(None)
            self._thread.join()
        self._raise_pending()
