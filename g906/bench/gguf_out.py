"""Write a synthetic model as a real GGUF file, so llama.cpp (llama-bench, llama-server) and g906
can be compared on the same file.

    write_synthetic_gguf("qwen3.5-9b", "q4_k", "9b-q4_k.gguf")      # g906 bench --shape ... --write-gguf PATH

The file follows llama.cpp's qwen35 conventions (docs/engine-gguf.md): GGUF tensor names from
gguf-py's map, zero-centred norms stored +1, A_log stored as ssm_a = -exp(A_log), dt_bias as
ssm_dt.bias, conv1d squeezed and F32, every 1-D tensor F32; the 2-D matrices in the quant's types
(the same random blocks the in-memory builder makes). The V heads are not reordered (the weights
are random: the file is a random model of the same shape, in llama.cpp's tiled order). The
tokenizer is g906's small builtin byte-level BPE padded with [PADn] tokens to the vocabulary size
(pre-tokenizer qwen35), so token-id benchmarks run; text output is meaningless.

Tensors are generated and written one at a time (the header first, from the shapes alone), so
memory stays at one tensor."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
import torch

from g906.engine.synthetic import SEED, QuantPlan, make_tensor, shape_config, tensor_specs
from g906.engine.weights import QuantizedExperts, QuantizedTensor
from g906.errors import G906Error

_FILE_TYPES = {"f32": 0, "f16": 1, "bf16": 32, "q8_0": 7, "q4_k": 15}   # llama_ftype (Q4_K_M = 15)


def _convert(name: str, t: torch.Tensor) -> tuple[str, torch.Tensor]:
    """HF name and value -> the converter-side name and value (before the GGUF name map)."""
    if name.endswith(".A_log"):
        return name, -torch.exp(t.float())
    if name.endswith(".dt_bias"):
        return name.rpartition(".dt_bias")[0] + ".dt_proj.bias", t.float()
    if "conv1d" in name:
        return name, t.float().reshape(t.shape[0], t.shape[-1])
    if name.endswith("norm.weight") and not name.endswith("linear_attn.norm.weight"):
        return name, t.float() + 1.0
    return name, t


def _add_tokenizer(w, vocab_size: int) -> None:
    import gguf

    from g906.engine import builtin

    tok = builtin.build_tokenizer()
    vocab, merges = builtin._tokenizer_spec()
    reverse = {i: t for t, i in vocab.items()}
    specials = {tok.token_to_id(t): t for t in builtin.SPECIAL_TOKENS}
    added = {tok.token_to_id(t): t for t in builtin.PLAIN_ADDED_TOKENS}
    tokens, types = [], []
    for i in range(vocab_size):
        if i in specials:
            tokens.append(specials[i])
            types.append(gguf.TokenType.CONTROL)
        elif i in added:
            tokens.append(added[i])
            types.append(gguf.TokenType.USER_DEFINED)
        elif i in reverse:
            tokens.append(reverse[i])
            types.append(gguf.TokenType.NORMAL)
        else:
            tokens.append(f"[PAD{i}]")
            types.append(gguf.TokenType.UNUSED)
    w.add_tokenizer_model("gpt2")
    w.add_tokenizer_pre("qwen35")
    w.add_token_list(tokens)
    w.add_token_types(types)
    w.add_token_merges([f"{a} {b}" for a, b in merges])
    ids = {t: i for i, t in specials.items()}
    if "<|im_end|>" in ids:
        w.add_eos_token_id(ids["<|im_end|>"])
    if "<|endoftext|>" in ids:
        w.add_pad_token_id(ids["<|endoftext|>"])
    w.add_chat_template(builtin.CHAT_TEMPLATE)


def write_synthetic_gguf(shape: str, quant: str, path: str | Path, *, overrides: dict[str, Any] | None = None,
                         seed: int = SEED, device="cpu") -> dict:
    """Write the synthetic model as GGUF; returns {"path", "bytes", "tensors"}."""
    try:
        import gguf
    except ImportError as exc:
        raise G906Error(f"writing GGUF files needs the gguf package ({exc})", hint="pip install gguf") from None
    quant = quant.lower().replace("-", "_")
    if quant == "q4_k_m":
        quant = "q4_k"
    if quant not in _FILE_TYPES:
        raise G906Error(f"cannot write --quant {quant} as GGUF", hint="use f16, bf16, f32, q8_0 or q4_k")
    config = shape_config(shape, overrides)
    if config.vocab_size < 600:
        raise G906Error("the GGUF tokenizer needs vocab_size >= 600", hint="raise the vocab_size override")
    dense = {"f32": torch.float32, "bf16": torch.bfloat16}.get(quant, torch.float16)
    arch = "qwen35moe" if config.is_moe else "qwen35"
    tmap = gguf.get_tensor_name_map(gguf.MODEL_ARCH.QWEN35MOE if config.is_moe else gguf.MODEL_ARCH.QWEN35,
                                    config.num_hidden_layers)
    out = Path(path)
    out.parent.mkdir(parents=True, exist_ok=True)
    w = gguf.GGUFWriter(path=None, arch=arch)
    _add_header(w, gguf, config, shape, quant)

    plan = QuantPlan(quant if quant in ("q8_0", "q4_k") else "f16", config)
    specs = []
    for name, kind, shp in tensor_specs(config):
        qt = plan.qtype(name, shp[-1]) if kind in ("mat", "experts") else None
        specs.append((name, kind, shp, qt, _gguf_name(tmap, name, kind)))

    # the header needs every tensor's shape and size: from the specs, without the data
    for name, kind, shp, qt, gname in specs:
        _add_tensor_info(w, gguf, gname, _gguf_shape(kind, shp), qt, kind, dense)
    w.write_header_to_file(path=out)
    w.write_kv_data_to_file()
    w.write_ti_data_to_file()
    total = 0
    for name, kind, shp, qt, gname in specs:
        t = make_tensor(name, kind, shp, qt, dtype=dense, device=device, seed=seed)
        arr = _file_array(name, kind, t, dense)
        w.write_tensor_data(arr)
        total += arr.nbytes
        del t, arr
    w.close()
    return {"path": str(out), "bytes": out.stat().st_size, "tensor_bytes": total, "tensors": len(specs),
            "shape": shape, "quant": quant, "architecture": arch}


def _add_header(w, gguf, config, shape: str, quant: str) -> None:
    w.add_type(gguf.GGUFType.MODEL)
    w.add_name(f"g906-synthetic-{shape}-{quant}")
    w.add_block_count(config.num_hidden_layers)
    w.add_context_length(config.max_position_embeddings)
    w.add_embedding_length(config.hidden_size)
    w.add_feed_forward_length(config.intermediate_size)
    if config.is_moe:
        w.add_expert_count(config.num_experts)
        w.add_expert_used_count(config.num_experts_per_tok)
        w.add_expert_feed_forward_length(config.moe_intermediate_size)
        w.add_expert_shared_feed_forward_length(config.shared_expert_intermediate_size)
    w.add_head_count(config.num_attention_heads)
    w.add_head_count_kv(config.num_key_value_heads)
    sections = list(config.mrope_section) + [0] * (4 - len(config.mrope_section))
    w.add_rope_dimension_sections(sections[:4])
    w.add_rope_freq_base(float(config.rope_theta))
    w.add_layer_norm_rms_eps(float(config.rms_norm_eps))
    w.add_key_length(config.head_dim)
    w.add_value_length(config.head_dim)
    w.add_file_type(_FILE_TYPES[quant])
    w.add_ssm_conv_kernel(config.linear_conv_kernel_dim)
    w.add_ssm_state_size(config.linear_key_head_dim)
    w.add_ssm_group_count(config.linear_num_key_heads)
    w.add_ssm_time_step_rank(config.linear_num_value_heads)
    w.add_ssm_inner_size(config.linear_value_head_dim * config.linear_num_value_heads)
    full = config.full_attention_layers
    w.add_full_attention_interval(full[0] + 1 if full else 4)
    w.add_rope_dimension_count(config.rotary_dim)
    w.add_quantization_version(gguf.GGML_QUANT_VERSION)
    _add_tokenizer(w, config.vocab_size)


def _gguf_name(tmap, name: str, kind: str) -> str:
    new, _ = _convert(name, torch.zeros(1)) if kind not in ("mat", "experts", "dense") else (name, None)
    gname = tmap.get_name(new, try_suffixes=(".weight", ".bias"))
    if gname is None:
        raise G906Error(f"no GGUF name for {name}")
    # stacked experts have no .weight in the HF-side name; llama.cpp's files do
    return gname + ".weight" if kind == "experts" and not gname.endswith(".weight") else gname


def _gguf_shape(kind: str, shp: tuple[int, ...]) -> tuple[int, ...]:
    if kind == "conv":
        return (shp[0], shp[-1])
    if kind == "dense" and shp[0] == 1:      # the shared-expert gate: llama.cpp's [n_embd]
        return (shp[-1],)
    return tuple(shp)


def _add_tensor_info(w, gguf, gname: str, gshape: tuple[int, ...], qt: str | None, kind: str, dense) -> None:
    """Header entry (numpy-order shape, bytes, GGML type) of one tensor."""
    from g906.engine.quant.dequant import block_geometry

    n = int(np.prod(gshape))
    if qt is not None:
        block, nbytes = block_geometry(qt)
        byte_shape = (*gshape[:-1], gshape[-1] // block * nbytes)
        w.add_tensor_info(gname, byte_shape, np.dtype(np.uint8), int(np.prod(byte_shape)),
                          raw_dtype=gguf.GGMLQuantizationType[qt])
    elif kind in ("mat", "experts") and dense == torch.bfloat16:
        byte_shape = (*gshape[:-1], gshape[-1] * 2)
        w.add_tensor_info(gname, byte_shape, np.dtype(np.uint8), n * 2, raw_dtype=gguf.GGMLQuantizationType.BF16)
    elif kind in ("mat", "experts"):
        item = 4 if dense == torch.float32 else 2
        w.add_tensor_info(gname, gshape, np.dtype(np.float32 if item == 4 else np.float16), n * item)
    else:                                     # norms, conv, A, dt bias, the router: F32 as the converter
        w.add_tensor_info(gname, gshape, np.dtype(np.float32), n * 4)


def _file_array(name: str, kind: str, t, dense) -> np.ndarray:
    """The bytes of one tensor as the file stores them."""
    if isinstance(t, (QuantizedTensor, QuantizedExperts)):
        return t.data.cpu().numpy()
    if kind not in ("mat", "experts"):
        _, val = _convert(name, t)
        arr = val.float().cpu().numpy().astype(np.float32)
        return arr.reshape(-1) if kind == "dense" and arr.shape[0] == 1 else arr
    if dense == torch.float32:
        return t.cpu().numpy().astype(np.float32)
    if dense == torch.bfloat16:
        return t.contiguous().view(torch.int16).cpu().numpy().view(np.uint8).reshape(*t.shape[:-1], -1)
    return t.cpu().numpy().astype(np.float16)
