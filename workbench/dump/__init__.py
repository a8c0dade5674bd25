"""msit-compatible torch dumper: `DumpConfig`, `register_hook`, `seed_all`.

from workbench.dump import DumpConfig, register_hook
handle = register_hook(model, DumpConfig(dump_path="/tmp/golden", token_range=[0, 1]))
model.generate(...)
handle.remove()
"""

from workbench.dump.config import DumpConfig, DumpConfigError
from workbench.dump.hooks import DumpHandle, register_hook
from workbench.dump.manifest import MANIFEST_NAME, MODEL_TREE_NAME, model_tree
from workbench.dump.seed import seed_all

__all__ = [
    "MANIFEST_NAME",
    "MODEL_TREE_NAME",
    "DumpConfig",
    "DumpConfigError",
    "DumpHandle",
    "model_tree",
    "register_hook",
    "seed_all",
]
