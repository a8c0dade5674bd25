"""Single-op precheck for torch dumps: re-run one module or API call alone, in float64, from its dumped tensors.

A module folder of an msit torch dump (ours or msit's), or a call of an msprobe dump, holds the op's inputs
and outputs; its weights come from `weights/` (our `DumpConfig(dump_weight=True)`, once per run) or from
msprobe's `parameters` entries. Each checker of `CHECKERS` recomputes the op in float64 on the CPU, rounding
to the op's dtype only where the module itself materialises a tensor in that dtype (HF's RMSNorm casts the
normalised activations back before the weight multiply; a rotary embedding's angles are float32), and every
dumped output is judged with msit opcheck's standard for its dtype (`STANDARDS`): the share of elements
whose relative error is within `etol` must exceed `pass_rate`.

Composite modules (self-attention, the gated MLP) are checked stage by stage when their children were
dumped: each projection as a Linear, then the module's own arithmetic between the children's dumped
outputs and inputs (rotary + attention core, `act(gate) * up`), so a verdict names the stage that breaks.
Decode steps rebuild the KV cache from the earlier tokens' dumped `k_proj`/`v_proj` outputs.

Module attributes (epsilon, rotary base, softmax dim) are not dumped: the checker tries the usual values
and names the one it used. This module reads dump files only; it never imports the model that wrote them.
"""

from __future__ import annotations

import json
import math
import os
from collections import defaultdict
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import duckdb
import torch
import torch.nn.functional as F

from workbench.analysis.checks.precheck import SHAPE
from workbench.analysis.checks.precheck_result import WEIGHTS_NOT_DUMPED, OutputCheck, PrecheckResult
from workbench.core.files import MODEL_TREE_NAME
from workbench.formats.model import Dump, DumpError, token_number
from workbench.formats.msit_torch import param_name
from workbench.formats.tensor_io import load_tensor

Tensor = torch.Tensor
EPS_FP32 = 1.1920929e-07  # opcheck: relative error counts only where |reference| > this
REL_PASS_RATE = "rel_pass_rate"  # failed-metric name: too few elements within the dtype's relative error
NAN_INF = "nan_inf"

# msit opcheck's precision standard per output dtype: (relative error tolerance, pass rate in %)
STANDARDS: dict[str, tuple[float, float]] = {
    "float64": (1e-4, 99.99),
    "float32": (2**-20, 99.99),
    "float16": (2**-10, 99.9),
    "bfloat16": (2**-8, 99.9),
    "int64": (1e-4, 99.99),
    "int32": (1e-4, 99.99),
    "int16": (1.0, 99.9),
    "int8": (1.0, 99.9),
    "uint8": (1.0, 99.0),
    "bool": (1e-4, 100.0),
}
RMS_EPS = (1e-6, 1e-5, 1e-12, 1e-8)
LN_EPS = (1e-5, 1e-12, 1e-6)
ROPE_BASES = (10000.0, 1000000.0, 500000.0, 100000.0, 50000.0)


class CannotRun(Exception):
    """The op cannot be re-run from what was dumped; the message says why in one line."""


# ---------------------------------------------------------------------------------------- the dump side


@dataclass(frozen=True, slots=True)
class Entry:
    """One tensor file of one node at one token (`io`: in | out | param)."""

    token: int
    node: str
    io: str
    idx: int
    path: str | None
    error: str | None = None


class TorchDump:
    """The tensor files of one torch dump (msit torch or msprobe), by node and token, loaded on demand."""

    def __init__(
        self,
        kind: str,
        root: str,
        entries: list[Entry],
        types: dict[str, str],
        parents: dict[str, str | None],
        kwargs_inputs: dict[str, Any] | None = None,
    ) -> None:
        self.kind = kind
        self.root = root
        self.types = types
        self.kwargs_inputs = kwargs_inputs or {}
        self._by: dict[tuple[str, int, str], list[Entry]] = defaultdict(list)
        self._tokens: dict[str, set[int]] = defaultdict(set)
        for e in entries:
            self._by[(e.node, e.token, e.io)].append(e)
            if e.io != "param":
                self._tokens[e.node].add(e.token)
        for v in self._by.values():
            v.sort(key=lambda e: e.idx)
        self._params: dict[str, list[Entry]] = {}
        for e in entries:
            if e.io == "param" and e.node not in self._params:
                self._params[e.node] = self._by[(e.node, e.token, "param")]
        self.children: dict[str, dict[str, str]] = defaultdict(dict)
        for node, parent in parents.items():
            if parent is not None:
                self.children[parent][attr_name(node)] = node

    @classmethod
    def from_dump(cls, dump: Dump) -> TorchDump:
        entries = [Entry(t.token, t.node, t.role, t.index, t.path, t.error) for t in dump.tensors]
        return cls(
            dump.kind,
            str(dump.root),
            entries,
            {n.name: _checked_type(n.type, n.params) for n in dump.nodes},
            {n.name: n.parent for n in dump.nodes},
            dump.meta.get("kwargs_inputs") if isinstance(dump.meta.get("kwargs_inputs"), dict) else None,
        )

    @classmethod
    def from_catalog(cls, con: duckdb.DuckDBPyConnection, run_id: int) -> TorchDump:
        """A catalog run (its tensor rows point at the dump's files)."""
        row = con.execute("SELECT kind, path, meta FROM runs WHERE run_id = ?", [run_id]).fetchone()
        if row is None:
            raise CannotRun(f"no run {run_id} in the catalog")
        kind, root, meta_text = row
        if kind == "atb":
            raise CannotRun("an ATB run: check its op folders with the ATB precheck")
        nodes = con.execute(
            "SELECT n.name, n.type, p.name, n.params FROM nodes n LEFT JOIN nodes p ON p.run_id = n.run_id "
            "AND p.node_id = n.parent_id WHERE n.run_id = ?",
            [run_id],
        ).fetchall()
        rows = con.execute(
            "SELECT t.token_id, n.name, t.io, t.idx, t.path, t.error FROM tensors t JOIN nodes n "
            "ON n.run_id = t.run_id AND n.node_id = t.node_id WHERE t.run_id = ?",
            [run_id],
        ).fetchall()
        meta = json.loads(meta_text) if meta_text else {}
        kw = meta.get("kwargs_inputs") if isinstance(meta, dict) else None
        entries = [Entry(int(r[0]), r[1], r[2], int(r[3]), r[4], r[5]) for r in rows]
        return cls(
            str(kind),
            str(root),
            entries + _weights_of_redumps(con, run_id, entries),
            {n[0]: _checked_type(n[1] or "", n[3]) for n in nodes},
            {n[0]: n[2] for n in nodes},
            kw if isinstance(kw, dict) else None,
        )

    def tokens(self, node: str) -> list[int]:
        return sorted(self._tokens.get(node, ()))

    def has(self, node: str, token: int) -> bool:
        return bool(self._by.get((node, token, "out")))

    def _load(self, entries: list[Entry]) -> list[Tensor]:
        out = []
        for e in entries:
            if e.path is None:
                raise CannotRun(f"{e.node} token {e.token}: {e.io}{e.idx} has statistics only (re-dump with tensors)")
            if e.error:
                raise CannotRun(f"{e.path}: {e.error}")
            try:
                out.append(load_tensor(e.path))
            except DumpError as exc:
                raise CannotRun(str(exc)) from None
        return out

    def op(self, node: str, token: int) -> TorchOp:
        """The tensors of `node` at `token`; raises `CannotRun` when they are missing or unreadable."""
        if node not in self.types and not self._tokens.get(node):
            raise CannotRun(f"no node {node!r} in this dump")
        ins_e, outs_e = self._by.get((node, token, "in"), []), self._by.get((node, token, "out"), [])
        if not outs_e:
            raise CannotRun(f"{node}: no output dumped at token {token}")
        params_e = self._by.get((node, token, "param")) or self._params.get(node, [])
        kw = self.kwargs_inputs.get(str(token), {}).get(node, {}) if isinstance(self.kwargs_inputs, dict) else {}
        names = [_input_name(e.path, kw) for e in ins_e]
        params = dict(zip((param_name(e.path or "") for e in params_e), self._load(params_e), strict=True))
        return TorchOp(
            node, self.types.get(node, ""), token, self._load(ins_e), names, self._load(outs_e), params, self
        )

    def op_params(self, node: str) -> dict[str, Tensor]:
        """A node's saved weights by parameter name (any token)."""
        entries = self._params.get(node, [])
        return dict(zip((param_name(e.path or "") for e in entries), self._load(entries), strict=True))

    def descendants(self, node: str) -> list[str]:
        """Every node below `node`, depth first in definition order."""
        out: list[str] = []
        stack = list(reversed(self.children.get(node, {}).values()))
        while stack:
            cur = stack.pop()
            out.append(cur)
            stack.extend(reversed(self.children.get(cur, {}).values()))
        return out

    def child(self, node: str, *attrs: str) -> str | None:
        """The child of `node` named by the first of `attrs` that exists (`q_proj`, `query`, ...)."""
        kids = self.children.get(node, {})
        return next((kids[a] for a in attrs if a in kids), None)


def _weights_of_redumps(con: duckdb.DuckDBPyConnection, run_id: int, entries: list[Entry]) -> list[Entry]:
    """Weights saved with the files a run's tensors were re-pointed to (`wb redump`, the app's `d`): the param
    entries, by node name, of the other runs whose folders hold this run's tensor files, for the nodes that have
    none of their own."""
    have = {e.node for e in entries if e.io == "param"}
    runs = con.execute(
        "SELECT DISTINCT r.run_id FROM runs r JOIN tensors t ON t.run_id = ? AND t.path IS NOT NULL "
        "AND starts_with(t.path, r.path || '/') WHERE r.run_id <> ?",
        [run_id, run_id],
    ).fetchall()
    if not runs:
        return []
    names = {e.node for e in entries} - have
    out: list[Entry] = []
    for (other,) in runs:
        for tok, node, io, idx, path, error in con.execute(
            "SELECT t.token_id, n.name, t.io, t.idx, t.path, t.error FROM tensors t JOIN nodes n "
            "ON n.run_id = t.run_id AND n.node_id = t.node_id WHERE t.run_id = ? AND t.io = 'param'",
            [int(other)],
        ).fetchall():
            if node in names:
                out.append(Entry(int(tok), node, io, int(idx), path, error))
        names -= {e.node for e in out}
    return out


def attr_name(node: str) -> str:
    """A node's attribute name under its parent: `root.a.q_proj` -> q_proj; msprobe
    `Module.a.q_proj.Linear.forward` -> q_proj."""
    parts = node.split("#")[0].split(".")
    if parts[0] in ("Module", "Cell") and len(parts) >= 4:
        return parts[-3]
    return parts[-1]


def _input_name(path: str | None, kwargs: dict[str, Any]) -> str:
    """`input_2_0.pth` with kwargs {"2": "position_embeddings"} -> `position_embeddings.0`; else `input_2_0`."""
    stem = os.path.basename(path or "").split(".")[0]
    parts = stem.split("_")[1:]
    if parts and isinstance(kwargs.get(parts[0]), str):
        return ".".join([kwargs[parts[0]], *parts[1:]])
    return stem


@dataclass(slots=True)
class TorchOp:
    """One module or API call at one token: its dumped inputs, outputs and weights."""

    name: str
    type: str
    token: int
    ins: list[Tensor]
    in_names: list[str]
    outs: list[Tensor]
    params: dict[str, Tensor]
    source: TorchDump
    skipped: dict[str, str] = field(default_factory=dict)  # stage -> why it did not run

    def named(self, name: str) -> Tensor | None:
        return next((t for n, t in zip(self.in_names, self.ins, strict=True) if n == name), None)

    def weight(self, name: str = "weight") -> Tensor:
        w = self.params.get(name)
        if w is None:
            raise CannotRun(
                f"{self.name}: its {name} was not dumped (re-dump with --weights or press d; "
                "DumpConfig(dump_weight=True), msprobe's L0/mix level)"
            )
        return w


@dataclass(slots=True)
class Check:
    """One tensor to judge: the float64 reference and the dumped tensor it must match."""

    label: str
    reference: Tensor
    test: Tensor
    note: str | None = None
    floor: Tensor | None = None  # absolute error a correct kernel may add beyond one rounding (reductions)


TorchChecker = Callable[[TorchOp], list[Check]]


# ---------------------------------------------------------------------------------------- helpers


def _d(t: Tensor) -> Tensor:
    return t.detach().to(torch.float64)


def _rd(t: Tensor, dtype: torch.dtype) -> Tensor:
    """Round a float64 value to `dtype` and back: what materialising it in that dtype does."""
    if not dtype.is_floating_point or dtype == torch.float64:
        return t
    return t.to(dtype).to(torch.float64)


def _one_in(op: TorchOp, what: str = "x") -> Tensor:
    if not op.ins:
        raise CannotRun(f"{op.name}: no input dumped ({what})")
    return op.ins[0]


def judge(check: Check, index: int) -> OutputCheck:
    """msit opcheck's rule for the test tensor's dtype, plus NaN/Inf where the reference is finite."""
    ref, test = check.reference, check.test
    dtype = str(test.dtype).removeprefix("torch.")
    etol, rate_min = STANDARDS.get(dtype, STANDARDS["float32"])
    notes = [n for n in (check.note,) if n]
    if ref.numel() != test.numel():
        reason = f"{check.label}: the reference has shape {list(ref.shape)}, the dumped tensor {list(test.shape)}"
        return OutputCheck(index, {}, False, [SHAPE], "; ".join([reason, *notes]), label=check.label)
    r = ref.reshape(-1).to(torch.float64)
    t = test.reshape(-1).to(torch.float64)
    n = r.numel()
    if n == 0:
        return OutputCheck(index, {}, None, [], f"{check.label}: empty tensor", label=check.label)
    err = (t - r).abs()
    big = r.abs() > EPS_FP32
    rel = torch.where(big, err / r.abs().clamp_min(EPS_FP32), err)  # where the reference is ~0: absolute
    tol = etol * r.abs()
    if test.dtype.is_floating_point:  # subnormal outputs: their spacing is absolute
        fi = torch.finfo(test.dtype)
        tol = tol + fi.smallest_normal * fi.eps
    if check.floor is not None:
        tol = tol + check.floor.reshape(-1).to(torch.float64)
    both_nan = r.isnan() & t.isnan()
    same_inf = r.isinf() & (t == r)
    within = (err <= tol) | (~big & (err <= etol)) | both_nan | same_inf
    rate = 100.0 * float(within.sum()) / n
    passed = rate >= 100.0 if dtype == "bool" else rate > rate_min
    finite = r.isfinite() & t.isfinite()
    rel_f = rel[finite & big]
    rf, tf = r[finite], t[finite]
    denom = float(rf.norm() * tf.norm())
    both_zero = denom == 0 and not bool(rf.any()) and not bool(tf.any())
    cos = 1.0 if both_zero else (float(rf @ tf) / denom if denom else 0.0)
    values: dict[str, float | None] = {
        REL_PASS_RATE: rate,
        "max_relative_error": float(rel_f.max()) if rel_f.numel() else 0.0,
        "max_absolute_error": float(err[finite].max()) if finite.any() else None,
        "cosine_similarity": cos,
    }
    failed = [] if passed else [REL_PASS_RATE]
    nonfinite = int((r.isfinite() & ~t.isfinite()).sum())
    if nonfinite:
        failed.append(NAN_INF)
        passed = False
        notes.append(f"{nonfinite} NaN/Inf where the reference is finite")
    return OutputCheck(index, values, passed, failed, "; ".join(notes) or None, label=check.label)


def standard_text(dtype: str) -> str:
    """opcheck's wording: `99.9%(error<0.00390625)`."""
    etol, rate = STANDARDS.get(dtype, STANDARDS["float32"])
    return f"{rate:g}%(error<{etol:g})"


def _best(candidates: list[tuple[str, list[Check]]]) -> list[Check]:
    """The candidate (an epsilon, a base) whose checks fit best; its note names it."""
    scored = []
    for note, checks in candidates:
        score = min((judge(c, i).values.get(REL_PASS_RATE) or 0.0) for i, c in enumerate(checks))
        scored.append((score, note, checks))
    score, note, checks = max(scored, key=lambda s: s[0])
    for c in checks:
        c.note = "; ".join(x for x in (c.note, note) if x)
    return checks


# ---------------------------------------------------------------------------------------- references


def _linear_ref(x: Tensor, w: Tensor, b: Tensor | None) -> Tensor:
    if w.dim() != 2 or x.shape[-1] != w.shape[1]:
        raise CannotRun(f"x {list(x.shape)} does not multiply weight {list(w.shape)}")
    y = _d(x) @ _d(w).T
    return y + _d(b) if b is not None else y


def _acc_floor(x: Tensor, w_t: Tensor, b: Tensor | None = None) -> Tensor:
    """What float32 accumulation may add to `x @ w_t`: ~sqrt(K) roundings of 2^-24 of the summed magnitudes."""
    mag = _d(x).abs() @ _d(w_t).abs()
    if b is not None:
        mag = mag + _d(b).abs()
    return mag * (2.0 * math.sqrt(max(1, x.shape[-1])) * 2.0**-24)


def _linear_check(label: str, x: Tensor, w: Tensor, b: Tensor | None, out: Tensor, note: str | None = None) -> Check:
    return Check(label, _linear_ref(x, w, b), out, note, floor=_acc_floor(x, w.T, b))


def _linear(op: TorchOp) -> list[Check]:
    return [_linear_check("out", _one_in(op), op.weight(), op.params.get("bias"), op.outs[0])]


def _api_linear(op: TorchOp) -> list[Check]:
    if len(op.ins) < 2:
        raise CannotRun("linear needs x and weight as tensors")
    return [_linear_check("out", op.ins[0], op.ins[1], op.ins[2] if len(op.ins) > 2 else None, op.outs[0])]


def _embedding_ref(ids: Tensor, w: Tensor) -> Tensor:
    if ids.dtype.is_floating_point:
        raise CannotRun(f"embedding indices are {ids.dtype}, not integers")
    flat = ids.long()
    if flat.numel() and (int(flat.min()) < 0 or int(flat.max()) >= w.shape[0]):
        raise CannotRun(f"indices outside the {w.shape[0]} rows of the table")
    return _d(w)[flat]


def _embedding(op: TorchOp) -> list[Check]:
    return [Check("out", _embedding_ref(_one_in(op, "indices"), op.weight()), op.outs[0])]


def _aten_embedding(op: TorchOp) -> list[Check]:
    """`aten.embedding(weight, indices)`: the table first."""
    if len(op.ins) < 2:
        raise CannotRun("embedding needs weight and indices as tensors")
    return [Check("out", _embedding_ref(op.ins[1], op.ins[0]), op.outs[0])]


def _api_embedding(op: TorchOp) -> list[Check]:
    if len(op.ins) < 2:
        raise CannotRun("embedding needs indices and weight as tensors")
    return [Check("out", _embedding_ref(op.ins[0], op.ins[1]), op.outs[0])]


def _rms_norm(op: TorchOp) -> list[Check]:
    x = _one_in(op)
    w = op.weight()
    g = _d(w) + (1.0 if "gemma" in op.type.lower() else 0.0)
    x64 = _d(x)
    var = x64.pow(2).mean(-1, keepdim=True)
    # HF: normalise in float32, cast back to the input dtype, then multiply by the weight
    cands = [
        (
            f"eps {eps:g} assumed (not dumped)",
            [Check("out", g * _rd(x64 * torch.rsqrt(var + eps), x.dtype), op.outs[0])],
        )
        for eps in RMS_EPS
    ]
    return _best(cands)


def _layer_norm_ref(x: Tensor, w: Tensor | None, b: Tensor | None, eps: float) -> Tensor:
    return F.layer_norm(_d(x), (x.shape[-1],), _d(w) if w is not None else None, _d(b) if b is not None else None, eps)


def _ln_floor(x: Tensor, w: Tensor | None, eps: float) -> Tensor:
    """What float32 mean and variance may add: the mean's rounding (of the summed magnitudes) over the spread."""
    x64 = _d(x)
    sd = torch.sqrt(x64.var(-1, unbiased=False, keepdim=True) + eps)
    scale = x64.abs().amax(-1, keepdim=True) / sd * (2.0 * math.sqrt(x.shape[-1]) * 2.0**-24)
    return scale * (_d(w).abs() if w is not None else 1.0) + torch.zeros_like(x64)


def _ln_checks(x: Tensor, w: Tensor | None, b: Tensor | None, out: Tensor) -> list[Check]:
    return _best(
        [
            (
                f"eps {eps:g} assumed (not dumped)",
                [Check("out", _layer_norm_ref(x, w, b, eps), out, floor=_ln_floor(x, w, eps))],
            )
            for eps in LN_EPS
        ]
    )


def _layer_norm(op: TorchOp) -> list[Check]:
    return _ln_checks(_one_in(op), op.params.get("weight"), op.params.get("bias"), op.outs[0])


def _api_layer_norm(op: TorchOp) -> list[Check]:
    x = _one_in(op)
    return _ln_checks(x, op.ins[1] if len(op.ins) > 1 else None, op.ins[2] if len(op.ins) > 2 else None, op.outs[0])


def _silu(x: Tensor) -> Tensor:
    x64 = _d(x)
    return x64 * torch.sigmoid(x64)


def _gelu(x: Tensor) -> Tensor:
    x64 = _d(x)
    return 0.5 * x64 * (1.0 + torch.erf(x64 / math.sqrt(2.0)))


def _gelu_tanh(x: Tensor) -> Tensor:
    x64 = _d(x)
    return 0.5 * x64 * (1.0 + torch.tanh(math.sqrt(2.0 / math.pi) * (x64 + 0.044715 * x64.pow(3))))


def _new_gelu(x: Tensor) -> Tensor:
    """HF's NewGELUActivation: five torch ops, each rounded to the input dtype."""
    dt = x.dtype
    x64 = _d(x)
    inner = _rd(x64 + _rd(0.044715 * _rd(x64.pow(3), dt), dt), dt)
    t = _rd(torch.tanh(_rd(math.sqrt(2.0 / math.pi) * inner, dt)), dt)
    return _rd(0.5 * x64, dt) * _rd(1.0 + t, dt)


_ACTIVATIONS: dict[str, Callable[[Tensor], Tensor]] = {
    "silu": _silu,
    "gelu": _gelu,
    "gelu_tanh": _gelu_tanh,
    "new_gelu": _new_gelu,
    "relu": lambda x: _d(x).clamp_min(0.0),
    "quick_gelu": lambda x: _d(x) * torch.sigmoid(1.702 * _d(x)),
    "sigmoid": lambda x: torch.sigmoid(_d(x)),
    "tanh": lambda x: torch.tanh(_d(x)),
    "exp": lambda x: torch.exp(_d(x)),
    "rsqrt": lambda x: torch.rsqrt(_d(x)),
    "sqrt": lambda x: torch.sqrt(_d(x)),
    "neg": lambda x: -_d(x),
}
_ACTIVATION_TYPES = {
    "SiLU": "silu",
    "SiLUActivation": "silu",
    "GELU": "gelu",
    "GELUActivation": "gelu",
    "GELUTanh": "gelu_tanh",
    "PytorchGELUTanh": "gelu_tanh",
    "FastGELUActivation": "gelu_tanh",
    "NewGELUActivation": "new_gelu",
    "QuickGELUActivation": "quick_gelu",
    "ReLU": "relu",
    "Sigmoid": "sigmoid",
    "Tanh": "tanh",
}


def activation_kind(type_name: str) -> str | None:
    """The activation a module type or API name computes (`silu`, `gelu`, ...), None if it is not one."""
    if type_name in _ACTIVATION_TYPES:
        return _ACTIVATION_TYPES[type_name]
    api = type_name.rsplit(".", 1)[-1].strip("_")
    return api if api in _ACTIVATIONS else None


def _activation(op: TorchOp) -> list[Check]:
    kind = activation_kind(op.type) or activation_kind(_api_name(op.type))
    assert kind is not None
    return [Check("out", _ACTIVATIONS[kind](_one_in(op)), op.outs[0])]


def _softmax(op: TorchOp) -> list[Check]:
    x = _one_in(op)
    return [Check("out", torch.softmax(_d(x), dim=-1), op.outs[0], note="softmax over the last dim assumed")]


_BINARY: dict[str, Callable[[Tensor, Tensor], Tensor]] = {
    "mul": torch.mul,
    "add": torch.add,
    "sub": torch.sub,
    "div": torch.div,
    "truediv": torch.div,
    "matmul": torch.matmul,
    "mm": torch.matmul,
    "bmm": torch.matmul,
    "rmul": torch.mul,
    "radd": torch.add,
}


def _binary(op: TorchOp) -> list[Check]:
    api = _api_name(op.type).strip("_")
    if len(op.ins) < 2:
        raise CannotRun(f"{api}: one operand is not a tensor and was not kept by the dump")
    a, b = _d(op.ins[0]), _d(op.ins[1])
    if api in ("rsub", "rtruediv", "rdiv"):
        a, b = b, a
    fn = _BINARY.get(api, torch.div if api in ("rtruediv", "rdiv") else torch.sub if api == "rsub" else None)
    if fn is None:
        raise CannotRun(f"no reference for {api}")
    try:
        if fn is torch.matmul:
            return [Check("out", fn(a, b), op.outs[0], floor=_acc_floor(op.ins[0], op.ins[1]))]
        return [Check("out", fn(a, b), op.outs[0])]
    except RuntimeError as exc:
        raise CannotRun(f"{api}: the dumped operands do not fit ({str(exc).splitlines()[0][:100]})") from None


def _rotary(op: TorchOp) -> list[Check]:
    if len(op.outs) < 2 or len(op.ins) < 2:
        raise CannotRun("a rotary embedding needs (x, position_ids) in and (cos, sin) out")
    pos = op.named("position_ids")
    pos = pos if pos is not None else op.ins[-1]
    if pos.dtype.is_floating_point:
        raise CannotRun(f"position ids are {pos.dtype}, not integers")
    cos_t, sin_t = op.outs[0], op.outs[1]
    dim = cos_t.shape[-1]
    cands = []
    for base in ROPE_BASES:
        # HF: inv_freq in float32 (or in the model's dtype once `model.to(dtype)` cast the buffer), angles =
        # positions * inv_freq in float32, cos/sin of those, cast to x's dtype
        inv32 = 1.0 / (base ** (torch.arange(0, dim, 2, dtype=torch.int64).float() / dim))
        for stored in dict.fromkeys((torch.float32, cos_t.dtype)):
            inv = _rd(_d(inv32), stored)
            ang = _rd(_d(pos)[..., None] * inv, torch.float32)
            emb = torch.cat((ang, ang), dim=-1)
            where = "" if stored == torch.float32 else f", inv_freq held in {str(stored).removeprefix('torch.')}"
            cands.append(
                (
                    f"rope base {base:g} assumed (inv_freq is a buffer, not dumped){where}",
                    [Check("cos", emb.cos(), cos_t), Check("sin", emb.sin(), sin_t)],
                )
            )
    return _best(cands)


def _api_name(type_name: str) -> str:
    if type_name.startswith("aten."):  # an aten op of an FX dump (TorchAir): aten.mm.default -> mm
        return type_name.split(".")[1]
    return type_name.rsplit(".", 1)[-1]


def _checked_type(node_type: str, params: Any) -> str:
    """The type a node is checked as: a TorchAir GE op as the aten op of the FX node its graph names
    (`MatMulV2` linked to `mm_3-aten.mm.default` -> `aten.mm.default`), any other node as its own type."""
    if isinstance(params, str):
        try:
            params = json.loads(params)
        except ValueError:
            params = None
    fx = params.get("fx") if isinstance(params, dict) else None
    if isinstance(fx, list) and fx and isinstance(fx[0], str) and "-aten." in fx[0]:
        return fx[0].split("-", 1)[1]
    return node_type


# ---------------------------------------------------------------------------------------- composite modules


def _child_linear(op: TorchOp, attrs: tuple[str, ...], x: Tensor, token: int) -> tuple[Tensor, list[Check], str]:
    """A projection's output at `token`: dumped (and checked as a Linear) or recomputed from its weights."""
    src = op.source
    node = src.child(op.name, *attrs)
    if node is None:
        raise CannotRun(f"{op.name}: no child {'/'.join(attrs)}")
    if src.has(node, token):
        child = src.op(node, token)
        checks = []
        if child.params.get("weight") is not None and child.ins:
            checks = [
                _linear_check(attr_name(node), child.ins[0], child.weight(), child.params.get("bias"), child.outs[0])
            ]
        else:
            op.skipped[attr_name(node)] = WEIGHTS_NOT_DUMPED if child.ins else "its input was not dumped"
        return child.outs[0], checks, node
    params = src.op_params(node)
    w = params.get("weight")
    if w is None:
        raise CannotRun(f"{node}: neither dumped at token {token} nor its weight saved")
    y = _rd(_linear_ref(x, w, params.get("bias")), x.dtype)
    return y.to(x.dtype), [], node


def _rotate_half(x: Tensor) -> Tensor:
    half = x.shape[-1] // 2
    return torch.cat((-x[..., half:], x[..., :half]), dim=-1)


def _rope_apply(t: Tensor, cos: Tensor, sin: Tensor, dtype: torch.dtype) -> Tensor:
    """HF `apply_rotary_pos_emb` on `[B, H, T, D]` in `dtype`: three rounded ops."""
    c, s = _d(cos).unsqueeze(1), _d(sin).unsqueeze(1)
    return _rd(_rd(t * c, dtype) + _rd(_rotate_half(t) * s, dtype), dtype)


def _attention_parts(op: TorchOp, token: int) -> tuple[Tensor, Tensor, Tensor, Tensor | None, list[Check]]:
    """q (rotated), k, v (rotated k, v of this token) in float64 `[B, H, T, D]`, the mask, and the projection checks."""
    this = op if token == op.token else op.source.op(op.name, token)
    x = this.named("hidden_states")
    x = x if x is not None else _one_in(this, "hidden_states")
    cos, sin = this.named("position_embeddings.0"), this.named("position_embeddings.1")
    if cos is None or sin is None:
        pairs = [t for t in this.ins[1:] if t.is_floating_point() and t.dim() == 3]
        if len(pairs) < 2:
            raise CannotRun(f"{op.name}: no position embeddings (cos, sin) among the dumped inputs")
        cos, sin = pairs[0], pairs[1]
    head_dim = cos.shape[-1]
    dt = x.dtype
    q, cq, _ = _child_linear(this, ("q_proj", "query"), x, token)
    k, ck, _ = _child_linear(this, ("k_proj", "key"), x, token)
    v, cv, _ = _child_linear(this, ("v_proj", "value"), x, token)
    b, t = x.shape[0], x.shape[1]

    def heads(y: Tensor) -> Tensor:
        if y.numel() % (b * t * head_dim):
            raise CannotRun(f"{op.name}: projection {list(y.shape)} does not split into heads of {head_dim}")
        return _d(y).reshape(b, t, -1, head_dim).transpose(1, 2)

    qh, kh, vh = heads(q), heads(k), heads(v)
    qh, kh = _rope_apply(qh, cos, sin, dt), _rope_apply(kh, cos, sin, dt)
    mask = this.named("attention_mask")
    return qh, kh, vh, mask, cq + ck + cv


def _starts_at_position_zero(op: TorchOp) -> bool:
    """Whether this call's first query is position 0 (a prefill, no cache): from position_ids, else from sin
    (all zero at position 0)."""
    pos = op.named("position_ids")
    if pos is not None and not pos.dtype.is_floating_point and pos.numel():
        return int(pos.min()) == 0
    sin = op.named("position_embeddings.1")
    if sin is not None and sin.dim() >= 2:
        return bool((sin[..., 0, :] == 0).all())
    return op.token == 0


def _attention(op: TorchOp) -> list[Check]:
    qh, kh, vh, mask, checks = _attention_parts(op, op.token)
    x = op.named("hidden_states")
    dt = (x if x is not None else op.ins[0]).dtype
    past = [t for t in op.source.tokens(op.name) if t < op.token]
    note = None
    if not _starts_at_position_zero(op):
        if past != list(range(op.token)):
            missing = sorted(set(range(op.token)) - set(past))
            raise CannotRun(f"decode token {op.token}: the KV cache needs tokens {missing}, which were not dumped")
        ks, vs = [], []
        for t in past:
            _, k_t, v_t, _, _ = _attention_parts(op, t)
            ks.append(k_t)
            vs.append(v_t)
        kh, vh = torch.cat([*ks, kh], dim=2), torch.cat([*vs, vh], dim=2)
        note = f"KV cache rebuilt from tokens 0-{op.token - 1}"
    hq, hkv = qh.shape[1], kh.shape[1]
    if hkv == 0 or hq % hkv:
        raise CannotRun(f"{hq} query heads do not group over {hkv} kv heads")
    kh, vh = kh.repeat_interleave(hq // hkv, dim=1), vh.repeat_interleave(hq // hkv, dim=1)
    tq, tk = qh.shape[2], kh.shape[2]
    scores = (qh @ kh.transpose(-1, -2)) / math.sqrt(qh.shape[-1])
    if mask is not None and mask.dim() == 4:
        m = mask[..., -tq:, -tk:]
        scores = scores.masked_fill(~m, float("-inf")) if m.dtype == torch.bool else scores + _d(m)
    else:
        causal = torch.ones(tq, tk, dtype=torch.bool).tril(diagonal=tk - tq)
        scores = scores.masked_fill(~causal, float("-inf"))
        if mask is not None and mask.dim() == 2:  # padding mask [B, Tk]
            scores = scores.masked_fill(~mask[:, None, None, -tk:].bool(), float("-inf"))
    probs = torch.softmax(scores, dim=-1)
    core = (probs @ vh).transpose(1, 2).reshape(qh.shape[0], tq, -1)
    # a kernel may hold the scores and probabilities in the input dtype: each weight is then off by up to a
    # rounding, so the sum may be off by a rounding of the summed magnitudes
    etol = STANDARDS.get(str(dt).removeprefix("torch."), STANDARDS["float32"])[0]
    floor = ((probs @ vh.abs()) * (2.0 * etol)).transpose(1, 2).reshape(core.shape)
    o_node = op.source.child(op.name, "o_proj", "dense", "out_proj")
    if o_node is not None and op.source.has(o_node, op.token):
        o = op.source.op(o_node, op.token)
        checks.append(Check("attention core", core, o.ins[0], note, floor=floor))
        if o.params.get("weight") is not None:
            checks.append(_linear_check(attr_name(o_node), o.ins[0], o.weight(), o.params.get("bias"), o.outs[0]))
        else:
            op.skipped[attr_name(o_node)] = WEIGHTS_NOT_DUMPED
        checks.append(Check("out", _d(o.outs[0]), op.outs[0]))
        return checks
    if o_node is None:
        checks.append(Check("out", core, op.outs[0], note))
        return checks
    params = op.source.op_params(o_node)
    if params.get("weight") is None:
        raise CannotRun(f"{o_node}: neither dumped at token {op.token} nor its weight saved")
    out = _linear_ref(_rd(core, dt), params["weight"], params.get("bias"))
    checks.append(Check("out", out, op.outs[0], "; ".join(x for x in (note, "recomputed end to end") if x)))
    return checks


def _gated_mlp(op: TorchOp) -> list[Check]:
    src = op.source
    if src.child(op.name, "gate_proj") is None:
        raise CannotRun(f"{op.type}: only gated MLPs (gate_proj, up_proj, down_proj) are implemented")
    x = _one_in(op)
    gate, checks, _ = _child_linear(op, ("gate_proj",), x, op.token)
    up, c2, _ = _child_linear(op, ("up_proj",), x, op.token)
    checks += c2
    act_node = src.child(op.name, "act_fn", "act")
    kind = activation_kind(src.types.get(act_node or "", "")) or "silu"
    if act_node is not None and src.has(act_node, op.token):
        a = src.op(act_node, op.token)
        checks.append(Check(attr_name(act_node), _ACTIVATIONS[kind](a.ins[0]), a.outs[0]))
        act = a.outs[0]
    else:
        act = _rd(_ACTIVATIONS[kind](gate), gate.dtype).to(gate.dtype)
    prod = _d(act) * _d(up)
    down = src.child(op.name, "down_proj")
    if down is not None and src.has(down, op.token):
        d = src.op(down, op.token)
        checks.append(Check("act(gate) * up", prod, d.ins[0]))
        if d.params.get("weight") is not None:
            checks.append(_linear_check("down_proj", d.ins[0], d.weight(), d.params.get("bias"), d.outs[0]))
        else:
            op.skipped["down_proj"] = WEIGHTS_NOT_DUMPED
        checks.append(Check("out", _d(d.outs[0]), op.outs[0]))
        return checks
    params = src.op_params(down) if down is not None else {}
    if params.get("weight") is None:
        raise CannotRun(f"{op.name}: down_proj neither dumped nor its weight saved")
    checks.append(
        Check(
            "out",
            _linear_ref(_rd(prod, gate.dtype), params["weight"], params.get("bias")),
            op.outs[0],
            "recomputed end to end",
        )
    )
    return checks


# ---------------------------------------------------------------------------------------- the registry

CHECKERS: dict[str, TorchChecker] = {
    "Linear": _linear,
    "Embedding": _embedding,
    "RMSNorm": _rms_norm,
    "LayerNorm": _layer_norm,
    "RotaryEmbedding": _rotary,
    "Attention": _attention,
    "MLP": _gated_mlp,
    "Activation": _activation,
    "Softmax": _softmax,
    "linear": _api_linear,
    "embedding": _api_embedding,
    "layer_norm": _api_layer_norm,
    "softmax": _softmax,
    "binary": _binary,
    "aten_embedding": _aten_embedding,
}
SUPPORTED_TYPES = (
    "Linear, Embedding, *RMSNorm, LayerNorm, *RotaryEmbedding, *Attention (q/k/v/o projections), gated *MLP, "
    "activations (SiLU, GELU, GELU-tanh, NewGELU, ReLU, ...), Softmax; APIs linear, embedding, layer_norm, "
    "softmax, matmul/mm/bmm, mul, add, sub, div and unary activations; the same aten ops of an FX dump (and the GE "
    "ops linked to them)"
)


def checker_key(type_name: str) -> str | None:
    """The `CHECKERS` key for a module type (`LlamaRMSNorm`) or API name (`Functional.linear`, `matmul`)."""
    if type_name in CHECKERS and type_name[0].isupper():
        return type_name
    if activation_kind(type_name) is not None and "." not in type_name and type_name[0].isupper():
        return "Activation"
    for suffix in ("RMSNorm", "RotaryEmbedding", "Attention", "MLP", "LayerNorm"):
        if type_name.endswith(suffix) and type_name[:1].isupper() and "." not in type_name:
            return suffix
    if type_name in ("Linear", "Embedding", "Softmax"):
        return type_name
    if type_name.startswith("aten.embedding."):
        return "aten_embedding"
    api = _api_name(type_name)
    if api in ("linear", "embedding", "layer_norm", "softmax"):
        return api
    if api.strip("_") in _BINARY or api.strip("_") in ("rsub", "rtruediv", "rdiv"):
        return "binary"
    if activation_kind(api) is not None:
        return "Activation"
    return None


# ---------------------------------------------------------------------------------------- public API


def precheck_node(source: TorchDump, node: str, token: int) -> PrecheckResult:
    """Re-run one torch module or API call at one token and judge each dumped output (and stage)."""
    type_name = source.types.get(node, "")

    def result(
        supported: bool, passed: bool | None, reason: str | None, outs: list[OutputCheck] | None = None
    ) -> PrecheckResult:
        return PrecheckResult(f"{source.root}::{node}@{token}", type_name, supported, passed, outs or [], reason, node)

    key = checker_key(type_name)
    if key is None:
        return result(False, None, f"no reference for {type_name or 'an untyped node'} (supported: {SUPPORTED_TYPES})")
    try:
        op = source.op(node, token)
        checks = CHECKERS[key](op)
    except CannotRun as exc:
        return result(True, None, f"cannot run: {exc}")
    except (RuntimeError, ValueError, IndexError) as exc:
        return result(
            True, None, f"cannot run: the dumped tensors do not fit a {key} ({str(exc).splitlines()[0][:120]})"
        )
    outputs = [judge(c, i) for i, c in enumerate(checks)]
    skipped = dict(op.skipped)
    for o in outputs:
        if o.passed is None:
            skipped.setdefault(o.label, o.reason or "nothing to judge")
    if any(o.passed is False for o in outputs):
        passed: bool | None = False
    elif outputs and not skipped:
        passed = True
    else:
        passed = None
    bad = [o for o in outputs if o.passed is False]
    reason = None
    if bad:
        reason = "; ".join(
            f"{o.label}: {o.values.get(REL_PASS_RATE, 0) or 0:.2f}% within "
            f"{standard_text(str(checks[o.index].test.dtype).removeprefix('torch.'))}"
            for o in bad
        )
    notes = sorted({c.note for c in checks if c.note})
    if notes:
        reason = "; ".join([*(r for r in (reason,) if r), *notes])
    res = result(True, passed, reason, outputs)
    res.not_checked = list(skipped)
    res.why = "; ".join(dict.fromkeys(skipped.values())) or None
    return res


def precheck_nodes(source: TorchDump, token: int, nodes: list[str] | None = None) -> list[PrecheckResult]:
    """Precheck every node (or the given ones) that has outputs at `token`, in the dump's node order."""
    names = nodes if nodes is not None else [n for n in source.types if source.has(n, token)]
    return [precheck_node(source, n, token) for n in names]


@dataclass(slots=True)
class Target:
    """What a path names: the dump to read, a node (None: all) and a token (None: the first)."""

    dump_path: Path
    node: str | None = None
    token: int | None = None
    notes: list[str] = field(default_factory=list)


def target_of(path: Path) -> Target:
    """`{dev}/{token}/{module}` -> that module and token; `{dev}/{token}` -> that token; else the dump."""
    p = path.resolve()
    tok, parent_tok = token_number(p.name), token_number(p.parent.name)
    if parent_tok is not None and (p.parent.parent / MODEL_TREE_NAME).exists():
        return Target(p.parent.parent, p.name, parent_tok)
    if tok is not None and (p.parent / MODEL_TREE_NAME).exists():
        return Target(p.parent, None, tok)
    return Target(p)


def precheck_path(path: Path, token: int | None = None, node: str | None = None) -> list[PrecheckResult]:
    """Precheck a torch dump by path: a module folder (that module), a token folder, or any level `open_dump`
    accepts (every node of `token`, default the first token); `node` picks one node by name."""
    from workbench.formats.detect import open_dump

    target = target_of(path)
    dump = open_dump(target.dump_path)
    if dump.kind == "atb":
        raise CannotRun(f"{path}: an ATB dump (its op folders are checked by the ATB precheck)")
    source = TorchDump.from_dump(dump)
    tok = token if token is not None else target.token
    if tok is None:
        tok = dump.tokens[0] if dump.tokens else 0
    name = node or target.node
    if name is not None:
        if name not in source.types and not source.tokens(name):
            raise CannotRun(f"{path}: no node {name!r} in this dump")
        if checker_key(source.types.get(name, "")) is None:  # a container: its modules
            below = [n for n in source.descendants(name) if source.has(n, tok)]
            if below:
                return precheck_nodes(source, tok, below)
        return [precheck_node(source, name, tok)]
    return precheck_nodes(source, tok)


def precheck_catalog(
    con: duckdb.DuckDBPyConnection, cmp_id: int, golden_node: int | str, token: int, side: str = "test"
) -> list[PrecheckResult]:
    """Precheck the `side` op of a comparison's golden node at `token` (torch module, msprobe call or ATB op).

    A group (an ATB `1_Attention`, a torch container with no reference of its own) yields its leaf ops in
    execution order, as `wb compare` re-runs them; an op yields itself.
    """
    from workbench.analysis.checks.precheck import precheck_group
    from workbench.catalog.lookup import NodeLookupError, compared_node

    try:
        run_id, node_id = compared_node(con, cmp_id, golden_node, token, side)
    except NodeLookupError as exc:
        raise CannotRun(str(exc)) from None
    kind_row = con.execute("SELECT kind FROM runs WHERE run_id = ?", [run_id]).fetchone()
    name_row = con.execute("SELECT name FROM nodes WHERE run_id = ? AND node_id = ?", [run_id, node_id]).fetchone()
    if kind_row is None or name_row is None:
        raise CannotRun(f"run {run_id} or its node {node_id} is missing from the catalog")
    if kind_row[0] == "atb":
        paths = con.execute(
            "SELECT path FROM tensors WHERE run_id = ? AND node_id = ? AND token_id = ? AND path IS NOT NULL LIMIT 1",
            [run_id, node_id, token],
        ).fetchone()
        if paths is None:
            raise CannotRun(f"{name_row[0]}: no tensor file at token {token}")
        folder = Path(paths[0]).parent
        try:
            return precheck_group(folder.parent if folder.name in ("before", "after") else folder)
        except DumpError as exc:
            raise CannotRun(str(exc)) from None
    source, name = TorchDump.from_catalog(con, run_id), str(name_row[0])
    if checker_key(source.types.get(name, "")) is None:  # a container: its modules
        below = [n for n in source.descendants(name) if source.has(n, token)]
        if below:
            return precheck_nodes(source, token, below)
    return [precheck_node(source, name, token)]
