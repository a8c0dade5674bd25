"""Speed of `open_dump` on generated dumps of ~3000 tensor files (target: < 2 s each).

Cases: an msit torch dump without manifest (headers + data-flow hashing of token 0), the same with
our `wb_manifest.json` (headers only), and an ATB dump (`.bin` headers). The reference, measured in
the same run, is what msit does before comparing: read every file of the dump completely
(`torch.load` / whole `.bin` read). Prints seconds and the ratio reference/ours (higher is better).

    PYTHONPATH=. .venv/bin/python bench/bench_formats_open.py [--files 3000] [--numel 4096]
"""

from __future__ import annotations

import argparse
import json
import os
import tempfile
import time
from pathlib import Path

import numpy as np
import torch

from workbench.formats import atb_bin, open_dump


def make_torch_dump(dev: Path, n_files: int, numel: int, tokens: int = 2) -> list[str]:
    """A chain of Linear-like modules in 2 tokens: input_0 = previous output; 3 files per module call."""
    per_token = n_files // tokens
    n_layers = max(1, per_token // 12)  # 4 modules per layer (layer, norm, attn, mlp), 3 files each
    children = []
    names: list[str] = ["root"]
    for i in range(n_layers):
        base = f"root.layers.{i}"
        names.append(base)
        kids = [f"{base}.{k}" for k in ("norm", "attn", "mlp")]
        names.extend(kids)
        children.append(
            {"name": base, "type": "Block", "children": [{"name": k, "type": "Op", "children": []} for k in kids]}
        )
    dev.mkdir(parents=True)
    (dev / "model_tree.json").write_text(json.dumps({"name": "root", "type": "Net", "children": children}))
    gen = torch.Generator().manual_seed(0)
    for tok in range(tokens):
        x = torch.randn(numel, generator=gen)
        for name in names[1:]:
            folder = dev / str(tok) / name
            folder.mkdir(parents=True)
            y = x * 0.5 + 1
            torch.save(x, folder / "input_0.pth")
            torch.save(torch.ones(8), folder / "input_1.pth")
            torch.save(y, folder / "output.pth")
            x = y
    return names


def make_atb_dump(dev: Path, n_files: int, numel: int, tokens: int = 2) -> None:
    per_token = n_files // tokens
    n_layers = max(1, per_token // 12)
    rng = np.random.default_rng(0)
    payload = rng.standard_normal(numel).astype(np.float16)
    for tok in range(tokens):
        for i in range(n_layers):
            for j, op in enumerate(
                ("RmsNormOperation", "LinearOperation", "SelfAttentionOperation", "ElewiseOperation")
            ):
                folder = dev / str(tok) / f"{i}_Decoder_layer" / f"{j}_{op}"
                (folder / "before").mkdir(parents=True)
                (folder / "after").mkdir()
                (folder / "op_param.json").write_text("{}")
                atb_bin.write_bin(folder / "before" / "intensor0.bin", payload, "float16")
                atb_bin.write_bin(folder / "before" / "intensor1.bin", payload[:8], "float16")
                atb_bin.write_bin(folder / "after" / "outtensor0.bin", payload, "float16")


def read_everything(root: Path) -> int:
    n = 0
    for dirpath, _dirs, files in os.walk(root):
        for f in files:
            p = os.path.join(dirpath, f)
            if f.endswith(".pth"):
                torch.load(p, weights_only=True)
                n += 1
            elif f.endswith(".bin"):
                with open(p, "rb") as fh:
                    fh.read()
                n += 1
    return n


def timed(fn, repeat: int) -> float:  # type: ignore[no-untyped-def]
    best = float("inf")
    for _ in range(repeat):
        t = time.perf_counter()
        fn()
        best = min(best, time.perf_counter() - t)
    return best


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--files", type=int, default=3000)
    ap.add_argument("--numel", type=int, default=4096, help="elements per activation tensor")
    ap.add_argument("--repeat", type=int, default=3)
    args = ap.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        base = Path(tmp)
        torch_dev = base / "t" / "torch_tensors" / "cpu_1"
        names = make_torch_dump(torch_dev, args.files, args.numel)
        man_dev = base / "m" / "torch_tensors" / "cpu_1"
        make_torch_dump(man_dev, args.files, args.numel)
        (man_dev / "wb_manifest.json").write_text(
            json.dumps({"format": "wb-dump", "version": 1, "exec_order": {"0": names}})
        )
        atb_dev = base / "a" / "tensors" / "0_1"
        make_atb_dump(atb_dev, args.files, args.numel)
        for label, path in (
            ("msit torch, data-flow order", torch_dev),
            ("msit torch, manifest", man_dev),
            ("ATB .bin", atb_dev),
        ):
            d = open_dump(path)
            assert not d.problems, d.problems[:3]
            ours = timed(lambda p=path: open_dump(p), args.repeat)
            ref = timed(lambda p=path: read_everything(p), args.repeat)
            print(
                f"{label:30s} {len(d.tensors):5d} files  open_dump {ours:6.3f} s  "
                f"read-all reference {ref:6.3f} s  ratio {ref / ours:5.2f}x  ({d.order_source})"
            )


if __name__ == "__main__":
    main()
