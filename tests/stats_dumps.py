"""Statistics-only (and full) dumps of the tiny Llama by msit's and msprobe's own dumpers, each in a fresh process.

msit's `DumpConfig` is a process-wide singleton and msprobe's debugger is global, so each dump runs in its own
subprocess: `python -m tests.stats_dumps TOOL MODE OUT [--bf16] [--scale F] [--forced 1,2,3]`.
TOOL: `msit` or `msprobe`; MODE: `stats` (msit `dump_statistics_mode=1`, msprobe `task=statistics`) or `full`.
`--scale F` multiplies layer 1's `down_proj` output by F (a planted defect); `--weight MODULE=F` multiplies that
module's weight by F before the cast (`model.layers.1.mlp.down_proj=1.03`). The last line printed is the
generated ids.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
from pathlib import Path

import duckdb

ROOT = Path(__file__).resolve().parents[1]
STEPS = 3


def compare(golden: Path, test: Path, out: Path) -> tuple[str, duckdb.DuckDBPyConnection]:
    """`wb compare` as a subprocess; its stdout and the catalog it wrote (read-only)."""
    from tests.conftest import run_wb

    proc = run_wb("compare", "-gp", str(golden), "-mp", str(test), "-o", str(out))
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-2000:]
    return proc.stdout, duckdb.connect(str(out / "catalog.duckdb"), read_only=True)


def verdict_counts(con: duckdb.DuckDBPyConnection) -> tuple[int, int, int, int]:
    """Pairs: all, judged on statistics, without a verdict, failed."""
    row = con.execute(
        "SELECT count(*), count(*) FILTER (WHERE on_statistics), count(*) FILTER (WHERE passed IS NULL), "
        "count(*) FILTER (WHERE passed = false) FROM comparison"
    ).fetchone()
    assert row is not None
    return int(row[0]), int(row[1]), int(row[2]), int(row[3])


def born(con: duckdb.DuckDBPyConnection, what: str = "n.name") -> set[str | None]:
    """`what` of every golden node where an error is born, over the catalog's comparisons."""
    rows = con.execute(
        f"SELECT {what} FROM error_born e JOIN comparisons c USING (cmp_id) "
        "LEFT JOIN nodes n ON n.run_id = c.golden_run AND n.node_id = e.golden_node_id"
    ).fetchall()
    return {r[0] for r in rows}


def dump(
    tool: str,
    mode: str,
    out: Path,
    *,
    bf16: bool = False,
    scale: float = 1.0,
    forced: list[int] | None = None,
    weight: str = "",
) -> list[int]:
    """Run the peer's dumper in a subprocess; returns the generated ids."""
    args = [sys.executable, "-m", "tests.stats_dumps", tool, mode, str(out), "--scale", str(scale)]
    args += ["--weight", weight] if weight else []
    args += ["--bf16"] if bf16 else []
    args += ["--forced", ",".join(map(str, forced))] if forced else []
    proc = subprocess.run(
        args, capture_output=True, text=True, cwd=ROOT, env={**os.environ, "PYTHONPATH": str(ROOT)}, timeout=300
    )
    if proc.returncode != 0:
        raise RuntimeError(f"{tool} {mode} dump failed:\n{proc.stdout[-2000:]}\n{proc.stderr[-3000:]}")
    return [int(x) for x in json.loads(proc.stdout.strip().splitlines()[-1])]


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("tool", choices=["msit", "msprobe"])
    parser.add_argument("mode", choices=["stats", "full"])
    parser.add_argument("out")
    parser.add_argument("--bf16", action="store_true")
    parser.add_argument("--scale", type=float, default=1.0)
    parser.add_argument("--forced", default="")
    parser.add_argument("--weight", default="")
    ns = parser.parse_args()
    import torch

    from tests.conftest import tiny_llama
    from workbench.demo import decode

    model = tiny_llama()
    if ns.scale != 1.0:
        model.model.layers[1].mlp.down_proj.register_forward_hook(lambda _m, _i, o: o * ns.scale)
    if ns.weight:
        name, factor = ns.weight.split("=")
        with torch.no_grad():
            model.get_submodule(name).weight.mul_(float(factor))
    if ns.bf16:
        model = model.to(torch.bfloat16)
    prompt = torch.randint(3, 256, (1, 8), generator=torch.Generator().manual_seed(3))
    forced = [int(x) for x in ns.forced.split(",")] if ns.forced else None
    out = Path(ns.out)
    out.mkdir(parents=True, exist_ok=True)
    if ns.tool == "msit":
        import logging

        from msit_llm import DumpConfig, register_hook

        logging.getLogger("msit_logger").disabled = True
        mode = 1 if ns.mode == "stats" else 0
        register_hook(model, DumpConfig(dump_path=str(out), token_range=list(range(STEPS)), dump_statistics_mode=mode))
        tokens = decode(model, prompt, STEPS, forced)
    else:
        from msprobe.pytorch import PrecisionDebugger

        task = "statistics" if ns.mode == "stats" else "tensor"
        config = out / "msprobe_config.json"
        body = {"scope": [], "list": [], "data_mode": ["all"]}
        config.write_text(
            json.dumps(
                {"task": task, "dump_path": str(out / "dump"), "rank": [], "step": [], "level": "mix", task: body}
            )
        )
        debugger = PrecisionDebugger(config_path=str(config), dump_path=str(out / "dump"))
        debugger.start(model=model)
        tokens = decode(model, prompt, STEPS, forced)
        debugger.stop()
        debugger.step()
    print(json.dumps(tokens))


if __name__ == "__main__":
    main()
