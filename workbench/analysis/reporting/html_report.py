"""`wb report`: one self-contained HTML file to share a comparison (no script, no font, no network).

Built from the app's own headless views (`Explorer`: the logits strip, the token x layer heatmap, the
verdict, the advisor), so its numbers are the app's. Every text that came from a dump or the catalog goes
through `html.escape`. Pictures are inline SVG; `@media print` puts each section on its own page.
"""

from __future__ import annotations

import html
import json
import math
import shlex
import tomllib
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from workbench.analysis.explorer.explore import Explorer
from workbench.analysis.explorer.severity import LEVEL_EDGES, PASS_LEVELS, VERDICT
from workbench.analysis.explorer.token_view import StripCell
from workbench.analysis.explorer.views import BORN_ADVISOR, BORN_FAILS, ComparisonInfo, Heatmap, Side
from workbench.analysis.verdicts.born import INPUTS_UNCHECKED
from workbench.core.advice import added_inside, born_in_noise, elsewhere
from workbench.core.files import package_data
from workbench.core.owned import check_replaceable

HEADER = "<!DOCTYPE html><!-- written by wb report -->"  # first line: how a later `wb report` knows its own file
ADVICE_TOP = 5  # advisor rows per token
PRINT_THEME = "light.toml"  # paper is white: the light theme's palette
SECTIONS = ("verdict", "heatmap", "logits", "advisor", "precheck", "commands")
_FALLBACK_COLOURS = {
    "ok": "#1a7f37",
    "fail": "#cf222e",
    "nan": "#bf3989",
    "born": "#bc4c00",
    "heat-none": "#f6f8fa",
    **{
        f"heat-{i}": c
        for i, c in enumerate(("#dafbe1", "#aceebb", "#d4e79e", "#f6d860", "#f49b58", "#e5534b", "#a40e26"))
    },
}


@dataclass(frozen=True, slots=True)
class ReportFacts:
    """What the report shows, read once from the catalog."""

    catalog: Path
    info: ComparisonInfo
    strip: list[StripCell]
    heatmap: Heatmap
    born: dict[int, tuple[str | None, str | None, str | None]]  # token -> (golden op, test op, evidence)
    advice: list[Any]
    advice_note: str
    commands: list[tuple[str, str]]  # (what, command line)
    origins: dict[int, str] = field(default_factory=dict)  # token with no op born -> the advisor's op standing out
    born_notes: dict[int, str] = field(default_factory=dict)  # token -> `added_inside`'s or `born_in_noise`'s note
    call_drift: list[tuple[str, bool]] = field(default_factory=list)  # calls made at some tokens only (`wb compare`'s)


def _e(value: object) -> str:
    return html.escape(str(value), quote=True)


def palette() -> dict[str, str]:
    """The light theme's domain colours (the same file the app reads); built-in defaults when unreadable."""
    try:
        data = tomllib.loads(package_data("themes", PRINT_THEME).read_text(encoding="utf-8"))
        variables = data.get("variables", {})
    except (OSError, UnicodeDecodeError, tomllib.TOMLDecodeError):
        variables = {}
    colours = dict(_FALLBACK_COLOURS)
    if isinstance(variables, dict):
        colours.update({k: str(v) for k, v in variables.items() if k in colours and str(v).startswith("#")})
    return colours


def collect(catalog: Path, cmp_id: int | None = None) -> ReportFacts:
    """Read what the report shows through the app's `Explorer`; ExploreError names the file when unusable."""
    ex = Explorer(catalog, cmp_id)
    try:
        info = ex.info
        born: dict[int, tuple[str | None, str | None, str | None]] = {}
        origins: dict[int, str] = {}
        born_notes: dict[int, str] = {}
        for tok in info.tokens:
            v = ex.verdict(tok)  # the app's verdict: the born op, else the advisor's op standing out, else none
            name = ex.node_name("golden", v.golden)
            if v.why == BORN_ADVISOR and name is not None:  # as the app's status line and `wb compare`
                born[tok] = (None, None, None)
                origins[tok] = name
            else:
                born[tok] = (name, ex.node_name("test", v.test), v.evidence)
                note = added_inside(v.score, v.inside_name, v.inside_score) if v.why == BORN_FAILS else None
                if v.why == BORN_FAILS and (note := note or born_in_noise(v.score, v.evidence, v.inside_score)):
                    born_notes[tok] = note
                    if v.origin_name is not None and v.origin_score is not None:
                        born_notes[tok] += f"; {elsewhere(v.origin_name, v.origin_score, tok)}"
                if v.why == BORN_FAILS and v.inputs_unchecked:
                    born_notes[tok] = INPUTS_UNCHECKED + (f"; {born_notes[tok]}" if tok in born_notes else "")
        advice, note = ex.advice(top=ADVICE_TOP)
        return ReportFacts(
            catalog,
            info,
            ex.logits_strip(),
            ex.heatmap(VERDICT),
            born,
            advice,
            note,
            _commands(ex, catalog),
            origins,
            born_notes,
            ex.call_drift(),
        )
    finally:
        ex.close()


def _recorded(meta_text: Any) -> tuple[str | None, str | None]:
    """(command line, cwd) a dumper recorded in a run's manifest, shown as text only (never run here)."""
    try:
        meta = json.loads(meta_text) if isinstance(meta_text, str) else meta_text
    except ValueError:
        return None, None
    if not isinstance(meta, dict):
        return None, None
    for holder in (meta, meta.get("wb_manifest"), meta.get("exec")):
        if not isinstance(holder, dict):
            continue
        cmd = holder.get("command")
        cwd = holder.get("cwd") if isinstance(holder.get("cwd"), str) else meta.get("cwd")
        if isinstance(cmd, list) and cmd and all(isinstance(c, str) for c in cmd):
            exe = meta.get("executable")
            words = [exe, *cmd] if isinstance(exe, str) and cmd[0].endswith(".py") else cmd
            return shlex.join(words), cwd if isinstance(cwd, str) else None
        if isinstance(cmd, str) and cmd.strip():
            return cmd, cwd if isinstance(cwd, str) else None
    return None, None


def _commands(ex: Explorer, catalog: Path) -> list[tuple[str, str]]:
    info = ex.info
    out: list[tuple[str, str]] = []
    sides: tuple[Side, Side] = ("golden", "test")
    for side in sides:
        cmd, cwd = _recorded(ex.run_meta(side))
        if cmd:
            where = f" (in {cwd})" if cwd else ""
            out.append((f"the {side} dump, as its dumper recorded it{where}", cmd))
    out.append(
        (
            "the comparison",
            shlex.join(["wb", "compare", "-gp", info.golden_path, "-mp", info.test_path, "-o", str(catalog.parent)]),
        )
    )
    out.append(("the app on this catalog", shlex.join(["wb", "open", str(catalog)])))
    out.append(("this report", shlex.join(["wb", "report", str(catalog), "-o", "report.html"])))
    return out


# ---------------------------------------------------------------------------------------------- pictures
def heatmap_svg(hm: Heatmap, colours: dict[str, str]) -> str:
    """Token x layer heatmap: one rect per cell, coloured by severity level; x fails, ! NaN/Inf."""
    rows, cols = hm.values.shape if hm.values.ndim == 2 else (0, 0)
    cell = max(10, min(40, 900 // max(cols, 1)))  # few tokens: big cells; many: small ones
    label_w, head_h = 64, 22
    w, h = label_w + cols * cell + 4, head_h + rows * cell + 4
    parts = [
        f'<svg xmlns="http://www.w3.org/2000/svg" width="{w}" height="{h}" viewBox="0 0 {w} {h}" '
        'role="img" aria-label="verdict by token x layer" class="heatmap" font-family="monospace" font-size="11">'
    ]
    for j, tok in enumerate(hm.tokens):
        x = label_w + j * cell + cell / 2
        parts.append(f'<text x="{x:.0f}" y="{head_h - 6}" text-anchor="middle">{_e(tok)}</text>')
    sev = np.asarray(hm.values, dtype=np.float64)
    for i, label in enumerate(hm.row_labels):
        y = head_h + i * cell
        parts.append(f'<text x="{label_w - 6}" y="{y + cell / 2 + 4:.1f}" text-anchor="end">{_e(label)}</text>')
        for j, tok in enumerate(hm.tokens):
            v = float(sev[i, j])
            lv = -1 if math.isnan(v) else int(np.searchsorted(np.array(LEVEL_EDGES), v, side="right"))
            fill = colours["heat-none"] if lv < 0 else colours[f"heat-{lv}"]
            x = label_w + j * cell
            what = "not compared" if lv < 0 else f"severity {v:.3g}"
            if lv >= 0 and hm.from_statistics[i, j]:
                what = f"severity at least {v:.3g} (from max/min/mean/norm: a statistics-only pair)"
            fail = bool(hm.failed[i, j]) or lv >= PASS_LEVELS
            parts.append(
                f'<rect x="{x}" y="{y}" width="{cell - 1}" height="{cell - 1}" fill="{fill}" stroke="#d0d7de">'
                f"<title>{_e(label)}, token {_e(tok)}: {what}{' (fails)' if fail else ''}</title></rect>"
            )
            glyph = "!" if hm.nan_inf[i, j] else ("\u00d7" if fail and lv >= 0 else "")
            if glyph:
                ink = "#ffffff" if lv >= 5 else "#1f2328"
                parts.append(
                    f'<text x="{x + (cell - 1) / 2:.1f}" y="{y + cell / 2 + 4:.1f}" text-anchor="middle" fill="{ink}" '
                    f'font-weight="bold">{glyph}</text>'
                )
    parts.append("</svg>")
    return "".join(parts)


def logits_svg(cells: list[StripCell], colours: dict[str, str]) -> str:
    """The logits per token: a box per token coloured by its verdict, with KL, cosine and the top-1 ids."""
    box_w, box_h, gap = 150, 74, 8
    per_row = 6
    n = max(len(cells), 1)
    rows = math.ceil(n / per_row)
    w = min(n, per_row) * (box_w + gap) + gap
    h = rows * (box_h + gap) + gap
    parts = [
        f'<svg xmlns="http://www.w3.org/2000/svg" width="{w}" height="{h}" viewBox="0 0 {w} {h}" '
        'role="img" aria-label="logits per token" class="logits" font-family="monospace" font-size="11">'
    ]
    for k, c in enumerate(cells):
        x = gap + (k % per_row) * (box_w + gap)
        y = gap + (k // per_row) * (box_h + gap)
        colour = {True: colours["ok"], False: colours["fail"], None: colours["heat-none"]}[c.passed]
        verdict = {True: "pass", False: "FAIL", None: "not compared"}[c.passed]
        lines = [f"token {c.token}: {verdict}"]
        if c.on_statistics:  # max/min/mean/norm only: no KL or cosine to show
            lines.append("on statistics only")
        else:
            lines.append(f"KL {c.kl:.3g}" if c.kl is not None else "KL -")
            lines.append(f"cosine {c.cosine:.6g}" if c.cosine is not None else "cosine -")
        if c.golden_top1 is not None:
            lines.append(f"top-1 {c.golden_top1}/{c.test_top1}")
        if c.inputs_differ:
            lines.append(c.inputs_reason or "inputs differ")
        parts.append(
            f'<rect x="{x}" y="{y}" width="{box_w}" height="{box_h}" rx="4" fill="#ffffff" stroke="{colour}" '
            f'stroke-width="3"><title>{_e(c.describe(why=True))}</title></rect>'
        )
        for li, line in enumerate(lines[:5]):
            weight = ' font-weight="bold"' if li == 0 else ""
            parts.append(f'<text x="{x + 8}" y="{y + 16 + li * 13}"{weight}>{_e(line[:22])}</text>')
    parts.append("</svg>")
    return "".join(parts)


def legend_html(colours: dict[str, str], from_statistics: bool = False) -> str:
    """The severity levels' colours and what they mean (`from_statistics`: cells coloured by statistics only)."""
    edges = (0.0, *LEVEL_EDGES)
    items = []
    for i, lo in enumerate(edges):
        hi = f"{LEVEL_EDGES[i]:g}" if i < len(LEVEL_EDGES) else "\u221e"
        items.append(
            f'<span class="key"><span class="swatch" style="background:{colours[f"heat-{i}"]}"></span>'
            f"{lo:g}-{hi}</span>"
        )
    return (
        '<p class="legend">severity (1 = the pass/fail bound): '
        + " ".join(items)
        + ' <span class="key">\u00d7 fails</span> <span class="key">! NaN/Inf</span>'
        + (
            "<br>pairs compared on statistics only (max/min/mean/norm) are shaded by a lower bound of their "
            "relative euclidean distance: their error is at least what their colour says"
            if from_statistics
            else ""
        )
        + "</p>"
    )


# ---------------------------------------------------------------------------------------------- page
CSS = """
body { font-family: system-ui, sans-serif; color: #1f2328; background: #ffffff; margin: 2em; max-width: 1100px; }
h1 { font-size: 1.5em; } h2 { font-size: 1.2em; border-bottom: 1px solid #d0d7de; padding-bottom: .2em; }
th { white-space: nowrap; }
table { border-collapse: collapse; margin: .5em 0; } th, td { border: 1px solid #d0d7de; padding: .2em .5em;
  text-align: left; vertical-align: top; font-size: .9em; overflow-wrap: anywhere; }
table.advice, table.precheck { width: 100%; }
code, pre { font-family: monospace; font-size: .85em; } pre { background: #f6f8fa; padding: .5em; white-space: pre-wrap;
  word-break: break-all; }
.fail { color: #cf222e; font-weight: bold; } .pass { color: #1a7f37; }
.legend .key { margin-right: .8em; white-space: nowrap; }
.swatch { display: inline-block; width: 1em; height: 1em; vertical-align: middle; margin-right: .2em;
  border: 1px solid #d0d7de; }
@media print {
  body { margin: 0; max-width: none; }
  section { break-before: page; page-break-before: always; }
  section:first-of-type { break-before: auto; page-break-before: auto; }
  svg { max-width: 100%; height: auto; }
}
"""


def render(facts: ReportFacts) -> str:
    """The whole HTML document."""
    info = facts.info
    colours = palette()
    title = f"wb report: comparison {info.cmp_id} of {facts.catalog.name}"
    head = (
        f'{HEADER}\n<html lang="en"><head><meta charset="utf-8">'
        "<meta http-equiv=\"Content-Security-Policy\" content=\"default-src 'none'; style-src 'unsafe-inline'; "
        'img-src data:">'
        f"<title>{_e(title)}</title><style>{CSS}</style></head><body>"
    )
    out = [head, f"<h1>{_e(title)}</h1>", _summary(facts)]
    out.append(_section("verdict", "Verdict per token", _verdict_table(facts)))
    hm = facts.heatmap
    heat_body = (
        legend_html(colours, bool(hm.from_statistics.any())) + heatmap_svg(hm, colours)
        if hm.row_labels and hm.tokens
        else "<p>nothing compared: no heatmap</p>"
    )
    out.append(_section("heatmap", "Token x layer heatmap (verdict)", heat_body))
    logits_body = logits_svg(facts.strip, colours) if facts.strip else "<p>no logits were compared</p>"
    out.append(_section("logits", "Logits per token", logits_body))
    out.append(_section("advisor", f"The advisor's top {ADVICE_TOP} ops per token", _advice_table(facts)))
    out.append(_section("precheck", "Evidence under the verdict", _precheck(facts)))
    cmds = "".join(f"<h3>{_e(what)}</h3><pre>{_e(cmd)}</pre>" for what, cmd in facts.commands)
    note = (
        "<p>Recorded commands are shown as the dumps recorded them: read them before you run them; "
        "<code>wb redump</code> checks their signature.</p>"
    )
    out.append(_section("commands", "Commands that reproduce it", note + cmds))
    out.append("</body></html>\n")
    return "".join(out)


def _section(key: str, title: str, body: str) -> str:
    return f'<section id="{key}"><h2>{_e(title)}</h2>{body}</section>'


def _summary(facts: ReportFacts) -> str:
    info = facts.info
    rows = [
        ("catalog", str(facts.catalog)),
        ("golden", f"{info.golden_path} ({info.golden_kind})"),
        ("test", f"{info.test_path} ({info.test_kind}, {info.test_dtype or 'dtype unknown'})"),
        ("tokens", ", ".join(map(str, info.tokens)) or "none"),
        ("pairs compared", str(info.n_pairs)),
        ("verdict metrics", ", ".join(info.verdict_metrics()) or "none"),
    ]
    if info.thresholds_note:
        rows.append(("thresholds", info.thresholds_note))
    rows += [("calls made at some tokens", line) for line, _repaired in facts.call_drift]
    return (
        '<table class="summary">' + "".join(f"<tr><th>{_e(k)}</th><td>{_e(v)}</td></tr>" for k, v in rows) + "</table>"
    )


def _verdict_table(facts: ReportFacts) -> str:
    strip = {c.token: c for c in facts.strip}
    hm = facts.heatmap
    rows = []
    for tok in facts.info.tokens:
        c = strip.get(tok)
        if c is None or c.passed is None:
            logits = "<td>not compared</td>"
        else:
            word = ("statistics pass" if c.passed else "statistics FAIL") if c.on_statistics else None
            word = word or ("pass" if c.passed else "FAIL")
            logits = f'<td class="{"pass" if c.passed else "fail"}">{_e(word)}</td>'
        g, t, _ = facts.born.get(tok, (None, None, None))
        failing = tok in hm.tokens and bool(hm.failed[:, hm.tokens.index(tok)].any())
        if g:
            born = _e(g) + (f"<br><small>{_e(facts.born_notes[tok])}</small>" if tok in facts.born_notes else "")
        elif tok in facts.origins:
            born = _e(f"most likely origin: {facts.origins[tok]} (the advisor)")
        elif c is not None and c.inputs_differ:
            born = _e(f"none named: {c.inputs_reason or 'inputs differ'}")
        elif failing and facts.born.get(tok, (None, None, None))[2]:  # why none is born (`born.carried_across`)
            born = _e(f"none named: {facts.born[tok][2]}")
        elif failing:  # a run failing everywhere (or a quantized one) has no born op either
            born = "none named: outputs fail, but no op is born there and none stands out of the noise"
        else:
            born = "nothing: every compared output passes"
        test = _e(t) if t else ""
        rows.append(f"<tr><td>{_e(tok)}</td>{logits}<td>{born}</td><td>{test}</td></tr>")
    head = "<tr><th>token</th><th>logits</th><th>error born at (golden)</th><th>test op</th></tr>"
    return f'<table class="verdict">{head}{"".join(rows)}</table>'


def _advice_table(facts: ReportFacts) -> str:
    if not facts.advice:
        return f"<p>{_e(facts.advice_note)}</p>"
    head = "<tr><th>token</th><th>rank</th><th>golden op</th><th>test op</th><th>score</th><th>reason</th></tr>"
    rows = [
        f"<tr><td>{_e(a.token_id)}</td><td>{_e(a.rank)}</td><td>{_e(a.golden_node)}</td>"
        f"<td>{_e(a.test_node or '')}</td><td>{_e(f'{a.score:.3g}')}</td><td>{_e(a.reason)}</td></tr>"
        for a in facts.advice
    ]
    return f'<table class="advice">{head}{"".join(rows)}</table>'


def _precheck(facts: ReportFacts) -> str:
    rows = [
        f"<tr><td>{_e(tok)}</td><td>{_e(t or '')}</td><td>{_e(ev)}</td></tr>"
        for tok, (_, t, ev) in sorted(facts.born.items())
        if ev
    ]
    if not rows:
        return (
            "<p>no evidence beyond the metrics: no test op was re-run on its dumped inputs (precheck) and no "
            "selection born with its picks flipped, for this comparison</p>"
        )
    head = "<tr><th>token</th><th>test op</th><th>evidence</th></tr>"
    return f'<table class="precheck">{head}{"".join(rows)}</table>'


def write_report(catalog: Path, out: Path, cmp_id: int | None = None) -> ReportFacts:
    """Write the HTML report of `catalog`'s comparison (newest by default) to `out`: a new file, or one an earlier
    `wb report` wrote (`OwnedFolderError` otherwise; nothing is written then)."""
    check_replaceable(out, HEADER, "report")
    facts = collect(catalog, cmp_id)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(render(facts), encoding="utf-8")
    return facts
