"""Real model files for the recipe tests: tiny GGUFs (gguf.GGUFWriter), split sets, mmproj
files and Hugging Face directories (config.json + safetensors)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import numpy as np

REPO = Path(__file__).resolve().parents[2]
RECIPES = sorted((REPO / "recipes").glob("*.toml"))


def write_gguf(path: Path, arch: str = "qwen35", *, context_length: int = 4096, quant: bool = True,
               split_max_tensors: int = 0, nextn: int = 0) -> Path:
    from gguf import GGMLQuantizationType, GGUFWriter
    from gguf.quants import quantize

    w = GGUFWriter(str(path), arch, split_max_tensors=split_max_tensors)
    w.add_name("tiny test model")
    if arch != "clip":
        w.add_block_count(4)
        w.add_context_length(context_length)
        w.add_embedding_length(64)
        w.add_feed_forward_length(128)
        w.add_head_count(4)
        w.add_head_count_kv(2)
        if nextn:
            w.add_uint32(f"{arch}.nextn_predict_layers", nextn)
    w.add_tensor("token_embd.weight", np.zeros((8, 64), dtype=np.float16))
    w.add_tensor("output_norm.weight", np.ones((64,), dtype=np.float32))
    if quant:
        q = quantize(np.zeros((8, 64), dtype=np.float32), GGMLQuantizationType.Q8_0)
        w.add_tensor("blk.0.ffn_up.weight", q, raw_dtype=GGMLQuantizationType.Q8_0)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    return path


def write_hf_dir(path: Path, *, vision: bool = False, quant_method: str | None = None,
                 architectures: list[str] | None = None, tokenizer: bool = True, mtp: int = 0) -> Path:
    from safetensors.numpy import save_file

    path.mkdir(parents=True, exist_ok=True)
    text = {"num_hidden_layers": 4, "hidden_size": 64, "intermediate_size": 128, "num_attention_heads": 4,
            "num_key_value_heads": 2, "head_dim": 16, "vocab_size": 256, "max_position_embeddings": 8192,
            "full_attention_interval": 4}
    if mtp:
        text["mtp_num_hidden_layers"] = mtp
    config: dict = {"architectures": architectures or ["Qwen3_5ForConditionalGeneration"], "text_config": text}
    if vision:
        config["vision_config"] = {"depth": 2, "hidden_size": 32}
    if quant_method:
        config["quantization_config"] = {"quant_method": quant_method, "bits": 4}
    (path / "config.json").write_text(json.dumps(config))
    save_file({"model.embed_tokens.weight": np.zeros((8, 4), dtype=np.float16)}, str(path / "model.safetensors"))
    if tokenizer:
        (path / "tokenizer.json").write_text("{}")
    return path


def run_g906(*args: str, cwd: Path | None = None) -> subprocess.CompletedProcess:
    """The real command, in a subprocess."""
    env = dict(os.environ)
    env.pop("G906_DEBUG", None)
    return subprocess.run([sys.executable, "-m", "g906", *args], capture_output=True, text=True,
                          cwd=cwd or REPO, env=env, timeout=120)
