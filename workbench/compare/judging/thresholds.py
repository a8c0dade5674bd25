"""Pass/fail bounds per metric and test dtype, with rules for special nodes (logits).

Defaults ship in `workbench/data/thresholds.toml`; a user TOML file of the same structure is
merged over them (tables key by key, `[[rule]]`s by `name`, other values replaced). The format
is documented in `docs/metrics.md`.
"""

from __future__ import annotations

import copy
import json
import math
import re
import tomllib
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from workbench.catalog.schema import ALL_METRICS
from workbench.core.capped import THRESHOLDS, FileRefused, read_text
from workbench.core.files import package_data
from workbench.core.metrics import NAN_INF as NAN_INF
from workbench.core.metrics import STAT_BOUND, STAT_BOUND_JUDGED_AS
from workbench.formats.model import canonical_dtype

DEFAULTS_RESOURCE = "thresholds.toml"

_TOP_KEYS = {"verdict", "nan_inf_fails", "default_dtype", "dtype", "rule"}
_RULE_KEYS = {"name", "match", "verdict", "dtype", "model_output"}
_QUANTIZED = {"int8", "uint8", "int4", "qint8", "quint8"}

Bounds = dict[str, tuple[float | None, float | None]]
_RESOLVED_MAX = 65536  # `Thresholds._resolve` answers kept (a node each; a dump of more nodes starts over)


@dataclass(frozen=True, slots=True)
class Rule:
    """Extra verdict metrics and bound overrides for the OUTPUTS of nodes whose name or type matches `match`.

    A rule never judges a node's inputs (lm_head's input is a hidden state, not logits); with
    `model_output` it also judges the model's own output (the root module's, i.e. the logits).
    """

    name: str
    match: re.Pattern[str]
    verdict: tuple[str, ...]
    dtypes: dict[str, Bounds]
    model_output: bool = False

    def applies(self, node_name: str, node_type: str, io: str = "out", is_model: bool = False) -> bool:
        if io != "out":
            return False
        if is_model and self.model_output:
            return True
        return bool(self.match.search(node_name) or (node_type and self.match.search(node_type)))


@dataclass(frozen=True, slots=True)
class Thresholds:
    """Effective thresholds (defaults merged with an optional user file)."""

    verdict: tuple[str, ...]
    nan_inf_fails: bool
    default_dtype: str
    dtypes: dict[str, Bounds]
    rules: tuple[Rule, ...] = ()
    config: dict[str, Any] = field(default_factory=dict, repr=False)  # the merged TOML data
    # `_resolve`'s answers by its arguments: a compare judges each node at every token (and rules match by regex)
    _resolved: dict[tuple[str, str, str, str, bool], tuple[tuple[str, ...], Bounds]] = field(
        default_factory=dict, init=False, repr=False, compare=False
    )

    @classmethod
    def load(cls, path: str | Path | None = None) -> Thresholds:
        """Defaults, merged with the TOML file at `path` if given; ValueError names a bad file."""
        text = package_data(DEFAULTS_RESOURCE).read_text(encoding="utf-8")
        data = _parse(text, f"<package>/workbench/data/{DEFAULTS_RESOURCE}")
        if path is not None:
            p = Path(path)
            try:
                user_text = read_text(p, THRESHOLDS)
            except FileRefused as exc:
                raise ValueError(str(exc)) from None
            except (OSError, UnicodeDecodeError) as exc:
                why = getattr(exc, "strerror", None) or exc
                raise ValueError(f"{p}: cannot read thresholds file ({why})") from None
            try:
                data = _merge(data, _parse(user_text, str(p)))
                return cls.from_dict(data, str(p))
            except RecursionError:
                raise ValueError(f"{p}: thresholds nested too deeply to read") from None
        return cls.from_dict(data, "<package defaults>")

    @classmethod
    def from_dict(cls, data: dict[str, Any], source: str = "<dict>") -> Thresholds:
        """Validate a thresholds mapping (the TOML structure); ValueError names `source`."""
        try:
            return cls._build(data)
        except ValueError as exc:
            raise ValueError(f"{source}: {exc}") from None

    @classmethod
    def _build(cls, data: dict[str, Any]) -> Thresholds:
        unknown = set(data) - _TOP_KEYS
        if unknown:
            raise ValueError(f"unknown key(s) {sorted(unknown)}; expected {sorted(_TOP_KEYS)}")
        verdict = _metric_list(data.get("verdict", []), "verdict")
        nan_inf = data.get("nan_inf_fails", True)
        if not isinstance(nan_inf, bool):
            raise ValueError("nan_inf_fails must be true or false")
        default_dtype = canonical_dtype(str(data.get("default_dtype", "float32"))) or "float32"
        dtypes = _dtype_tables(data.get("dtype", {}), "dtype")
        if default_dtype not in dtypes:
            raise ValueError(f"default_dtype {default_dtype!r} has no [dtype.{default_dtype}] table")
        rules = []
        raw_rules = data.get("rule", [])
        if not isinstance(raw_rules, list):
            raise ValueError("rule must be an array of tables ([[rule]])")
        for i, raw in enumerate(raw_rules):
            where = f"rule #{i + 1}"
            if not isinstance(raw, dict):
                raise ValueError(f"{where} is not a table")
            bad = set(raw) - _RULE_KEYS
            if bad:
                raise ValueError(f"{where}: unknown key(s) {sorted(bad)}; expected {sorted(_RULE_KEYS)}")
            if not isinstance(raw.get("match"), str) or not raw["match"]:
                raise ValueError(f"{where}: `match` must be a non-empty regular expression string")
            try:
                pattern = re.compile(raw["match"])
            except re.error as exc:
                raise ValueError(f"{where}: bad regular expression {raw['match']!r} ({exc})") from None
            model_output = raw.get("model_output", False)
            if not isinstance(model_output, bool):
                raise ValueError(f"{where}: model_output must be true or false")
            rules.append(
                Rule(
                    str(raw.get("name", f"rule{i + 1}")),
                    pattern,
                    _metric_list(raw.get("verdict", []), f"{where} verdict"),
                    _dtype_tables(raw.get("dtype", {}), f"{where} dtype"),
                    model_output,
                )
            )
        return cls(verdict, nan_inf, default_dtype, dtypes, tuple(rules), copy.deepcopy(data))

    # ------------------------------------------------------------------------------------------

    def table_dtype(self, dtype: str | None) -> str:
        """The `[dtype.*]` table that applies to a test dtype (quantized ints -> int8, else default)."""
        dt = canonical_dtype(dtype)
        if dt in self.dtypes:
            return dt
        if dt in _QUANTIZED and "int8" in self.dtypes:
            return "int8"
        return self.default_dtype

    def _resolve(
        self, dtype: str | None, node_name: str, node_type: str, io: str = "out", is_model: bool = False
    ) -> tuple[tuple[str, ...], Bounds]:
        """(verdict metrics, bounds) for a test dtype and node; the bounds are shared: read them, never change them."""
        dt = self.table_dtype(dtype)
        key = (dt, node_name, node_type, io, is_model)
        found = self._resolved.get(key)
        if found is not None:
            return found
        bounds = dict(self.dtypes.get(dt, {}))
        verdict = list(self.verdict)
        for rule in self.rules:
            if rule.applies(node_name, node_type, io, is_model):
                bounds.update(rule.dtypes.get(dt, {}))
                verdict += [m for m in rule.verdict if m not in verdict]
        if len(self._resolved) >= _RESOLVED_MAX:
            self._resolved.clear()
        found = self._resolved[key] = (tuple(verdict), bounds)
        return found

    def verdict_metrics(
        self, dtype: str | None = None, *, node_name: str = "", node_type: str = "", io: str = "out"
    ) -> list[str]:
        """Metrics that decide pass/fail for a node's output (or input, `io="in"`) of this dtype."""
        return list(self._resolve(dtype, node_name, node_type, io)[0])

    def bounds_for(
        self, metric: str, dtype: str | None, *, node_name: str = "", node_type: str = "", io: str = "out"
    ) -> tuple[float | None, float | None]:
        """(min, max) of `metric` for a test dtype (and node output or input, for rules); None = unbounded."""
        return self._resolve(dtype, node_name, node_type, io)[1].get(metric, (None, None))

    def judge(
        self,
        values: dict[str, float | None],
        dtype: str | None,
        *,
        node_name: str = "",
        node_type: str = "",
        nan_inf_mismatch: bool = False,
        io: str = "out",
        is_model: bool = False,
    ) -> tuple[bool | None, list[str]]:
        """(passed, failed metrics): passed is None when no verdict metric could be computed.

        A NaN metric value fails. `nan_inf_mismatch` (NaN/Inf on the test side where golden
        has none) fails as `nan_inf` when `nan_inf_fails`. Rules judge outputs only (`io`);
        `is_model` marks the model's own output (rules with `model_output`).
        """
        verdict, bounds = self._resolve(dtype, node_name, node_type, io, is_model)
        failed: list[str] = []
        if nan_inf_mismatch and self.nan_inf_fails:
            failed.append(NAN_INF)
        judged = False
        for metric in verdict:
            v = values.get(metric)
            if v is None:
                continue
            judged = True
            lo, hi = bounds.get(metric, (None, None))
            if math.isnan(v) or (lo is not None and v < lo) or (hi is not None and v > hi):
                failed.append(metric)
        if not judged and not failed:
            return None, []
        return not failed, failed

    def judge_statistics(
        self,
        bound: float | None,
        dtype: str | None,
        *,
        node_name: str = "",
        node_type: str = "",
        io: str = "out",
        is_model: bool = False,
    ) -> tuple[bool | None, list[str]]:
        """(passed, failed metrics) of a pair compared on statistics only: `bound` (`stat_rel_euclid_bound`,
        a lower bound of the relative euclidean distance) fails when above that metric's maximum, when the
        relative euclidean distance decides; None when nothing decides."""
        verdict, bounds = self._resolve(dtype, node_name, node_type, io, is_model)
        hi = bounds.get(STAT_BOUND_JUDGED_AS, (None, None))[1]
        if bound is None or STAT_BOUND_JUDGED_AS not in verdict or hi is None:
            return None, []
        if math.isnan(bound) or bound > hi:
            return False, [STAT_BOUND]
        return True, []

    def to_json(self) -> str:
        """The effective configuration as canonical JSON (stored with each comparison)."""
        return json.dumps(self.config, sort_keys=True, separators=(",", ":"))


# ----------------------------------------------------------------------------------------------


def _parse(text: str, source: str) -> dict[str, Any]:
    try:
        return tomllib.loads(text)
    except tomllib.TOMLDecodeError as exc:
        raise ValueError(f"{source}: not valid TOML ({exc})") from None
    except RecursionError:
        raise ValueError(f"{source}: TOML nested too deeply to read") from None


def _merge(base: dict[str, Any], over: dict[str, Any]) -> dict[str, Any]:
    """`over` merged into a copy of `base`: tables recursively, rules by name, the rest replaced."""
    out = copy.deepcopy(base)
    for key, value in over.items():
        if key == "rule" and isinstance(value, list) and isinstance(out.get("rule"), list):
            rules = out["rule"]
            for rule in value:
                name = rule.get("name") if isinstance(rule, dict) else None
                same = next((i for i, r in enumerate(rules) if name is not None and r.get("name") == name), None)
                if same is None:
                    rules.append(copy.deepcopy(rule))
                else:
                    rules[same] = _merge(rules[same], rule)
        elif isinstance(value, dict) and isinstance(out.get(key), dict):
            out[key] = _merge(out[key], value)
        else:
            out[key] = copy.deepcopy(value)
    return out


def _metric_list(value: Any, where: str) -> tuple[str, ...]:
    if not isinstance(value, list) or not all(isinstance(v, str) for v in value):
        raise ValueError(f"{where} must be a list of metric names")
    for m in value:
        _check_metric(m, where)
    return tuple(value)


def _check_metric(name: str, where: str) -> None:
    if name not in ALL_METRICS:
        raise ValueError(f"{where}: unknown metric {name!r}; known: {', '.join(ALL_METRICS)}")


def _dtype_tables(value: Any, where: str) -> dict[str, Bounds]:
    if not isinstance(value, dict):
        raise ValueError(f"{where} must be a table of dtype tables")
    out: dict[str, Bounds] = {}
    for dtype, table in value.items():
        dt = canonical_dtype(dtype) or dtype
        if not isinstance(table, dict):
            raise ValueError(f"[{where}.{dtype}] must be a table of metric = {{ min = .., max = .. }}")
        bounds: Bounds = {}
        for metric, bound in table.items():
            _check_metric(metric, f"[{where}.{dtype}]")
            if not isinstance(bound, dict) or not bound or set(bound) - {"min", "max"}:
                raise ValueError(f"[{where}.{dtype}] {metric} must be {{ min = x }}, {{ max = y }} or both")
            lo, hi = bound.get("min"), bound.get("max")
            for b in (lo, hi):
                if b is not None and (isinstance(b, bool) or not isinstance(b, int | float) or math.isnan(b)):
                    raise ValueError(f"[{where}.{dtype}] {metric}: bounds must be numbers, got {b!r}")
            if lo is not None and hi is not None and lo > hi:
                raise ValueError(f"[{where}.{dtype}] {metric}: min {lo} > max {hi}")
            bounds[metric] = (None if lo is None else float(lo), None if hi is None else float(hi))
        out[dt] = bounds
    return out
