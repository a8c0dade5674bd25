"""The torch dumper on a tiny Hugging Face Llama: msit's layout, our manifest, filters, statistics, removal."""

from __future__ import annotations

import csv
import json
import os
import re
import time
from pathlib import Path

import pytest
import torch
from torch import nn
from transformers import LlamaForCausalLM
from transformers.models.llama.modeling_llama import LlamaMLP, LlamaRMSNorm

from tests.fixtures.tiny_models import tiny_llama
from workbench.dump import DumpConfig, DumpConfigError, model_tree, register_hook
from workbench.formats.model import DumpError

PROMPT = 7
NEW = 3


@pytest.fixture(scope="module")
def llama() -> LlamaForCausalLM:
    return tiny_llama(0, kv_heads=4, max_positions=64)


@pytest.fixture(scope="module")
def prompt() -> torch.Tensor:
    return torch.randint(0, 256, (1, PROMPT), generator=torch.Generator().manual_seed(1))


def generate(model: LlamaForCausalLM, ids: torch.Tensor, **cfg: object) -> tuple[Path, object]:
    handle = register_hook(model, DumpConfig(**cfg))
    out = model.generate(
        ids,
        max_new_tokens=NEW,
        min_new_tokens=NEW,
        do_sample=False,
        pad_token_id=0,
        output_logits=True,
        return_dict_in_generate=True,
    )
    handle.remove()
    assert handle.dump_dir is not None
    return handle.dump_dir, out


def load(path: Path) -> torch.Tensor:
    obj = torch.load(path, weights_only=True)
    assert isinstance(obj, torch.Tensor)
    return obj


def files(folder: Path) -> set[str]:
    return {p.name for p in folder.iterdir()}


@pytest.fixture(scope="module")
def full_dump(llama: LlamaForCausalLM, prompt: torch.Tensor, tmp_path_factory: pytest.TempPathFactory):
    root = tmp_path_factory.mktemp("full")
    dump_dir, out = generate(llama, prompt, dump_path=root, token_range=[0, 1, 2], dump_statistics_mode=2)
    return root, dump_dir, out


def test_layout_is_msits(full_dump, llama: LlamaForCausalLM) -> None:
    root, dump_dir, _ = full_dump
    rel = dump_dir.relative_to(root).as_posix()
    assert re.fullmatch(rf"msit_dump_\d{{8}}_\d{{6}}/torch_tensors/cpu_{os.getpid()}", rel)
    assert {p.name for p in dump_dir.iterdir()} == {"model_tree.json", "wb_manifest.json", "0", "1", "2"}
    assert files(dump_dir / "0" / "root.model.layers.0.mlp.down_proj") == {
        "input_0.pth",
        "output.pth",
        "statistics.csv",
    }
    # a decoder layer returns one tensor: output.pth; its cos/sin tuple kwarg nests as msit nests tuples
    layer = files(dump_dir / "0" / "root.model.layers.1")
    assert {"input_0.pth", "output.pth", "input_1_0.pth", "input_1_1.pth"} <= layer
    # model_tree.json: msit's shape, definition order, exactly json.dump's bytes
    text = (dump_dir / "model_tree.json").read_text()
    assert text == json.dumps(model_tree(llama))
    tree = json.loads(text)
    assert (tree["name"], tree["type"]) == ("root", "LlamaForCausalLM")
    assert [c["name"] for c in tree["children"]] == ["root.model", "root.lm_head"]
    layer0 = tree["children"][0]["children"][1]["children"][0]
    assert [c["name"].rsplit(".", 1)[1] for c in layer0["children"]] == [
        "self_attn",
        "mlp",
        "input_layernorm",
        "post_attention_layernorm",
    ]


def test_tensors_read_back_and_match_the_run(full_dump, llama: LlamaForCausalLM) -> None:
    _, dump_dir, out = full_dump
    tok0 = dump_dir / "0"
    # logits from a ModelOutput (msit drops it): root/output_0.pth, last position = generate's logits
    logits = load(tok0 / "root" / "output_0.pth")
    torch.testing.assert_close(logits[0, -1], out.logits[0][0])
    torch.testing.assert_close(load(dump_dir / "2" / "root.lm_head" / "output.pth")[0, -1], out.logits[2][0])
    # an input passed by keyword (hidden_states to self_attn) is captured: it is input_layernorm's output
    norm_out = load(tok0 / "root.model.layers.0.input_layernorm" / "output.pth")
    torch.testing.assert_close(load(tok0 / "root.model.layers.0.self_attn" / "input_0.pth"), norm_out)
    torch.testing.assert_close(load(tok0 / "root.model.layers.0.self_attn.q_proj" / "input_0.pth"), norm_out)
    q = load(tok0 / "root.model.layers.0.self_attn.q_proj" / "output.pth")
    weight = llama.model.layers[0].self_attn.q_proj.weight.detach()
    torch.testing.assert_close(q, norm_out @ weight.T)
    assert q.shape == (1, PROMPT, 64)
    assert load(dump_dir / "1" / "root.model.layers.0.self_attn.q_proj" / "output.pth").shape == (1, 1, 64)


def test_manifest(full_dump) -> None:
    _, dump_dir, _ = full_dump
    man = json.loads((dump_dir / "wb_manifest.json").read_text())
    assert (man["format"], man["version"], man["tokens"]) == ("wb-dump", 1, [0, 1, 2])
    order = man["exec_order"]["0"]
    assert order[:4] == ["root", "root.model", "root.model.embed_tokens", "root.model.rotary_emb"]
    assert order.index("root.model.layers.0.self_attn") < order.index("root.model.layers.0.self_attn.q_proj")
    assert order.index("root.model.layers.1") > order.index("root.model.layers.0.mlp.down_proj")
    assert man["exec_order"]["1"] == order
    attn = man["kwargs_inputs"]["0"]["root.model.layers.0.self_attn"]
    assert attn["0"] == "hidden_states" and "position_embeddings" in attn.values()
    assert man["kwargs_inputs"]["0"]["root.model.layers.0"]["1"] == "position_embeddings"
    assert man["output_fields"]["0"]["root"] == {"0": "logits"}
    assert man["output_fields"]["0"]["root.model"] == {"0": "last_hidden_state"}
    assert man["model_class"].endswith("LlamaForCausalLM")
    assert (man["dtype"], man["device"]) == ("float32", "cpu")
    assert man["config"]["token_range"] == [0, 1, 2] and man["config"]["dump_statistics_mode"] == 2
    assert man["errors"] == [] and man["command"] and man["cwd"] and man["torch"] == torch.__version__


def test_statistics_csv_matches_tensors(full_dump) -> None:
    _, dump_dir, _ = full_dump
    folder = dump_dir / "0" / "root.model.layers.0.self_attn"
    raw = (folder / "statistics.csv").read_bytes()
    assert raw.startswith(b"NodeName,NodeType,InputOutput,Index,DataType,Shape,Max,Min,Mean,L2Norm\r\n")
    rows = list(csv.DictReader(raw.decode().splitlines()))
    first, last = rows[0], rows[-1]
    assert (first["NodeName"], first["NodeType"], first["InputOutput"], first["Index"]) == (
        "root.model.layers.0.self_attn",
        "LlamaAttention",
        "Input",
        "0",
    )
    assert (first["DataType"], first["Shape"]) == ("torch.float32", f"(1, {PROMPT}, 64)")
    x = load(folder / "input_0.pth").float()
    expect = [torch.max(x).item(), torch.min(x).item(), torch.mean(x).item(), torch.norm(x).item()]
    assert [float(first[k]) for k in ("Max", "Min", "Mean", "L2Norm")] == expect  # msit's exact values
    assert last["InputOutput"] == "Output"
    y = load(folder / "output_0.pth")
    assert float(last["L2Norm"]) == torch.norm(y).item()


def test_statistics_only_writes_no_tensors(llama, prompt, tmp_path: Path) -> None:
    dump_dir, _ = generate(llama, prompt, dump_path=tmp_path, token_range=[0], dump_statistics_mode=1)
    written = [p for p in (dump_dir / "0").rglob("*") if p.is_file()]
    assert written and all(p.name == "statistics.csv" for p in written)
    rows = list(csv.reader((dump_dir / "0" / "root.model.norm" / "statistics.csv").open(newline="")))
    assert rows[0][0] == "NodeName" and [r[2] for r in rows[1:]] == ["Input", "Output"]


def test_filters(llama, prompt, tmp_path: Path) -> None:
    d, _ = generate(llama, prompt, dump_path=tmp_path / "tok", token_range=[1])
    assert sorted(p.name for p in d.iterdir() if p.is_dir()) == ["1"]

    d, _ = generate(llama, prompt, dump_path=tmp_path / "mods", module_list=[LlamaMLP, "LlamaRMSNorm"])
    names = {p.name for p in (d / "0").iterdir()}
    assert names == {
        f"root.model.layers.{i}.{m}" for i in (0, 1) for m in ("mlp", "input_layernorm", "post_attention_layernorm")
    } | {"root.model.norm"}
    assert all(isinstance(m, (LlamaMLP, LlamaRMSNorm)) for m in [llama.model.norm])

    d, _ = generate(llama, prompt, dump_path=tmp_path / "glob", layer_name="root.model.layers.1.*proj")
    assert {p.name.rsplit(".", 1)[1] for p in (d / "0").iterdir()} == {
        "q_proj",
        "k_proj",
        "v_proj",
        "o_proj",
        "gate_proj",
        "up_proj",
        "down_proj",
    }
    assert all(p.name.startswith("root.model.layers.1.") for p in (d / "0").iterdir())

    d, _ = generate(llama, prompt, dump_path=tmp_path / "in", tensor_part=0, layer_name="root.model.norm")
    assert files(d / "0" / "root.model.norm") == {"input_0.pth"}
    d, _ = generate(llama, prompt, dump_path=tmp_path / "out", tensor_part=1, layer_name="root.model.norm")
    assert files(d / "0" / "root.model.norm") == {"output.pth"}


def test_dump_last_logits(llama, prompt, tmp_path: Path) -> None:
    d, out = generate(llama, prompt, dump_path=tmp_path, token_range=[0, 1, 2], dump_last_logits=True)
    for token in range(3):
        assert [p.name for p in (d / str(token)).iterdir()] == ["root.lm_head"]
        logits = load(d / str(token) / "root.lm_head" / "output.pth")
        torch.testing.assert_close(logits[0, -1], out.logits[token][0])


class Twice(nn.Module):
    """Calls one submodule twice and returns a view of a large tensor."""

    def __init__(self) -> None:
        super().__init__()
        self.lin = nn.Linear(8, 8)

    def forward(self, x: torch.Tensor, *, scale: torch.Tensor) -> torch.Tensor:
        big = self.lin(self.lin(x)) * scale
        return big[:1]


def test_views_repeat_calls_and_kwargs(tmp_path: Path) -> None:
    model = Twice()
    handle = register_hook(model, DumpConfig(dump_path=tmp_path))
    x = torch.randn(1000, 8)
    out = model(x, scale=torch.tensor(2.0))
    handle.remove()
    d = handle.dump_dir
    assert d is not None
    saved = torch.load(d / "0" / "root" / "output.pth", weights_only=True)
    torch.testing.assert_close(saved, out.detach())
    assert saved.untyped_storage().nbytes() == 8 * 4  # the view alone, not the 1000-row storage
    man = json.loads((d / "wb_manifest.json").read_text())
    assert man["exec_order"]["0"] == ["root", "root.lin", "root.lin"]
    assert man["kwargs_inputs"]["0"]["root"] == {"1": "scale"}
    assert load(d / "0" / "root" / "input_1.pth").item() == 2.0
    # msit semantics for a module called twice in one token: the last call's tensors are in the folder
    torch.testing.assert_close(load(d / "0" / "root.lin" / "input_0.pth"), model.lin(x).detach())


class _Reshape(nn.Module):
    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x.view(x.shape)  # a new tensor object over the very same bytes


class _AddInPlace(nn.Module):
    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x.add_(1.0)


class _Chain(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.lin = nn.Linear(8, 8)
        self.same = _Reshape()
        self.bump = _AddInPlace()

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.bump(self.same(self.lin(x)))


def test_views_of_the_same_bytes_are_written_once_and_in_place_changes_are_not(tmp_path: Path) -> None:
    model = _Chain()
    handle = register_hook(model, DumpConfig(dump_path=tmp_path))
    with torch.no_grad():
        x = torch.randn(4, 8)
        before_bump = model.lin(x).clone()
        model(x)
    handle.remove()
    d = handle.dump_dir
    assert d is not None
    tok = d / "0"
    # lin's output, same's input and same's output (a view object) are one file under three names
    inodes = {
        os.stat(tok / m / f).st_ino
        for m, f in (("root.lin", "output.pth"), ("root.same", "input_0.pth"), ("root.same", "output.pth"))
    }
    assert len(inodes) == 1
    torch.testing.assert_close(load(tok / "root.same" / "output.pth"), before_bump)
    # bump changed the tensor in place: its output is a new file with the new values; the earlier ones keep theirs
    assert os.stat(tok / "root.bump" / "output.pth").st_ino not in inodes
    torch.testing.assert_close(load(tok / "root.bump" / "output.pth"), before_bump + 1.0)
    torch.testing.assert_close(load(tok / "root.lin" / "output.pth"), before_bump)


def test_remove_restores_and_second_model(llama, prompt, tmp_path: Path) -> None:
    ref = llama(prompt).logits
    other = Twice()
    h1 = register_hook(llama, DumpConfig(dump_path=tmp_path))
    h2 = register_hook(other, DumpConfig(dump_path=tmp_path, token_range=[0]))
    assert h1.dump_dir != h2.dump_dir
    torch.testing.assert_close(llama(prompt).logits, ref)
    other(torch.randn(2, 8), scale=torch.tensor(1.0))
    h1.remove()
    h2.remove()
    h1.remove()  # idempotent
    for module in [*llama.modules(), *other.modules()]:
        assert not module._forward_hooks and not module._forward_pre_hooks
        assert not module._forward_hooks_with_kwargs and not module._forward_pre_hooks_with_kwargs
    assert (h2.dump_dir / "0" / "root.lin" / "output.pth").is_file()
    assert (h1.dump_dir / "0" / "root.lm_head" / "output.pth").is_file()


def test_manifest_written_per_token_before_remove(llama, prompt, tmp_path: Path) -> None:
    handle = register_hook(llama, DumpConfig(dump_path=tmp_path, token_range=[0, 1]))
    try:
        llama(prompt)
        handle.writer.flush()  # the token-end manifest is written by the writer, after the token's files
        man = json.loads((handle.dump_dir / "wb_manifest.json").read_text())
        assert man["tokens"] == [0] and man["exec_order"]["0"][0] == "root"
    finally:
        handle.remove()


def test_api_mode_and_weights(tmp_path: Path) -> None:
    import torch.nn.functional as F

    silu = F.silu
    model = nn.Sequential(nn.Linear(4, 4), nn.SiLU())
    handle = register_hook(model, DumpConfig(dump_path=tmp_path, mode=["module", "api"], dump_weight=True))
    model(torch.randn(2, 4))
    handle.remove()
    d = handle.dump_dir
    assert F.silu is silu
    names = {p.name for p in (d / "0").iterdir()}
    assert {"root", "root.0", "root.1", "root.0.linear", "root.1.silu"} <= names
    assert files(d / "0" / "root.0.linear") >= {"input_0.pth", "input_1.pth", "output.pth"}
    torch.testing.assert_close(load(d / "weights" / "root.0.weight.pth"), model[0].weight.detach())


def test_bad_arguments(tmp_path: Path) -> None:
    bad = [
        dict(token_range="0"),
        dict(token_range=[-1]),
        dict(tensor_part=3),
        dict(dump_statistics_mode="1"),
        dict(mode="graph"),
        dict(module_list=[int]),
        dict(device_id=-1),
        dict(layer_name=""),
        dict(dump_last_logits=1),
        dict(seed="x"),
        dict(max_queue_bytes=0),
    ]
    for kwargs in bad:
        name = next(iter(kwargs))
        with pytest.raises(DumpConfigError, match=name):
            DumpConfig(dump_path=tmp_path, **kwargs)
    (tmp_path / "file").write_text("x")
    with pytest.raises(DumpConfigError, match="dump_path"):
        DumpConfig(dump_path=tmp_path / "file" / "sub")
    with pytest.raises(TypeError, match=r"nn\.Module"):
        register_hook(object(), DumpConfig(dump_path=tmp_path))  # type: ignore[arg-type]


def test_write_errors_are_reported(tmp_path: Path) -> None:
    model = nn.Linear(2, 2)
    handle = register_hook(model, DumpConfig(dump_path=tmp_path))
    assert handle.dump_dir is not None
    (handle.dump_dir / "0").write_text("not a folder")  # every file below it fails
    model(torch.randn(1, 2))
    with pytest.raises(DumpError, match="could not be written"):
        handle.remove()


def test_device_id_skips_other_devices(tmp_path: Path) -> None:
    # on CPU msit ignores device_id; the handle still dumps
    handle = register_hook(nn.Linear(2, 2), DumpConfig(dump_path=tmp_path, device_id=3))
    handle.remove()
    assert handle.enabled and handle.dump_dir is not None


def test_seed_all_sets_msits_switches(monkeypatch: pytest.MonkeyPatch) -> None:
    from workbench.dump import seed_all

    for var in ("LCCL_DETERMINISTIC", "HCCL_DETERMINISTIC", "PYTHONHASHSEED"):
        monkeypatch.delenv(var, raising=False)
    try:
        seed_all(7)
        a = torch.rand(3)
        seed_all(7)
        torch.testing.assert_close(torch.rand(3), a)
        assert torch.are_deterministic_algorithms_enabled()
        assert (os.environ["LCCL_DETERMINISTIC"], os.environ["HCCL_DETERMINISTIC"]) == ("1", "true")
        assert os.environ["PYTHONHASHSEED"] == "7"
    finally:
        torch.use_deterministic_algorithms(False)
    with pytest.raises(ValueError, match="seed"):
        seed_all("7")  # type: ignore[arg-type]


def _task_ids() -> set[int]:
    return {int(t) for t in os.listdir("/proc/self/task")}


LINUX_THREADS = pytest.mark.skipif(
    not os.path.isdir("/proc/self/task") or not hasattr(os, "SCHED_IDLE"), reason="Linux only"
)


def _check_writers(llama, prompt, cfg: DumpConfig, team: bool | None, threads: int) -> None:
    """Register, check the writer threads (SCHED_IDLE, with or without an OpenMP team), dump one token, remove.

    `team=None`: as the dumper decided from what creating the dump folder cost on this storage."""
    torch.randn(1 << 20).sum()  # this thread's own OpenMP team exists before counting
    before = _task_ids()
    handle = register_hook(llama, cfg)
    handle.flush()  # the writer threads have started and run their set-up
    if team is None:
        team = handle.manifest.meta["writer"]["openmp_team"]
    writers = [t.native_id for t in handle.writer._threads]
    assert len(writers) == threads
    assert all(os.sched_getscheduler(tid) == os.SCHED_IDLE for tid in writers)
    added = _task_ids() - before
    openmp_workers = (torch.get_num_threads() - 1) * len(writers) if team else 0
    assert len(added) == len(writers) + openmp_workers
    llama.generate(prompt, max_new_tokens=1, do_sample=False, pad_token_id=0)
    handle.remove()
    # join() returns once the Python thread is done; the OS thread (libgomp's team destructor) a moment later
    deadline = time.monotonic() + 60  # ends as soon as they are gone: the bound is for a loaded machine
    while added & _task_ids() and time.monotonic() < deadline:
        time.sleep(0.01)
    assert not (added & _task_ids())  # the writers and their OpenMP workers have exited
    manifest = json.loads((handle.dump_dir / "wb_manifest.json").read_text())
    assert manifest["writer"]["threads"] == threads and manifest["writer"]["openmp_team"] == team
    assert list(handle.dump_dir.glob("0/*/output*.pth" if cfg.dump_statistics_mode != 1 else "0/*/statistics.csv"))


@LINUX_THREADS
def test_writer_threads_take_only_idle_cpu(llama, prompt, tmp_path: Path, monkeypatch) -> None:
    """Writers are SCHED_IDLE; a tensor dump's writer owns an OpenMP team (so libgomp stops spinning idle
    workers), a statistics-only dump's does not unless creating a folder on that storage is slow."""
    _check_writers(llama, prompt, DumpConfig(dump_path=tmp_path / "full", writer_threads=1), team=True, threads=1)
    cfg = DumpConfig(dump_path=tmp_path / "stats", dump_statistics_mode=1, writer_threads=1)
    _check_writers(llama, prompt, cfg, team=None, threads=1)
    import workbench.dump.hooks as hooks

    monkeypatch.setattr(hooks, "_SLOW_FOLDER_S", 10.0)  # no storage is that slow: no team
    _check_writers(llama, prompt, cfg, team=False, threads=1)


@LINUX_THREADS
def test_slow_storage_gets_a_team_and_a_second_writer(llama, prompt, tmp_path: Path, monkeypatch) -> None:
    """Where creating a folder is slow (threshold 0 here: every folder is), statistics-only dumps write while the
    model runs too, with two threads unless the user chose the count."""
    import workbench.dump.hooks as hooks

    monkeypatch.setattr(hooks, "_SLOW_FOLDER_S", 0.0)
    auto = DumpConfig(dump_path=tmp_path / "auto", dump_statistics_mode=1)
    _check_writers(llama, prompt, auto, team=True, threads=max(2, auto.writer_threads))
    chosen = DumpConfig(dump_path=tmp_path / "chosen", dump_statistics_mode=1, writer_threads=1)
    _check_writers(llama, prompt, chosen, team=True, threads=1)
