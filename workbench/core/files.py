"""File and folder names `wb` writes or looks for: one home for each."""

from __future__ import annotations

from importlib import resources
from pathlib import Path

CATALOG_NAME = "catalog.duckdb"  # the catalog inside an output folder (`wb compare -o OUT`)
DEFAULT_OUTPUT = "wb_out"  # default output folder of `wb compare` / `wb open`
DEFAULT_CATALOG = f"{DEFAULT_OUTPUT}/{CATALOG_NAME}"  # default catalog of `wb query`, `wb ingest`, `wb advise`
MANIFEST_NAME = "wb_manifest.json"  # our dumper's record of order, command and run facts
MODEL_TREE_NAME = "model_tree.json"  # msit's module tree
ATB_PROBE_STATS_FILE = "statistic.csv"  # msprobe's ATB probe: one per execution-count folder
ATB_PROBE_DUMP_DIR = "atb_dump_data"  # msprobe's ATB probe: the folder its `--output` holds
REDUMP_ENV = "WB_REDUMP"  # JSON that `wb redump` hands the re-run: DumpConfig fields it overrides
EXEC_DUMP_ENV = "WB_EXEC_DUMP"  # JSON that `wb dump --exec` hands the script: the DumpConfig to hook its model with


def package_data(*parts: str) -> Path:
    """A file or folder of `workbench/data/`, wherever the package is (a source checkout, an editable install,
    an installed wheel). `data/queries` and `data/themes` are links to the top-level `queries/` and `themes/`
    folders; a wheel holds copies of them."""
    return Path(str(resources.files("workbench").joinpath("data", *parts)))
