"""The names and global op ids of `AtbLlama`'s graphs (ATB's counter across the prefill and decoder graphs),
shared by the model (`atb_llama.py`), its dumper (`atb_dump.py`) and the defects that name a layer folder."""

from __future__ import annotations

MODEL_NAME = "AtbLlama"
GRAPH_SUFFIX = {"prefill": "Prefill", "decode": "Decoder"}
TOP_LEVEL_EXTRA = 4  # WordEmbedding, PositionalEmbeddingGather, final norm, LmHead


def graph_name(phase: str) -> str:
    """`AtbLlama_Prefill` / `AtbLlama_Decoder`: modelName and topology file stem."""
    return f"{MODEL_NAME}_{GRAPH_SUFFIX[phase]}"


def id_base(phase: str, num_layers: int) -> int:
    """Global id of the first top-level op of a phase's graph."""
    return 0 if phase == "prefill" else num_layers + TOP_LEVEL_EXTRA


def layer_folder(phase: str, layer: int, num_layers: int) -> str:
    """Folder of decoder layer `layer` in a phase, e.g. `3_Prefill_layer`, `9_Decoder_layer`."""
    return f"{id_base(phase, num_layers) + 2 + layer}_{GRAPH_SUFFIX[phase]}_layer"
