"""A Llama shaped exactly like an ATB (Ascend Transformer Boost) model, in plain torch.

Two graphs, as MindIE builds them: `Prefill` (SelfAttentionOperation over the prompt) and
`Decoder` (PagedAttentionOperation over a block/slot KV cache), one execution per token.
Weights come from a Hugging Face `LlamaForCausalLM`, fused as ATB loads them (q/k/v into one
QKV weight, gate/up into one gate-up weight, HF `[out, in]` layout kept: `transposeB`).

Top-level op ids are global across both graphs (ATB's counter): with L layers the prefill
graph holds ids `0 .. L+3` and the decoder graph `L+4 .. 2L+7`::

    {b}_WordEmbedding/0_GatherOperation
    {b+1}_PositionalEmbeddingGather/{0,1}_GatherOperation            cos, sin rows
    {b+2+l}_{Prefill|Decoder}_layer/
        0_RmsNormOperation                                            input norm
        1_Attention/0_QKVLinearSplitPack/{0_LinearOperation,1_SplitOperation}
        1_Attention/1_RopeOperation
        1_Attention/2_ReshapeAndCacheOperation
        1_Attention/3_SelfAttentionOperation | 3_PagedAttentionOperation
        1_Attention/4_LinearOperation                                 o_proj
        2_ElewiseOperation                                            residual add
        3_RmsNormOperation                                            post-attention norm
        4_Mlp/{0_LinearOperation,1_ActivationOperation,2_LinearOperation}   gate-up, SwiGLU, down
        5_ElewiseOperation                                            residual add
    {b+L+2}_RmsNormOperation                                          final norm
    {b+L+3}_LmHead/0_LinearOperation                                  logits for every token

Tensor parallelism (`shard(rank, size, comm)`, run by `workbench.backends.atb_tp`) splits the weights as
ATB's Llama does: q/k/v and gate/up column-parallel (by heads, by intermediate), o_proj and down_proj
row-parallel, each followed by an all-reduce of the ranks' partial sums, and the LM head vocab-parallel
(rows by vocabulary, gathered) when the vocabulary divides by the ranks (else replicated)::

        1_Attention/5_AllReduceOperation                              after o_proj (row-parallel)
        4_Mlp/3_AllReduceOperation                                    after down (row-parallel)
    {b+L+3}_LmHead/{0_LinearOperation,1_AllGatherOperation,2_TransposeOperation}
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import TYPE_CHECKING, Any

import torch

from workbench.backends import atb_ops as ops
from workbench.backends.atb_naming import GRAPH_SUFFIX, graph_name, id_base
from workbench.backends.atb_ops import Communicator, Graph, LeafOp, Node, RunContext

if TYPE_CHECKING:
    from workbench.backends.atb_dump import AtbDumpConfig
    from workbench.backends.defects import Defect

DEFAULT_BLOCK_SIZE = 128

# layer graph tensor ids (ATB GraphParam order: inputs, outputs, internals)
LAYER_INPUTS = [
    "hidden",
    "input_norm_weight",
    "qkv_weight",
    "o_weight",
    "post_norm_weight",
    "gate_up_weight",
    "down_weight",
    "cos",
    "sin",
    "mask_or_block_tables",
    "seq_len",
    "k_cache",
    "v_cache",
    "slots",
]
LAYER_WEIGHTS = LAYER_INPUTS[1:7]
MODEL_INPUTS = ["input_ids", "positions", "cos_table", "sin_table", "mask_or_block_tables", "seq_len", "slots"]


@dataclass(frozen=True, slots=True)
class LlamaDims:
    """The shape facts of the model that its ops need."""

    num_layers: int
    hidden: int
    heads: int
    kv_heads: int
    head_dim: int
    intermediate: int
    vocab: int
    eps: float
    rope_theta: float
    max_positions: int

    @property
    def q_size(self) -> int:
        return self.heads * self.head_dim

    @property
    def kv_size(self) -> int:
        return self.kv_heads * self.head_dim

    def per_rank(self, size: int) -> LlamaDims:
        """What one of `size` tensor-parallel ranks holds: heads, kv heads and the intermediate split."""
        if size == 1:
            return self
        for what, n in (
            ("attention heads", self.heads),
            ("kv heads", self.kv_heads),
            ("intermediate", self.intermediate),
        ):
            if n % size:
                raise ValueError(f"tensor parallel {size}: {what} ({n}) do not divide by the ranks")
        return replace(
            self, heads=self.heads // size, kv_heads=self.kv_heads // size, intermediate=self.intermediate // size
        )


@dataclass(slots=True)
class AtbRun:
    """What one `AtbLlama.run` produced."""

    tokens: torch.Tensor  # [1, prompt + new], int64, like HF generate
    logits: list[torch.Tensor] = field(default_factory=list)  # fp32 [vocab] per step (last position)
    dump_root: Path | None = None  # the msit_dump_* folder when dumping


class AtbLlama:
    """Llama with ATB's graph structure; see the module docstring for the op layout."""

    def __init__(
        self,
        dims: LlamaDims,
        weights: dict[str, torch.Tensor],
        inv_freq: torch.Tensor,
        rope_scaling: float,
        dtype: torch.dtype,
        defect: Defect | None = None,
        block_size: int = DEFAULT_BLOCK_SIZE,
        config: dict[str, Any] | None = None,
        *,
        tp_rank: int = 0,
        tp_size: int = 1,
        comm: Communicator | None = None,
    ) -> None:
        if dtype not in (torch.bfloat16, torch.float16, torch.float32):
            raise ValueError(f"dtype {dtype}: expected torch.bfloat16, torch.float16 or torch.float32")
        if block_size < 1:
            raise ValueError(f"block_size {block_size}: must be positive")
        if tp_size < 1 or not 0 <= tp_rank < tp_size:
            raise ValueError(f"tensor parallel rank {tp_rank} of {tp_size}: expected 0 <= rank < size")
        if tp_size > 1 and comm is None:
            raise ValueError("tensor parallel ranks need a communicator")
        if defect is not None and defect.needs_tp and tp_size < 2:
            raise ValueError(f"defect {defect.kind}: lives in an all-reduce, which needs tensor parallelism (2+ ranks)")
        self.dims = dims
        self.tp_rank, self.tp_size, self.comm = tp_rank, tp_size, comm
        self.local = dims.per_rank(tp_size)  # heads, kv heads, intermediate of this rank
        self.vocab_parallel = tp_size > 1 and dims.vocab % tp_size == 0
        self.weights = weights
        self.inv_freq = inv_freq.float()
        self.rope_scaling = rope_scaling
        self.dtype = dtype
        self.defect = defect
        self.block_size = block_size
        self.config = config or {}
        self.graphs = {phase: self._model_graph(phase) for phase in GRAPH_SUFFIX}
        for g in self.graphs.values():
            g.check()

    # ------------------------------------------------------------ loading
    @classmethod
    def from_hf(
        cls,
        hf_model: Any,
        dtype: torch.dtype = torch.bfloat16,
        defect: Defect | None = None,
        block_size: int = DEFAULT_BLOCK_SIZE,
    ) -> AtbLlama:
        """Load (and fuse) the weights of a HF `LlamaForCausalLM`; `dtype` is the compute dtype."""
        cfg = hf_model.config
        if getattr(cfg, "hidden_act", "silu") != "silu":
            raise ValueError(f"hidden_act {cfg.hidden_act!r}: only silu (SwiGLU) is supported")
        if getattr(cfg, "attention_bias", False) or getattr(cfg, "mlp_bias", False):
            raise ValueError("attention_bias / mlp_bias models are not supported")
        heads = cfg.num_attention_heads
        head_dim = getattr(cfg, "head_dim", None) or cfg.hidden_size // heads
        rope = getattr(cfg, "rope_parameters", None) or {}
        theta = float(rope.get("rope_theta", getattr(cfg, "rope_theta", 10000.0)))
        dims = LlamaDims(
            num_layers=cfg.num_hidden_layers,
            hidden=cfg.hidden_size,
            heads=heads,
            kv_heads=getattr(cfg, "num_key_value_heads", None) or heads,
            head_dim=head_dim,
            intermediate=cfg.intermediate_size,
            vocab=cfg.vocab_size,
            eps=float(cfg.rms_norm_eps),
            rope_theta=theta,
            max_positions=int(cfg.max_position_embeddings),
        )
        model = hf_model.model

        def w(t: torch.Tensor) -> torch.Tensor:
            return t.detach().to(dtype).contiguous()

        weights: dict[str, torch.Tensor] = {
            "embed": w(model.embed_tokens.weight),
            "final_norm": w(model.norm.weight),
            "lm_head": w(hf_model.lm_head.weight),
        }
        for i, layer in enumerate(model.layers):
            att, mlp = layer.self_attn, layer.mlp
            weights[f"{i}.input_norm_weight"] = w(layer.input_layernorm.weight)
            weights[f"{i}.qkv_weight"] = w(torch.cat([att.q_proj.weight, att.k_proj.weight, att.v_proj.weight], dim=0))
            weights[f"{i}.o_weight"] = w(att.o_proj.weight)
            weights[f"{i}.post_norm_weight"] = w(layer.post_attention_layernorm.weight)
            weights[f"{i}.gate_up_weight"] = w(torch.cat([mlp.gate_proj.weight, mlp.up_proj.weight], dim=0))
            weights[f"{i}.down_weight"] = w(mlp.down_proj.weight)
        rotary = model.rotary_emb
        return cls(
            dims,
            weights,
            rotary.inv_freq.detach().clone(),
            float(rotary.attention_scaling),
            dtype,
            defect,
            block_size,
            cfg.to_dict(),
        )

    def shard(self, rank: int, size: int, comm: Communicator, defect: Defect | None = None) -> AtbLlama:
        """Rank `rank` of `size` tensor-parallel ranks of this (unsplit) model, with its slice of every weight;
        `defect` (default: this model's) is planted in the rank (an all-reduce defect needs the ranks)."""
        if self.tp_size != 1:
            raise ValueError("shard() splits an unsplit model")
        d = self.dims
        local = d.per_rank(size)

        def rows(t: torch.Tensor, parts: list[int]) -> torch.Tensor:
            """This rank's rows of each consecutive block of `parts` rows (fused q/k/v, fused gate/up)."""
            blocks = torch.split(t, parts, dim=0)
            return torch.cat([blk.chunk(size, dim=0)[rank] for blk in blocks], dim=0).contiguous()

        def cols(t: torch.Tensor) -> torch.Tensor:
            return t.chunk(size, dim=1)[rank].contiguous()

        weights = dict(self.weights)
        for i in range(d.num_layers):
            weights[f"{i}.qkv_weight"] = rows(self.weights[f"{i}.qkv_weight"], [d.q_size, d.kv_size, d.kv_size])
            weights[f"{i}.o_weight"] = cols(self.weights[f"{i}.o_weight"])
            weights[f"{i}.gate_up_weight"] = rows(self.weights[f"{i}.gate_up_weight"], [d.intermediate] * 2)
            weights[f"{i}.down_weight"] = cols(self.weights[f"{i}.down_weight"])
        if d.vocab % size == 0:
            weights["lm_head"] = rows(self.weights["lm_head"], [d.vocab])
        assert local.heads * size == d.heads
        return AtbLlama(
            d,
            weights,
            self.inv_freq,
            self.rope_scaling,
            self.dtype,
            defect if defect is not None else self.defect,
            self.block_size,
            self.config,
            tp_rank=rank,
            tp_size=size,
            comm=comm,
        )

    # ------------------------------------------------------------ graphs
    def _patch(self, op: LeafOp, layer: int, rel: str) -> LeafOp:
        if self.defect is None:
            return op
        return self.defect.patch(op, layer=layer, rel_path=rel, model=self)

    def _all_reduce(self, layer: int, rel: str) -> LeafOp:
        assert self.comm is not None
        return self._patch(ops.all_reduce_op(self.tp_rank, self.tp_size, self.comm), layer, rel)

    def _attention_graph(self, phase: str, layer: int) -> Graph:
        d = self.local
        qkv = Graph(
            "QKVLinearSplitPack",
            {"qSize": d.q_size, "kvSize": d.kv_size, "transposeB": True},
            ["x", "qkv_weight"],
            3,
            1,
            [
                Node(
                    self._patch(ops.linear_op(), layer, "1_Attention/0_QKVLinearSplitPack/0_LinearOperation"),
                    [0, 1],
                    [5],
                ),
                Node(
                    self._patch(
                        ops.split_op([d.q_size, d.kv_size, d.kv_size]),
                        layer,
                        "1_Attention/0_QKVLinearSplitPack/1_SplitOperation",
                    ),
                    [5],
                    [2, 3, 4],
                ),
            ],
        )

        def heads(n: int) -> Callable[[torch.Tensor], torch.Tensor]:  # a view, as ATB's reshapeFunc
            return lambda t: t.view(t.shape[0], n, d.head_dim)

        def flat(t: torch.Tensor) -> torch.Tensor:
            return t.reshape(t.shape[0], -1)

        scale = ops.default_scale(d.head_dim)
        tp = self.tp_size > 1  # o_proj writes its partial sum to internal 17, the all-reduce the output
        # inputs: 0 x, 1 qkv_w, 2 o_w, 3 cos, 4 sin, 5 mask|block_tables, 6 seq_len, 7 k_cache, 8 v_cache,
        # 9 slots; output 10; internals 11 q, 12 k, 13 v, 14 q_rot, 15 k_rot, 16 context
        if phase == "prefill":
            attn = self._patch(
                ops.self_attention_op(d.heads, d.kv_heads, d.head_dim, scale),
                layer,
                "1_Attention/3_SelfAttentionOperation",
            )
            attn_node = Node(
                attn, [14, 15, 13, 5, 6], [16], {0: heads(d.heads), 1: heads(d.kv_heads), 2: heads(d.kv_heads)}
            )
        else:
            attn = self._patch(
                ops.paged_attention_op(d.heads, d.kv_heads, d.head_dim, scale),
                layer,
                "1_Attention/3_PagedAttentionOperation",
            )
            attn_node = Node(attn, [14, 7, 8, 5, 6], [16], {0: heads(d.heads)})
        return Graph(
            "Attention",
            {
                "isPrefill": phase == "prefill",
                "headNum": d.heads,
                "kvHeadNum": d.kv_heads,
                "headDim": d.head_dim,
                "qkScale": scale,
                "rotaryCoeff": 2,
            },
            [
                "x",
                "qkv_weight",
                "o_weight",
                "cos",
                "sin",
                "mask_or_block_tables",
                "seq_len",
                "k_cache",
                "v_cache",
                "slots",
            ],
            1,
            7 if tp else 6,
            [
                Node(qkv, [0, 1], [11, 12, 13]),
                Node(
                    self._patch(ops.rope_op(d.head_dim), layer, "1_Attention/1_RopeOperation"),
                    [11, 12, 3, 4, 6],
                    [14, 15],
                ),
                Node(
                    self._patch(ops.reshape_and_cache_op(), layer, "1_Attention/2_ReshapeAndCacheOperation"),
                    [15, 13, 7, 8, 9],
                    [7, 8],
                    {0: heads(d.kv_heads), 1: heads(d.kv_heads)},
                ),
                attn_node,
                Node(
                    self._patch(ops.linear_op(), layer, "1_Attention/4_LinearOperation"),
                    [16, 2],
                    [17 if tp else 10],
                    {0: flat},
                ),
                *([Node(self._all_reduce(layer, "1_Attention/5_AllReduceOperation"), [17], [10])] if tp else []),
            ],
        )

    def _layer_graph(self, phase: str, layer: int) -> Graph:
        d = self.local
        tp = self.tp_size > 1  # down writes its partial sum to internal 6, the all-reduce the output
        mlp = Graph(
            "Mlp",
            {"activationType": ops.ACTIVATION_SWIGLU_FORWARD, "transposeB": True},
            ["x", "gate_up_weight", "down_weight"],
            1,
            3 if tp else 2,
            [
                Node(self._patch(ops.linear_op(), layer, "4_Mlp/0_LinearOperation"), [0, 1], [4]),
                Node(self._patch(ops.swiglu_op(), layer, "4_Mlp/1_ActivationOperation"), [4], [5]),
                Node(self._patch(ops.linear_op(), layer, "4_Mlp/2_LinearOperation"), [5, 2], [6 if tp else 3]),
                *([Node(self._all_reduce(layer, "4_Mlp/3_AllReduceOperation"), [6], [3])] if tp else []),
            ],
        )
        # inputs 0..13 (LAYER_INPUTS), output 14, internals 15 normed, 16 attn, 17 resid, 18 normed2, 19 mlp
        return Graph(
            f"{GRAPH_SUFFIX[phase]}_layer",
            {
                "isPrefill": phase == "prefill",
                "layerId": layer,
                "headNum": d.heads,
                "kvHeadNum": d.kv_heads,
                "headDim": d.head_dim,
                "hiddenSize": d.hidden,
                "rmsNormEps": d.eps,
                "blockSize": self.block_size,
                **({"rank": self.tp_rank, "worldSize": self.tp_size, "backend": "hccl"} if tp else {}),
            },
            list(LAYER_INPUTS),
            1,
            5,
            [
                Node(self._patch(ops.rms_norm_op(d.eps), layer, "0_RmsNormOperation"), [0, 1], [15]),
                Node(self._attention_graph(phase, layer), [15, 2, 3, 7, 8, 9, 10, 11, 12, 13], [16]),
                Node(self._patch(ops.add_op(), layer, "2_ElewiseOperation"), [0, 16], [17]),
                Node(self._patch(ops.rms_norm_op(d.eps), layer, "3_RmsNormOperation"), [17, 4], [18]),
                Node(mlp, [18, 5, 6], [19]),
                Node(self._patch(ops.add_op(), layer, "5_ElewiseOperation"), [17, 19], [14]),
            ],
        )

    def model_inputs(self) -> list[str]:
        """Labels of the model graph's inputs, in table order: data inputs, weights, caches."""
        n = self.dims.num_layers
        names = [*MODEL_INPUTS, "embed"]
        names += [f"{i}.{w}" for i in range(n) for w in LAYER_WEIGHTS]
        names += ["final_norm", "lm_head"]
        names += [f"{i}.{c}" for i in range(n) for c in ("k_cache", "v_cache")]
        return names

    def _model_graph(self, phase: str) -> Graph:
        n = self.dims.num_layers
        labels = self.model_inputs()
        pos = {name: i for i, name in enumerate(labels)}
        n_in = len(labels)
        out_logits = n_in
        # internals: hidden_0 .. hidden_n (hidden_0 = embeddings), cos, sin, final normed
        hid = [n_in + 1 + i for i in range(n + 1)]
        cos_id, sin_id, normed_id = n_in + n + 2, n_in + n + 3, n_in + n + 4
        embed = Graph(
            "WordEmbedding", {"axis": 0}, ["embed_weight", "input_ids"], 1, 0, [Node(ops.gather_op(), [0, 1], [2])]
        )
        rope = Graph(
            "PositionalEmbeddingGather",
            {"axis": 0},
            ["cos_table", "sin_table", "positions"],
            2,
            0,
            [Node(ops.gather_op(), [0, 2], [3]), Node(ops.gather_op(), [1, 2], [4])],
        )
        if (
            self.vocab_parallel
        ):  # each rank's vocabulary rows, gathered `[ranks, T, V/ranks]`, then `[T, ranks, V/ranks]`
            assert self.comm is not None
            lm_head = Graph(
                "LmHead",
                {"gatherAhead": False, "transposeB": True, "rank": self.tp_rank, "rankSize": self.tp_size},
                ["x", "lm_head_weight"],
                1,
                2,
                [
                    Node(ops.linear_op(), [0, 1], [3]),
                    Node(ops.all_gather_op(self.tp_rank, self.tp_size, self.comm), [3], [4]),
                    Node(ops.transpose_op([1, 0, 2]), [4], [2]),
                ],
                out_views={0: lambda t: t.reshape(t.shape[0], -1)},
            )
        else:
            lm_head = Graph(
                "LmHead",
                {"gatherAhead": False, "transposeB": True},
                ["x", "lm_head_weight"],
                1,
                0,
                [Node(ops.linear_op(), [0, 1], [2])],
            )
        nodes = [
            Node(embed, [pos["embed"], pos["input_ids"]], [hid[0]]),
            Node(rope, [pos["cos_table"], pos["sin_table"], pos["positions"]], [cos_id, sin_id]),
        ]
        for i in range(n):
            ins = [hid[i]] + [pos[f"{i}.{w}"] for w in LAYER_WEIGHTS]
            ins += [
                cos_id,
                sin_id,
                pos["mask_or_block_tables"],
                pos["seq_len"],
                pos[f"{i}.k_cache"],
                pos[f"{i}.v_cache"],
                pos["slots"],
            ]
            nodes.append(Node(self._layer_graph(phase, i), ins, [hid[i + 1]]))
        nodes.append(Node(ops.rms_norm_op(self.dims.eps), [hid[n], pos["final_norm"]], [normed_id]))
        nodes.append(Node(lm_head, [normed_id, pos["lm_head"]], [out_logits]))
        return Graph(graph_name(phase), {}, labels, 1, n + 4, nodes)

    # ------------------------------------------------------------ running
    def rope_tables(self, length: int) -> tuple[torch.Tensor, torch.Tensor]:
        """cos/sin `[length, head_dim]` in the compute dtype, computed in fp32 as HF does."""
        pos = torch.arange(length, dtype=torch.float32)
        freqs = pos[:, None] * self.inv_freq[None, :]
        emb = torch.cat((freqs, freqs), dim=-1)
        return ((emb.cos() * self.rope_scaling).to(self.dtype), (emb.sin() * self.rope_scaling).to(self.dtype))

    def _execute(
        self, phase: str, data: dict[str, torch.Tensor], caches: list[torch.Tensor], ctx: RunContext
    ) -> torch.Tensor:
        graph = self.graphs[phase]
        ins: list[torch.Tensor] = []
        for label in graph.in_labels:
            if label in data:
                ins.append(data[label])
            elif label.endswith("_cache"):
                layer, kind = label.split(".")
                ins.append(caches[2 * int(layer) + (kind == "v_cache")])
            else:
                ins.append(self.weights[label])
        (logits,) = ops.run_graph_body(graph, ins, ctx, "", id_base(phase, self.dims.num_layers))
        return logits

    @torch.no_grad()
    def run(
        self,
        input_ids: torch.Tensor,
        max_new_tokens: int,
        *,
        dump: AtbDumpConfig | None = None,
        forced: list[int] | None = None,
        follow_tokens: str | Path | None = None,
    ) -> AtbRun:
        """Greedy decoding (one prefill, then one decode execution per further token), optionally dumped.

        `forced` replays given tokens instead of the argmax (so a test run decodes what the golden
        run decoded); `follow_tokens` (or `dump.follow_tokens`) takes them from a golden dump's manifest.
        Execution `k` (0 prefill) is dump folder `k` (`k + 1` with a warmup).
        """
        from workbench.backends.atb_dump import AtbDumper
        from workbench.formats.token_ids import generated_ids

        source = follow_tokens if follow_tokens is not None else (dump.follow_tokens if dump is not None else None)
        if source is not None:
            if forced is not None:
                raise ValueError("give either forced or follow_tokens, not both")
            forced = generated_ids(source)
            if dump is not None and dump.follow_tokens is None:
                dump = replace(dump, follow_tokens=source)  # the manifest says whose tokens were decoded
            if len(forced) < max_new_tokens:
                raise ValueError(
                    f"follow_tokens {source}: the golden run generated {len(forced)} tokens, "
                    f"fewer than max_new_tokens {max_new_tokens}"
                )

        ids = torch.as_tensor(input_ids)
        if ids.dim() == 2:
            if ids.shape[0] != 1:
                raise ValueError(f"input_ids {tuple(ids.shape)}: only batch 1 is supported")
            ids = ids[0]
        if ids.dim() != 1 or ids.numel() == 0:
            raise ValueError(f"input_ids {tuple(ids.shape)}: expected a non-empty [1, T] or [T] tensor")
        if max_new_tokens < 1:
            raise ValueError(f"max_new_tokens {max_new_tokens}: must be at least 1")
        if forced is not None and len(forced) < max_new_tokens:
            raise ValueError(f"forced has {len(forced)} tokens, fewer than max_new_tokens {max_new_tokens}")
        ids = ids.long()
        prompt_len = ids.numel()
        total = prompt_len + max_new_tokens
        if total > self.dims.max_positions:
            raise ValueError(f"{total} positions exceed max_position_embeddings {self.dims.max_positions}")
        dumper = AtbDumper(dump, self, ids, max_new_tokens) if dump is not None else None
        try:
            result = self._decode(ids, max_new_tokens, forced, dumper)
        finally:
            if dumper is not None:
                dumper.close()
        if dumper is not None:
            result.dump_root = dumper.root
            dumper.finish_manifest(result.tokens[0, prompt_len:].tolist())
        return result

    def _new_caches(self, total: int) -> tuple[list[torch.Tensor], torch.Tensor]:
        d = self.local
        blocks = math.ceil(total / self.block_size)
        caches = [
            torch.zeros(blocks, self.block_size, d.kv_heads, d.head_dim, dtype=self.dtype)
            for _ in range(2 * d.num_layers)
        ]
        return caches, torch.arange(blocks, dtype=torch.int32)[None, :]

    def _decode(self, ids: torch.Tensor, max_new: int, forced: list[int] | None, dumper: Any) -> AtbRun:
        prompt_len = ids.numel()
        total = prompt_len + max_new
        cos_table, sin_table = self.rope_tables(total)
        warmup = bool(dumper is not None and dumper.config.warmup)
        steps = ([-1] if warmup else []) + list(range(max_new))
        out_tokens: list[int] = []
        logits_seen: list[torch.Tensor] = []
        caches, block_tables = self._new_caches(total)
        for count, step in enumerate(steps):
            if step <= 0:  # warmup and prefill start from an empty cache
                caches, block_tables = self._new_caches(total)
                n = prompt_len
                positions = torch.arange(n)
                tok = ids
                phase = "prefill"
                mask = torch.full((n, n), torch.finfo(self.dtype).min, dtype=self.dtype).triu(1)
                special = mask
            else:
                positions = torch.tensor([prompt_len + step - 1])
                tok = torch.tensor([out_tokens[-1]])
                phase = "decode"
                special = block_tables
            seq_len = torch.tensor([int(positions[-1]) + 1], dtype=torch.int32)
            bs = self.block_size
            slots = (block_tables[0].long()[positions // bs] * bs + positions % bs).to(torch.int32)
            data = {
                "input_ids": tok,
                "positions": positions.to(torch.int32),
                "cos_table": cos_table,
                "sin_table": sin_table,
                "mask_or_block_tables": special,
                "seq_len": seq_len,
                "slots": slots,
            }
            ctx = RunContext(token=count, step=step, phase=phase, positions=positions)
            if dumper is not None:
                ctx.hook = dumper.start_execution(count, phase, caches)
            logits = self._execute(phase, data, caches, ctx)
            if step < 0:
                continue
            last = logits[-1].float()
            logits_seen.append(last)
            out_tokens.append(int(forced[step]) if forced is not None else int(last.argmax()))
        tokens = torch.cat([ids, torch.tensor(out_tokens, dtype=torch.long)])[None, :]
        return AtbRun(tokens=tokens, logits=logits_seen)

    def generate(self, input_ids: torch.Tensor, max_new_tokens: int) -> torch.Tensor:
        """Greedy generation; returns `[1, prompt + max_new_tokens]` like HF `generate(do_sample=False)`."""
        return self.run(input_ids, max_new_tokens).tokens
