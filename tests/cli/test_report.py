"""`wb report`: the self-contained HTML file, parsed back and (where Chromium installs) rendered and printed."""

from __future__ import annotations

import re
import shutil
import subprocess
from html.parser import HTMLParser
from pathlib import Path

import duckdb
import pytest

from tests.conftest import invoke_wb, run_wb
from tests.fixtures.app_catalogs import DEFECT_ID
from workbench.analysis.explorer.explore import Explorer
from workbench.analysis.explorer.severity import VERDICT
from workbench.analysis.reporting.html_report import HEADER, SECTIONS


class Parsed(HTMLParser):
    """Tags, attributes, section ids and the text of each section."""

    def __init__(self) -> None:
        super().__init__()
        self.tags: list[tuple[str, dict[str, str | None]]] = []
        self.sections: list[str] = []
        self.text: dict[str, list[str]] = {}
        self._section = ""

    def handle_starttag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        a = dict(attrs)
        self.tags.append((tag, a))
        if tag == "section":
            self._section = str(a.get("id"))
            self.sections.append(self._section)

    def handle_data(self, data: str) -> None:
        self.text.setdefault(self._section, []).append(data)

    def count(self, tag: str, cls: str | None = None) -> int:
        return sum(1 for t, a in self.tags if t == tag and (cls is None or a.get("class") == cls))

    def section_text(self, key: str) -> str:
        return " ".join(self.text.get(key, []))


def _report(catalog: Path, out: Path) -> Parsed:
    res = run_wb("report", str(catalog), "-o", str(out))
    assert res.returncode == 0, res.stderr
    assert res.stdout.startswith(f"report: {out} (comparison "), res.stdout
    text = out.read_text(encoding="utf-8")
    assert text.splitlines()[0] == HEADER
    p = Parsed()
    p.feed(text)
    p.close()
    return p


def test_report_holds_every_section_with_the_apps_numbers(small_catalog: Path, tmp_path: Path) -> None:
    out = tmp_path / "r.html"
    p = _report(small_catalog, out)
    assert p.sections == list(SECTIONS)
    # self-contained: no script, no external resource, no link to anything
    assert p.count("script") == 0 and p.count("link") == 0 and p.count("img") == 0
    for _, attrs in p.tags:
        for k in ("src", "href"):
            assert k not in attrs, attrs
    ex = Explorer(small_catalog)
    try:
        hm = ex.heatmap(VERDICT)
        born = ex.born_all()
        origins = {t: ex.node_name("golden", ex.standing_out(t)) for t in ex.info.tokens}
        advice, _ = ex.advice(top=5)
        tokens = ex.info.tokens
    finally:
        ex.close()
    # the heatmap: one rect per cell of the app's own token x layer view, row labels as the app's
    assert p.count("svg", "heatmap") == 1
    assert p.count("rect") >= len(hm.row_labels) * len(tokens)
    heat_text = p.section_text("heatmap")
    for label in hm.row_labels:
        assert label in heat_text
    # the verdict: the op where the error is born at each token, else the advisor's op standing out, as the app
    # shows it
    verdict = p.section_text("verdict")
    assert any(origins[t] and not born.get(t) for t in tokens)  # the small catalog has a token of each kind
    for tok in tokens:
        name = born.get(tok)
        origin = f"most likely origin: {origins[tok]} (the advisor)" if origins[tok] else None
        assert (name or origin or "nothing: every compared output passes") in verdict
    assert "root.model.layers.1.down_proj" in verdict
    # the advisor's top ops with their reasons
    advisor = p.section_text("advisor")
    assert advice and all(a.reason in advisor for a in advice)
    assert "wb compare -gp" in p.section_text("commands")
    assert f"wb open {small_catalog}" in p.section_text("commands")


def test_report_escapes_what_came_from_a_dump(small_catalog: Path, tmp_path: Path) -> None:
    hostile = '<script>alert("x")</script><img src=x onerror=alert(1)>'
    con = duckdb.connect(str(small_catalog))
    try:
        con.execute("UPDATE nodes SET name = ? WHERE run_id = 1 AND node_id = ?", [hostile, DEFECT_ID])
    finally:
        con.close()
    out = tmp_path / "r.html"
    p = _report(small_catalog, out)
    assert p.count("script") == 0 and p.count("img") == 0
    assert hostile in p.section_text("verdict")  # shown as text, not markup
    assert "&lt;script&gt;" in out.read_text(encoding="utf-8")


def test_report_never_overwrites_a_file_it_did_not_write(small_catalog: Path, tmp_path: Path) -> None:
    out = tmp_path / "notes.html"
    out.write_text("<!DOCTYPE html><p>my notes</p>\n", encoding="utf-8")
    res = run_wb("report", str(small_catalog), "-o", str(out))
    assert res.returncode == 2
    assert res.stderr.strip().splitlines() == [
        f"wb: error: {out}: exists and is not an earlier `wb report` output; not overwritten (choose another name)"
    ]
    assert out.read_text(encoding="utf-8") == "<!DOCTYPE html><p>my notes</p>\n"
    own = tmp_path / "own.html"
    _report(small_catalog, own)
    _report(small_catalog, own)  # its own earlier report is replaced


def test_report_on_a_missing_or_broken_catalog_is_one_line(tmp_path: Path) -> None:
    res = invoke_wb("report", str(tmp_path / "none.duckdb"), "-o", str(tmp_path / "r.html"))
    assert res.returncode == 2 and len(res.stderr.strip().splitlines()) == 1, res.stderr
    assert "none.duckdb: no such catalog" in res.stderr
    bad = tmp_path / "bad.duckdb"
    bad.write_bytes(b"not a catalog at all" * 10)
    res = invoke_wb("report", str(bad), "-o", str(tmp_path / "r.html"))
    assert res.returncode == 2 and len(res.stderr.strip().splitlines()) == 1, res.stderr
    assert str(bad) in res.stderr and "Traceback" not in res.stderr
    assert not (tmp_path / "r.html").exists()


def test_report_takes_its_catalog_with_c_as_every_other_command(small_catalog: Path, tmp_path: Path) -> None:
    out = tmp_path / "r.html"
    res = invoke_wb("report", "-c", str(small_catalog), "-o", str(out))
    assert res.returncode == 0 and res.stdout.startswith(f"report: {out} (comparison "), res.stderr
    assert out.read_text(encoding="utf-8").startswith("<!DOCTYPE html>")
    both = invoke_wb("report", str(small_catalog), "-c", str(tmp_path / "other.duckdb"), "-o", str(out))
    assert both.returncode == 2
    assert both.stderr.strip().splitlines() == [
        f"wb: error: two catalogs given ({small_catalog} and -c {tmp_path / 'other.duckdb'}): give one"
    ]


CHROMIUM = shutil.which("chromium") or shutil.which("chromium-browser") or shutil.which("google-chrome")


@pytest.mark.skipif(CHROMIUM is None, reason="no headless Chromium installed here (apt-get install chromium)")
def test_report_renders_and_prints_one_page_per_section(small_catalog: Path, tmp_path: Path) -> None:
    out = tmp_path / "r.html"
    _report(small_catalog, out)
    flags = [
        str(CHROMIUM),
        "--headless",
        "--no-sandbox",
        "--disable-gpu",
        "--no-first-run",
        "--disable-background-networking",
        f"--user-data-dir={tmp_path / 'profile'}",
    ]
    png, pdf = tmp_path / "shot.png", tmp_path / "r.pdf"
    subprocess.run(
        [*flags, f"--screenshot={png}", "--window-size=1200,1600", out.as_uri()], capture_output=True, timeout=180
    )
    subprocess.run(
        [*flags, "--no-pdf-header-footer", f"--print-to-pdf={pdf}", out.as_uri()], capture_output=True, timeout=180
    )
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n" and png.stat().st_size > 10_000
    pages = len(re.findall(rb"/Type\s*/Page[^s]", pdf.read_bytes()))
    assert pages >= len(SECTIONS), pages  # @media print: each section starts a page


@pytest.mark.parametrize(("defect", "scheme"), [(None, "w8a16"), ("act_clip", "w8a8")])
def test_report_verdict_on_a_quantized_run_is_the_summarys(tmp_path: Path, defect: str | None, scheme: str) -> None:
    """The verdict column said `nothing: every compared output passes` at tokens where every quantized linear fails
    and `wb compare` names the op beyond its int8 noise (act_clip) or none (a clean run)."""
    from workbench.demo import make_demo
    from workbench.jobs.compare import run_compare

    plan = make_demo(tmp_path / "demo", stack="quant", defect=defect, scheme=scheme, log=lambda _s: None)
    catalog = tmp_path / "demo" / "catalog.duckdb"
    run_compare(plan.golden, plan.test, catalog, workers=1)
    verdict = _report(catalog, tmp_path / "r.html").section_text("verdict")
    assert "every compared output passes" not in verdict, verdict
    if defect is None:
        assert verdict.count("none named: outputs fail, but no op is born there and none stands out") == 4, verdict
    else:
        assert verdict.count("most likely origin: root.model.layers.2.mlp.down_proj (the advisor)") == 4, verdict
