"""Pairs computed while the catalog is still being prepared.

Between reading the dumps and knowing the pairs, the main process imports DuckDB and the compare modules,
ingests both dumps and matches their nodes: about a second in which the workers would wait. For
two dumps of the same kind, nearly every pair the matcher will find is a tensor at the same place in
both (same token, node, role and index), so those are handed to the pool as soon as both dumps are
read. `compute_pending` later claims the results of the pairs it really wants (by the files they
read) and the rest are dropped. Nothing here imports DuckDB or torch.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Collection
from concurrent.futures import Future, ProcessPoolExecutor
from dataclasses import replace
from typing import Any

from workbench.compare.execution.pool import PoolStarter
from workbench.compare.execution.tasks import PairTask, Twin, batches, file_identity, tensor_bytes
from workbench.compare.execution.worker import prepare_kernel, run_batch
from workbench.compare.judging.kernel_code import pair_entry
from workbench.formats.model import Dump, TensorEntry, canonical_dtype

PairKey = tuple[tuple[int, int], tuple[int, int], str | None, str | None]  # files, test dtype, transform
# a kernel entry loads from its file in milliseconds: one still being prepared after this long is being compiled
_COMPILING_AFTER_S = 0.5


class EarlyPairs:
    """Same-place pairs of two dumps of one kind, submitted to the pool from a background thread."""

    def __init__(
        self, golden: Dump, test: Dump, pool: ProcessPoolExecutor | PoolStarter, tokens: Collection[int] | None = None
    ) -> None:
        self.keys: dict[int, PairKey] = {}  # early id -> the files it compares
        self.ids: dict[PairKey, int] = {}
        # submitted and not yet taken, with their ids (a taken batch is forgotten: its Future holds its results)
        self.batches: dict[Future[list[dict[str, Any]]], list[int]] = {}
        self._submitted_ids: set[int] = set()
        self.taken = 0  # results handed to the catalog (counted by the pipeline)
        self.twins = 0  # pairs riding along with a pair of equal content digests (checked byte for byte)
        self._submitted = threading.Event()
        self.kernels: set[tuple[str, tuple[str, ...]]] = set()  # the kernel entries the pairs run
        self._preparing: list[Future[bool]] = []
        self._prepare_asked = 0.0
        tasks, sizes = self._plan(golden, test, tokens)
        threading.Thread(target=self._submit, args=(pool, tasks, sizes), name="wb-early-pairs", daemon=True).start()

    def _plan(self, golden: Dump, test: Dump, tokens: Collection[int] | None) -> tuple[list[PairTask], list[int]]:
        wanted = None if tokens is None else set(tokens)
        by_place = {(t.token, t.node, t.role, t.index): t for t in test.tensors if t.path and not t.error}
        tasks: list[PairTask] = []
        sizes: list[int] = []
        by_digest: dict[tuple[bytes, bytes], int] = {}  # (golden, test) content digests -> index in tasks
        for g in golden.tensors:
            if not g.path or g.error or (wanted is not None and g.token not in wanted):
                continue
            t = by_place.get((g.token, g.node, g.role, g.index))
            if t is None or t.path is None:
                continue
            g_id, t_id = _identity(g), _identity(t)
            if g_id is None or t_id is None:
                continue
            key: PairKey = (g_id, t_id, t.dtype, None)
            if key in self.ids:
                continue
            early_id = len(self.keys)
            self.keys[early_id], self.ids[key] = key, early_id
            nbytes = tensor_bytes(_numel(g.shape), g.dtype) + tensor_bytes(_numel(t.shape), t.dtype)
            first = by_digest.get((g.digest, t.digest)) if g.digest and t.digest else None
            if first is not None:
                # msit-made dumps save a tensor once per module that sees it (a layer's output is the next
                # layer's input): one metric pass, and a byte check (~10x cheaper) per twin
                twin = Twin(early_id, g.path, t.path, g.payload, t.payload)
                tasks[first] = replace(tasks[first], twins=(*tasks[first].twins, twin))
                sizes[first] += nbytes // 8
                self.twins += 1
                continue
            if g.digest and t.digest:
                by_digest[(g.digest, t.digest)] = len(tasks)
            tasks.append(PairTask(early_id, g.path, t.path, t.dtype, -1, -1, golden_at=g.payload, test_at=t.payload))
            sizes.append(nbytes)
            self.kernels.add(pair_entry(canonical_dtype(g.dtype), canonical_dtype(t.dtype)))
        return tasks, sizes

    def _submit(self, pool: ProcessPoolExecutor | PoolStarter, tasks: list[PairTask], sizes: list[int]) -> None:
        try:
            executor = pool.get() if isinstance(pool, PoolStarter) else pool
            if executor is not None:
                # each entry on a worker of its own, before the pairs that wait for it (the first compare after an
                # install compiles them at once instead of in turn; otherwise a task that returns at once)
                self._prepare_asked = time.monotonic()
                self._preparing = [executor.submit(prepare_kernel, entry) for entry in sorted(self.kernels)]
                for batch in batches(tasks, sizes):
                    ids = [i for t in batch for i in (t.pair_id, *(tw[0] for tw in t.twins))]
                    self.batches[executor.submit(run_batch, batch)] = ids
                    self._submitted_ids.update(ids)
        except RuntimeError:  # the pool was shut down meanwhile: nothing was computed early
            pass
        finally:
            self._submitted.set()

    @property
    def futures(self) -> list[Future[list[dict[str, Any]]]]:
        return list(self.batches)

    def compiling_kernels(self) -> bool:
        """Whether a kernel entry its pairs run is still being prepared well after it was asked for: being compiled
        (the first compare after an install, ~3 s)."""
        if not self._preparing or time.monotonic() - self._prepare_asked < _COMPILING_AFTER_S:
            return False
        return not all(f.done() for f in self._preparing)

    def wait_submitted(self) -> None:
        """Wait until the background thread has handed every batch to the pool (or given up)."""
        self._submitted.wait()

    def has(self, key: PairKey) -> bool:
        """Whether the pair reading these files was submitted (call `wait_submitted` first)."""
        early_id = self.ids.get(key)
        return early_id is not None and early_id in self._submitted_ids

    def keep_only(self, claimed: Collection[PairKey]) -> list[Future[list[dict[str, Any]]]]:
        """Cancel the batches none of whose pairs is claimed (an incremental re-run claims nothing); returns
        the futures still wanted."""
        wanted_ids = {self.ids[k] for k in claimed if k in self.ids}
        kept = []
        for future, ids in self.batches.items():
            if wanted_ids.intersection(ids):
                kept.append(future)
            else:
                future.cancel()
        return kept

    def release(self, future: Future[list[dict[str, Any]]]) -> None:
        """Forget a batch whose results were taken: kept, every early result (one dict per pair) would stay in
        memory until the compare ends (~1 KB a pair)."""
        self.batches.pop(future, None)

    def cancel(self) -> None:
        """Cancel every batch not taken and forget them all (with the results of those already done)."""
        self.wait_submitted()
        for future in self.batches:
            future.cancel()
        self.batches.clear()

    def drop(self) -> None:
        """`cancel`, and forget which files each early pair compares: for a compare that takes no early result
        (one early pair per tensor pair: ~0.6 KB each)."""
        self.cancel()
        self.keys.clear()
        self.ids.clear()
        self._submitted_ids.clear()


def _numel(shape: tuple[int, ...] | None) -> int:
    n = 1
    for d in shape or ():
        n *= d
    return n


def _identity(tensor: TensorEntry) -> tuple[int, int] | None:
    """(device, inode) of a tensor's file: as its reader saw it where it parsed the header, else asked now."""
    return tensor.payload.file_key[:2] if tensor.payload is not None else file_identity(tensor.path)
