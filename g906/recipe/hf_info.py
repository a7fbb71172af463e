"""What resolve() needs from a Hugging Face model directory: config.json (architecture,
quantization, facts), the safetensors files (all present, headers readable) and the
tokenizer files. Problems are ModelFileErrors (fatal) or warnings (returned)."""

from __future__ import annotations

import json
import struct
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from g906.recipe.gguf_info import ModelFileError

TOKENIZER_FILES = ("tokenizer.json", "tokenizer_config.json", "vocab.json", "merges.txt",
                   "special_tokens_map.json", "chat_template.jinja", "chat_template.json",
                   "generation_config.json", "preprocessor_config.json", "video_preprocessor_config.json")
_MAX_ST_HEADER = 100 * 1024 * 1024


@dataclass
class HFInfo:
    config: dict[str, Any]
    architecture: str | None
    quant_method: str | None                 # quantization_config.quant_method, lower case
    weight_files: list[Path] = field(default_factory=list)
    other_files: list[Path] = field(default_factory=list)
    facts: dict[str, Any] = field(default_factory=dict)
    warnings: list[str] = field(default_factory=list)

    @property
    def multimodal(self) -> bool:
        return isinstance(self.config.get("vision_config"), dict)


def read_json(path: Path) -> Any:
    try:
        text = path.read_text(encoding="utf-8")
    except UnicodeDecodeError:
        raise ModelFileError(f"{path} is not UTF-8 text") from None
    except OSError as exc:
        raise ModelFileError(f"cannot read {path}: {exc.strerror or exc}") from None
    try:
        return json.loads(text)
    except json.JSONDecodeError as exc:
        raise ModelFileError(f"{path}:{exc.lineno}:{exc.colno}: invalid JSON: {exc.msg}") from None


_DTYPE_BYTES = {"F64": 8, "F32": 4, "F16": 2, "BF16": 2, "I64": 8, "I32": 4, "I16": 2, "I8": 1, "U8": 1,
                "BOOL": 1, "F8_E4M3": 1, "F8_E5M2": 1}


_EXPERTS = "__routed_experts__"      # pseudo-dtype: bytes of the routed experts' tensors (MoE)


def _safetensors_header_ok(path: Path) -> dict[str, int]:
    """Check the header; return the data bytes per dtype ({"I32": n, "BF16": n, ...}), and under
    _EXPERTS the bytes of the routed experts' tensors (mlp.experts.*, the MTP block's aside)."""
    try:
        with open(path, "rb") as f:
            head = f.read(8)
            if len(head) < 8:
                raise ModelFileError(f"{path} is not a safetensors file (shorter than 8 bytes)")
            (n,) = struct.unpack("<Q", head)
            size = path.stat().st_size
            if n == 0 or n > _MAX_ST_HEADER or 8 + n > size:
                raise ModelFileError(f"{path} is not a safetensors file or is truncated (header length {n}, file {size} bytes)",
                                     "download it again")
            meta = json.loads(f.read(n).decode("utf-8"))
            if not isinstance(meta, dict):
                raise ValueError("header is not a JSON object")
            by_dtype: dict[str, int] = {}
            for name, t in meta.items():
                if name == "__metadata__" or not isinstance(t, dict):
                    continue
                off = t.get("data_offsets")
                if isinstance(off, list) and len(off) == 2 and all(isinstance(v, int) for v in off):
                    dt = str(t.get("dtype"))
                    by_dtype[dt] = by_dtype.get(dt, 0) + off[1] - off[0]
                    if ".mlp.experts." in name and not name.startswith("mtp."):
                        by_dtype[_EXPERTS] = by_dtype.get(_EXPERTS, 0) + off[1] - off[0]
            return by_dtype
    except ModelFileError:
        raise
    except (OSError, ValueError, UnicodeDecodeError) as exc:
        raise ModelFileError(f"{path} has a damaged safetensors header ({exc})", "download it again") from None


def inspect_hf_dir(path: Path) -> HFInfo:
    cfg_path = path / "config.json"
    if not cfg_path.is_file():
        ggufs = sorted(p.name for p in path.glob("*.gguf") if "mmproj" not in p.name.lower())
        help = (f"it holds GGUF files: set model.source to the file, e.g. \"{path.name}/{ggufs[0]}\"" if ggufs else
                "model.source is a GGUF file, a directory with config.json and *.safetensors, or builtin:<name>")
        raise ModelFileError(f"{path} has no config.json, so it is not a Hugging Face model directory", help)
    config = read_json(cfg_path)
    if not isinstance(config, dict):
        raise ModelFileError(f"{cfg_path} does not hold a JSON object")
    archs = config.get("architectures")
    arch = archs[0] if isinstance(archs, list) and archs and isinstance(archs[0], str) else None
    from g906.arch.hf_quant import QuantSchemeError, quant_config_of

    try:
        qc = quant_config_of(config, path)
    except QuantSchemeError as exc:
        raise ModelFileError(exc.message) from None
    if qc is not None and config.get("quantization_config") is None:
        config["quantization_config"] = qc       # one place for the resolver to read it from
    qm = qc.get("quant_method") if isinstance(qc, dict) else None
    info = HFInfo(config=config, architecture=arch, quant_method=qm.lower() if isinstance(qm, str) else None)

    index_path = path / "model.safetensors.index.json"
    if index_path.is_file():
        index = read_json(index_path)
        wm = index.get("weight_map") if isinstance(index, dict) else None
        if not isinstance(wm, dict):
            raise ModelFileError(f"{index_path} has no weight_map")
        names = sorted({v for v in wm.values() if isinstance(v, str)})
        missing = [n for n in names if not (path / n).is_file()]
        if missing:
            raise ModelFileError(
                f"{path} is missing {len(missing)} of {len(names)} weight files named in "
                f"model.safetensors.index.json: {', '.join(missing[:4])}{' ...' if len(missing) > 4 else ''}",
                "the download is incomplete; fetch the missing files",
            )
        info.weight_files = [path / n for n in names]
        info.other_files.append(index_path)
    else:
        info.weight_files = sorted(path.glob("*.safetensors"))
    if not info.weight_files:
        bins = sorted(p.name for p in path.glob("*.bin"))
        help = ("g906 reads safetensors; convert the PyTorch .bin weights first" if bins
                else "the download is incomplete, or this is not a model directory")
        raise ModelFileError(f"{path} has no *.safetensors weight files", help)
    by_dtype: dict[str, int] = {}
    for w in info.weight_files:
        for dt, n in _safetensors_header_ok(w).items():
            by_dtype[dt] = by_dtype.get(dt, 0) + n

    info.other_files[:0] = [cfg_path]
    info.other_files += [path / n for n in TOKENIZER_FILES if (path / n).is_file()]
    if not (path / "tokenizer.json").is_file():
        info.warnings.append(f"{path} has no tokenizer.json (the embedded engine needs it)")
    info.facts = config_facts(config)
    info.facts["weights_bytes"] = sum(w.stat().st_size for w in info.weight_files)
    expert_bytes = by_dtype.pop(_EXPERTS, 0)
    info.facts["weights_bytes_by_dtype"] = by_dtype
    if expert_bytes and qm is not None:
        # packed experts are resident as stored (the engine never unpacks them): the doctor's
        # active-bytes estimate takes their real size, not one from the shapes and the dtype
        info.facts["expert_bytes"] = expert_bytes
    return info


_HF_FACTS = ("num_hidden_layers", "hidden_size", "intermediate_size", "num_attention_heads",
             "num_key_value_heads", "head_dim", "vocab_size", "full_attention_interval",
             "linear_num_key_heads", "linear_num_value_heads", "linear_key_head_dim",
             "linear_value_head_dim", "linear_conv_kernel_dim", "num_experts", "num_experts_per_tok",
             "moe_intermediate_size", "shared_expert_intermediate_size")


def config_facts(config: dict[str, Any]) -> dict[str, Any]:
    text = config.get("text_config") if isinstance(config.get("text_config"), dict) else config
    facts: dict[str, Any] = {}
    for k in _HF_FACTS:
        v = text.get(k, config.get(k))
        if isinstance(v, int) and not isinstance(v, bool):
            facts[k] = v
    ctx = text.get("max_position_embeddings", config.get("max_position_embeddings"))
    if isinstance(ctx, int) and not isinstance(ctx, bool):
        facts["context_length"] = ctx
    dt = text.get("torch_dtype") or text.get("dtype") or config.get("torch_dtype") or config.get("dtype")
    if isinstance(dt, str):
        facts["torch_dtype"] = dt
    mtp = text.get("mtp_num_hidden_layers", config.get("mtp_num_hidden_layers"))
    facts["num_mtp_layers"] = mtp if isinstance(mtp, int) and not isinstance(mtp, bool) else 0
    facts["multimodal"] = isinstance(config.get("vision_config"), dict)
    return facts
