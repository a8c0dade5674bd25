"""The one place where torch's own loader runs on a dumped file: `torch.load(weights_only=True)`, so a pickle
that would run code is refused, never executed. `arrays.py` calls it only for `.pth` files that are not plain
saved tensors; every failure is a `DumpError` naming the file and the reason.
"""

from __future__ import annotations

import pickle
import warnings
import zipfile

import torch

from workbench.formats.model import DumpError, check_shape
from workbench.formats.pth_header import check_repeat


def torch_load_pth(path: str, mmap: bool) -> torch.Tensor:
    """torch's weights-only loader on a file that is not a plain saved tensor; errors become `DumpError`."""
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")  # torch warns about pickle protocols before refusing them
            obj = torch.load(path, map_location="cpu", weights_only=True, mmap=mmap)
    except pickle.UnpicklingError as exc:
        lines = str(exc).splitlines()
        glob = next((ln.strip() for ln in lines if "GLOBAL" in ln or "Unsupported global" in ln), None)
        if glob is not None:
            raise DumpError(path, f"refused: the pickle would run code ({glob[:140]})") from None
        detail = next((ln.strip() for ln in lines if "Unsupported" in ln or "nvalid" in ln), "")
        raise DumpError(
            path, "refused: not a tensor file torch can load safely" + (f" ({detail[:120]})" if detail else "")
        ) from None
    except (
        RuntimeError,
        EOFError,
        zipfile.BadZipFile,
        ValueError,
        OSError,
        KeyError,
        IndexError,
        TypeError,
        AttributeError,
    ) as exc:
        text = str(exc).strip()
        msg = text.splitlines()[0] if text else type(exc).__name__
        raise DumpError(path, f"not a readable torch file ({msg[:160]})") from None
    if not isinstance(obj, torch.Tensor):
        raise DumpError(path, f"holds a {type(obj).__name__}, not a tensor")
    check_shape(path, tuple(int(d) for d in obj.shape), "tensor shape")
    stored = max(obj.untyped_storage().nbytes() // max(obj.element_size(), 1), 1)
    check_repeat(str(path), tuple(int(d) for d in obj.shape), obj.numel(), stored)
    return obj
