"""Tensor-parallel runs of the ATB-structured Llama: N ranks in one process, dumped one folder per device.

Each rank (`AtbLlama.shard`) runs in its own thread; the ranks meet at every communication op through
`ThreadComm`, which sums (all-reduce) or stacks (all-gather) their tensors in rank order, so every rank
gets the same bits and a run is deterministic. The dump is what N processes on N devices would write
into one `msit_dump_*` folder: `tensors/{rank}_{pid}` per rank (the device id is the rank, as msit's
opcheck assumes), each with its own `model/{pid}` and `layer/{pid}` topology; rank r is named with pid
`os.getpid() + r`, standing for its own process. The manifest (`wb_manifest.json`) is rank 0's.
"""

from __future__ import annotations

import os
import threading
from dataclasses import replace
from pathlib import Path

import torch

from workbench.backends.atb_dump import AtbDumpConfig
from workbench.backends.atb_llama import AtbLlama, AtbRun
from workbench.backends.defects import Defect

BARRIER_TIMEOUT_S = 300.0


class ThreadComm:
    """The collectives of `size` ranks running in threads of one process."""

    def __init__(self, size: int, timeout: float = BARRIER_TIMEOUT_S) -> None:
        if size < 2:
            raise ValueError(f"tensor parallel {size}: needs 2 or more ranks")
        self.size = size
        self._barrier = threading.Barrier(size, timeout=timeout)
        self._slots: list[torch.Tensor | None] = [None] * size

    def _exchange(self, rank: int, x: torch.Tensor) -> list[torch.Tensor]:
        self._slots[rank] = x
        self._barrier.wait()
        got = [t for t in self._slots if t is not None]
        self._barrier.wait()  # nobody refills a slot before every rank has read them all
        if len(got) != self.size:
            raise RuntimeError("a rank did not contribute to a collective")
        return got

    def all_reduce(self, rank: int, x: torch.Tensor, scales: dict[int, float] | None = None) -> torch.Tensor:
        """Sum of every rank's `x` (accumulated in fp32 in rank order, one rounding to `x`'s dtype);
        `scales` multiplies given ranks' contributions (a planted defect)."""
        parts = self._exchange(rank, x)
        acc = torch.zeros(x.shape, dtype=torch.float32)
        for k, part in enumerate(parts):
            s = 1.0 if scales is None else scales.get(k, 1.0)
            if s != 0.0:
                acc += part.float() * s
        return acc.to(x.dtype)

    def all_gather(self, rank: int, x: torch.Tensor) -> torch.Tensor:
        """Every rank's `x` stacked in rank order: `[size, *x.shape]`."""
        return torch.stack(self._exchange(rank, x))

    def abort(self) -> None:
        """Release the ranks waiting at a collective (another rank failed)."""
        self._barrier.abort()


def shard_ranks(model: AtbLlama, size: int, defect: Defect | None = None) -> list[AtbLlama]:
    """The `size` ranks of an unsplit model, sharing one communicator."""
    comm = ThreadComm(size)
    return [model.shard(r, size, comm, defect) for r in range(size)]


def run_tp(
    ranks: list[AtbLlama],
    input_ids: torch.Tensor,
    max_new_tokens: int,
    *,
    dump: AtbDumpConfig | None = None,
    forced: list[int] | None = None,
    follow_tokens: str | Path | None = None,
) -> AtbRun:
    """Run every rank (greedy decoding, as `AtbLlama.run`), optionally dumped into one `msit_dump_*` folder
    with a `tensors/{rank}_{pid}` folder per rank. Returns rank 0's run (every rank has the same logits)."""
    if len(ranks) < 2 or [m.tp_rank for m in ranks] != list(range(len(ranks))):
        raise ValueError("run_tp needs the ranks 0..N-1 of one tensor-parallel model (shard_ranks)")
    comm = ranks[0].comm
    assert isinstance(comm, ThreadComm)
    configs: list[AtbDumpConfig | None] = [None] * len(ranks)
    if dump is not None:
        import time

        base = Path(dump.dump_path)
        stamp = time.strftime("%Y%m%d_%H%M%S")
        root = base / f"msit_dump_{stamp}"
        n = 1
        while root.exists():
            root = base / f"msit_dump_{stamp}_{n}"
            n += 1
        root.mkdir(parents=True)
        pid = os.getpid()
        configs = [replace(dump, dump_root=root, device_id=r, pid=pid + r) for r in range(len(ranks))]
    results: list[AtbRun | None] = [None] * len(ranks)
    errors: list[BaseException | None] = [None] * len(ranks)

    def work(r: int) -> None:
        try:
            results[r] = ranks[r].run(
                input_ids, max_new_tokens, dump=configs[r], forced=forced, follow_tokens=follow_tokens
            )
        except BaseException as exc:  # handed to the caller's thread below
            errors[r] = exc
            comm.abort()

    threads = [threading.Thread(target=work, args=(r,), name=f"tp-rank-{r}") for r in range(len(ranks))]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    first = next((e for e in errors if e is not None and not isinstance(e, threading.BrokenBarrierError)), None)
    if first is None:
        first = next((e for e in errors if e is not None), None)
    if first is not None:
        raise first
    out = results[0]
    assert out is not None
    return out
