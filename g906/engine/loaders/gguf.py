"""GGUF model files (single or split) as llama.cpp's convert_hf_to_gguf.py writes them.

    f = GGUFModelFile.open("Qwen3.5-27B-UD-Q4_K_XL-00001-of-00002.gguf")
    cfg = f.config()                      # ModelConfig (arch qwen35)
    for name, t in f.weights():           # HF names, HF semantics; quantized types stay quantized
        ...
    tok = f.tokenizer(); template = f.chat_template()

What the converter does to a Qwen3.5 checkpoint, and how this loader undoes it (details and
sources in docs/engine-gguf.md):

- zero-centred RMSNorm weights are stored with +1 added (all norms whose HF name ends in
  "norm.weight", including q_norm/k_norm and the MTP norms) except the linear-attention output
  norm (linear_attn.norm) -> 1 is subtracted again;
- A_log is stored as ssm_a = -exp(A_log) -> A_log = log(-ssm_a);
- conv1d [C, 1, K] is stored squeezed as [C, K] -> unsqueezed again;
- dt_bias is stored as ssm_dt.bias;
- when value heads outnumber key heads, V heads are reordered from grouped to tiled order in
  in_proj_qkv (V rows), in_proj_z, in_proj_a, in_proj_b (rows), A_log, dt_bias, conv1d (V
  channels) and out_proj (columns). That order is KEPT (ModelConfig.linear_v_head_order="tiled");
  see `tiled_to_grouped` for dense tensors;
- the MTP block (HF mtp.*) is appended as blocks [L, L+n) with nextn.* tensors for fc and its
  norms -> yielded under mtp.* names;
- a tied lm_head has no output.weight tensor -> ModelConfig.tie_word_embeddings=True and no
  lm_head.weight is yielded.
"""

from __future__ import annotations

import logging
import os
import re
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np
import torch

from g906 import data as _data
from g906.engine.config import ModelConfig
from g906.engine.weights import QuantizedTensor
from g906.errors import G906Error

if TYPE_CHECKING:  # pragma: no cover
    from g906.engine.tokenizer import Tokenizer

log = logging.getLogger(__name__)

GGUF_MAGIC = b"GGUF"
_SPLIT_RE = re.compile(r"^(?P<stem>.*)-(?P<no>\d{5})-of-(?P<count>\d{5})\.gguf$")

# blk.N.<suffix> -> (HF suffix under model.layers.N. / mtp.layers.J., transform)
_LAYER_MAP: dict[str, tuple[str, str]] = {
    "attn_norm.weight": ("input_layernorm.weight", "norm"),
    "post_attention_norm.weight": ("post_attention_layernorm.weight", "norm"),
    "attn_q.weight": ("self_attn.q_proj.weight", ""),
    "attn_k.weight": ("self_attn.k_proj.weight", ""),
    "attn_v.weight": ("self_attn.v_proj.weight", ""),
    "attn_output.weight": ("self_attn.o_proj.weight", ""),
    "attn_q_norm.weight": ("self_attn.q_norm.weight", "norm"),
    "attn_k_norm.weight": ("self_attn.k_norm.weight", "norm"),
    "attn_qkv.weight": ("linear_attn.in_proj_qkv.weight", ""),
    "attn_gate.weight": ("linear_attn.in_proj_z.weight", ""),
    "ssm_beta.weight": ("linear_attn.in_proj_b.weight", ""),
    "ssm_alpha.weight": ("linear_attn.in_proj_a.weight", ""),
    "ssm_conv1d.weight": ("linear_attn.conv1d.weight", "conv"),
    "ssm_dt.bias": ("linear_attn.dt_bias", ""),
    "ssm_a": ("linear_attn.A_log", "a_log"),
    "ssm_norm.weight": ("linear_attn.norm.weight", ""),
    "ssm_out.weight": ("linear_attn.out_proj.weight", ""),
    "ffn_gate.weight": ("mlp.gate_proj.weight", ""),
    "ffn_up.weight": ("mlp.up_proj.weight", ""),
    "ffn_down.weight": ("mlp.down_proj.weight", ""),
}
# MTP block-level tensors (on the first MTP block) -> HF names
_NEXTN_MAP: dict[str, tuple[str, str]] = {
    "nextn.eh_proj.weight": ("mtp.fc.weight", ""),
    "nextn.enorm.weight": ("mtp.pre_fc_norm_embedding.weight", "norm"),
    "nextn.hnorm.weight": ("mtp.pre_fc_norm_hidden.weight", "norm"),
    "nextn.shared_head_norm.weight": ("mtp.norm.weight", "norm"),
}
_GLOBAL_MAP: dict[str, tuple[str, str]] = {
    "token_embd.weight": ("model.embed_tokens.weight", ""),
    "output_norm.weight": ("model.norm.weight", "norm"),
    "output.weight": ("lm_head.weight", ""),
}
_LINEAR_ONLY = {k for k, (v, _) in _LAYER_MAP.items() if v.startswith("linear_attn.")}
_FULL_ONLY = {k for k, (v, _) in _LAYER_MAP.items() if v.startswith("self_attn.")}


@dataclass(frozen=True)
class TensorEntry:
    """One tensor of a (possibly split) GGUF file."""

    name: str
    type_id: int
    type_name: str       # ggml name (e.g. "Q4_K"), also for types g906 does not support
    shape: tuple[int, ...]  # torch order (outermost first), i.e. ggml ne reversed
    path: Path
    reader_index: int
    tensor_index: int


def _type_table() -> dict[str, dict]:
    return _data.load("quant_types")["types"]


def _ggml_type_name(type_id: int) -> str:
    import gguf

    try:
        return gguf.GGMLQuantizationType(type_id).name
    except ValueError:
        return f"type#{type_id}"


def shard_paths(path: str | os.PathLike[str]) -> list[Path]:
    """All files of a split set given any one of them (or [path] for a single file)."""
    p = Path(path)
    m = _SPLIT_RE.match(p.name)
    if not m:
        return [p]
    count = int(m.group("count"))
    if count < 1 or int(m.group("no")) < 1 or int(m.group("no")) > count:
        raise G906Error(f"{p}: the split file name says part {m.group('no')} of {m.group('count')}")
    paths = [p.with_name(f"{m.group('stem')}-{i:05d}-of-{count:05d}.gguf") for i in range(1, count + 1)]
    missing = [q.name for q in paths if not q.is_file()]
    if missing:
        raise G906Error(
            f"{p}: split GGUF set is incomplete: missing {', '.join(missing)} (in {p.parent})",
            hint="download every -0000k-of-0000N.gguf part into the same directory",
        )
    return paths


def _open_reader(path: Path):
    import gguf

    if not path.exists():
        raise G906Error(f"{path}: no such GGUF file")
    if not path.is_file():
        raise G906Error(f"{path}: not a regular file")
    try:
        size = path.stat().st_size
        with open(path, "rb") as fh:
            magic = fh.read(4)
    except OSError as exc:
        raise G906Error(f"{path}: cannot read the file: {exc.strerror or exc}") from None
    if magic != GGUF_MAGIC:
        raise G906Error(
            f"{path}: not a GGUF file (magic bytes {magic!r}, expected {GGUF_MAGIC!r})",
            hint="pass a .gguf model file, or an HF model directory for safetensors",
        )
    try:
        reader = gguf.GGUFReader(path, "c")  # private copy-on-write map: pages load lazily
    except Exception as exc:  # noqa: BLE001 - any parse failure is a bad file
        if "GGMLQuantizationType" in str(exc):
            raise G906Error(
                f"{path}: a tensor uses a type this gguf package does not know ({exc})",
                hint="supported types: " + ", ".join(_type_table()),
            ) from None
        raise G906Error(
            f"{path}: truncated or corrupt GGUF file ({size} bytes): {exc}",
            hint="an interrupted download? compare the size with the source and download it again",
        ) from None
    for t in reader.tensors:
        end = int(t.data_offset) + int(t.n_bytes)
        if end > size:
            raise G906Error(
                f"{path}: truncated: tensor {t.name} ends at byte {end} but the file has {size}",
                hint="download the file again",
            )
    return reader


def _field_value(field) -> Any:
    import gguf

    try:
        v = field.contents()
    except Exception:  # noqa: BLE001
        return None
    if field.types and field.types[0] == gguf.GGUFValueType.ARRAY and not isinstance(v, list):
        v = [v]
    return v


def _check_split_metadata(paths: list[Path], readers: list[Any]) -> None:
    if len(paths) > 1:
        f = readers[0].fields.get("split.count")
        count = _field_value(f) if f is not None else None
        if count is not None and int(count) != len(paths):
            raise G906Error(f"{paths[0]}: metadata says split.count={count} but the file names say {len(paths)}")
        for i, (p, r) in enumerate(zip(paths, readers)):
            f = r.fields.get("split.no")
            no = _field_value(f) if f is not None else None
            if no is not None and int(no) != i:
                raise G906Error(f"{p}: metadata says this is split part {int(no) + 1}, the name says {i + 1}")
    else:
        f = readers[0].fields.get("split.count")
        if f is not None and int(_field_value(f) or 1) > 1:
            raise G906Error(
                f"{paths[0]}: this is part of a {int(_field_value(f))}-file split set but its name "
                "does not follow NAME-0000k-of-0000N.gguf",
                hint="keep the original split file names",
            )


class _LazyMetadata(Mapping):
    """Metadata key -> python value, parsed on first access per key (token lists are big)."""

    def __init__(self, fields: Mapping[str, Any]):
        self._fields = dict(fields)
        self._cache: dict[str, Any] = {}

    def __getitem__(self, key: str) -> Any:
        if key not in self._cache:
            self._cache[key] = _field_value(self._fields[key])
        return self._cache[key]

    def __contains__(self, key: object) -> bool:  # without parsing the value
        return key in self._fields

    def __iter__(self):
        return iter(self._fields)

    def __len__(self) -> int:
        return len(self._fields)


class GGUFModelFile:
    """A memory-mapped GGUF model: one file or a complete split set."""

    def __init__(self, path: str | os.PathLike[str]):
        """Open `path`: a .gguf file or any part of a split set (all parts are opened)."""
        paths = shard_paths(path)
        readers = [_open_reader(p) for p in paths]
        _check_split_metadata(paths, readers)
        self.paths = paths
        self.path = paths[0]
        self._readers = readers
        fields: dict[str, Any] = {}
        for r in readers:  # metadata lives in the first shard; later shards only add split.*
            for k, f in r.fields.items():
                if k.startswith("GGUF."):
                    continue
                fields.setdefault(k, f)
        self.metadata: Mapping[str, Any] = _LazyMetadata(fields)
        self._tensors: dict[str, TensorEntry] = {}
        for ri, r in enumerate(readers):
            for ti, t in enumerate(r.tensors):
                if t.name in self._tensors:
                    raise G906Error(f"{paths[ri]}: tensor {t.name} appears twice in the split set")
                self._tensors[t.name] = TensorEntry(
                    name=t.name,
                    type_id=int(t.tensor_type),
                    type_name=_ggml_type_name(int(t.tensor_type)),
                    shape=tuple(int(x) for x in reversed(t.shape.tolist())),
                    path=paths[ri],
                    reader_index=ri,
                    tensor_index=ti,
                )
        self._config: ModelConfig | None = None
        self._validated = False

    # ------------------------------------------------------------------ opening

    @classmethod
    def open(cls, path: str | os.PathLike[str]) -> "GGUFModelFile":
        return cls(path)

    def __repr__(self) -> str:
        return f"GGUFModelFile({str(self.path)!r}, parts={len(self.paths)}, tensors={len(self._tensors)})"

    # ------------------------------------------------------------------ metadata

    @property
    def architecture(self) -> str | None:
        return self.metadata.get("general.architecture")

    def _arch_key(self, key: str, default: Any = None, *, required: bool = False) -> Any:
        arch = self.architecture
        full = f"{arch}.{key}"
        if full in self.metadata:
            return self.metadata[full]
        if required:
            raise G906Error(f"{self.path}: GGUF metadata lacks {full}",
                            hint="the file was not written by a Qwen3.5-aware converter")
        return default

    def tensor_names(self) -> list[str]:
        return list(self._tensors)

    def tensor_entry(self, name: str) -> TensorEntry:
        return self._tensors[name]

    def tensor_types(self) -> dict[str, int]:
        """GGML type name -> number of tensors of that type (e.g. {"Q4_K": 180, "F32": 300})."""
        out: dict[str, int] = {}
        for t in self._tensors.values():
            out[t.type_name] = out.get(t.type_name, 0) + 1
        return out

    def tensor_bytes(self) -> int:
        return sum(int(self._readers[t.reader_index].tensors[t.tensor_index].n_bytes) for t in self._tensors.values())

    @property
    def file_bytes(self) -> int:
        """Total size of the file(s) on disk."""
        return sum(p.stat().st_size for p in self.paths)

    def _check_arch(self) -> None:
        arch = self.architecture
        if arch is None:
            raise G906Error(f"{self.path}: GGUF metadata has no general.architecture")
        archs = _data.load("models").get("architectures", {})
        for key, info in archs.items():
            if arch in info.get("gguf", []):
                if info.get("embedded", True) is False:
                    raise G906Error(
                        f"{self.path}: architecture {arch!r} is not run by the embedded engine",
                        hint='use engine.kind = "vllm" in the recipe',
                    )
                if arch != "qwen35":
                    break
                return
        raise G906Error(
            f"{self.path}: unknown or unsupported architecture {arch!r}",
            hint="the embedded engine runs Qwen3.5 dense GGUF files (general.architecture = qwen35)",
        )

    def config(self) -> ModelConfig:
        if self._config is not None:
            return self._config
        self._check_arch()
        md = self.metadata
        k = self._arch_key
        total_layers = int(k("block_count", required=True))
        n_mtp = int(k("nextn_predict_layers", 0) or 0)
        n_layers = total_layers - n_mtp
        if n_layers <= 0:
            raise G906Error(f"{self.path}: block_count {total_layers} leaves no main layers "
                            f"after {n_mtp} MTP layer(s)")
        hidden = int(k("embedding_length", required=True))
        n_heads = k("attention.head_count", required=True)
        n_kv = k("attention.head_count_kv", n_heads)
        n_heads = _scalar_heads(n_heads)
        n_kv = _scalar_heads(n_kv)
        head_dim = int(k("attention.key_length", 0) or hidden // n_heads)
        rope_dim = int(k("rope.dimension_count", 0) or head_dim // 4)
        sections = [int(x) for x in (k("rope.dimension_sections", None) or [11, 11, 10])]
        while len(sections) > 3 and sections[-1] == 0:
            sections.pop()
        interval = int(k("full_attention_interval", 4) or 4)
        conv_k = int(k("ssm.conv_kernel", required=True))
        d_k = int(k("ssm.state_size", required=True))
        n_k = int(k("ssm.group_count", required=True))
        n_v = int(k("ssm.time_step_rank", required=True))
        inner = int(k("ssm.inner_size", required=True))
        if n_v <= 0 or inner % n_v:
            raise G906Error(f"{self.path}: ssm.inner_size {inner} is not a multiple of ssm.time_step_rank {n_v}")
        emb = self._tensors.get("token_embd.weight")
        if emb is None:
            raise G906Error(f"{self.path}: tensor token_embd.weight is missing")
        vocab = int(emb.shape[0])
        from g906.engine.tokenizer import gguf_eos_token_ids

        eos_ids = gguf_eos_token_ids(md)
        bos = md.get("tokenizer.ggml.bos_token_id")
        pad = md.get("tokenizer.ggml.padding_token_id")
        try:
            cfg = ModelConfig(
                vocab_size=vocab,
                hidden_size=hidden,
                intermediate_size=int(k("feed_forward_length", required=True)),
                num_hidden_layers=n_layers,
                num_attention_heads=n_heads,
                num_key_value_heads=n_kv,
                head_dim=head_dim,
                rms_norm_eps=_f32(k("attention.layer_norm_rms_epsilon", 1e-6)),
                rope_theta=_f32(k("rope.freq_base", 10_000_000.0)),
                partial_rotary_factor=rope_dim / head_dim,
                mrope_section=sections,
                mrope_interleaved=True,
                max_position_embeddings=int(k("context_length", 262_144)),
                layer_types=["full_attention" if (i + 1) % interval == 0 else "linear_attention"
                             for i in range(n_layers)],
                linear_conv_kernel_dim=conv_k,
                linear_key_head_dim=d_k,
                linear_value_head_dim=inner // n_v,
                linear_num_key_heads=n_k,
                linear_num_value_heads=n_v,
                # the converter reorders V heads whenever they outnumber K heads
                linear_v_head_order="tiled" if n_v != n_k else "grouped",
                tie_word_embeddings="output.weight" not in self._tensors,
                num_mtp_layers=n_mtp,
                bos_token_id=None if bos is None else int(bos),
                eos_token_ids=eos_ids,
                pad_token_id=None if pad is None else int(pad),
                architecture="qwen35",
            )
        except G906Error as exc:
            raise G906Error(f"{self.path}: {exc.message}", hint=exc.hint) from None
        self._config = cfg
        return cfg

    # ------------------------------------------------------------------ tensors

    def _expected_shapes(self) -> dict[str, tuple[int, ...]]:
        c = self.config()
        H, I = c.hidden_size, c.intermediate_size
        hd, nh, nkv = c.head_dim, c.num_attention_heads, c.num_key_value_heads
        nk, nv, dk, dv = (c.linear_num_key_heads, c.linear_num_value_heads,
                          c.linear_key_head_dim, c.linear_value_head_dim)
        conv = 2 * nk * dk + nv * dv
        full = {
            "attn_q.weight": (2 * nh * hd, H), "attn_k.weight": (nkv * hd, H),
            "attn_v.weight": (nkv * hd, H), "attn_output.weight": (H, nh * hd),
            "attn_q_norm.weight": (hd,), "attn_k_norm.weight": (hd,),
        }
        lin = {
            "attn_qkv.weight": (conv, H), "attn_gate.weight": (nv * dv, H),
            "ssm_beta.weight": (nv, H), "ssm_alpha.weight": (nv, H),
            "ssm_conv1d.weight": (conv, c.linear_conv_kernel_dim), "ssm_dt.bias": (nv,),
            "ssm_a": (nv,), "ssm_norm.weight": (dv,), "ssm_out.weight": (H, nv * dv),
        }
        common = {
            "attn_norm.weight": (H,), "post_attention_norm.weight": (H,),
            "ffn_gate.weight": (I, H), "ffn_up.weight": (I, H), "ffn_down.weight": (H, I),
        }
        exp: dict[str, tuple[int, ...]] = {
            "token_embd.weight": (c.vocab_size, H), "output_norm.weight": (H,),
        }
        if not c.tie_word_embeddings:
            exp["output.weight"] = (c.vocab_size, H)
        for i, kind in enumerate(c.layer_types):
            for suf, shp in {**common, **(full if kind == "full_attention" else lin)}.items():
                exp[f"blk.{i}.{suf}"] = shp
        return exp

    def _mtp_shapes(self) -> dict[str, tuple[int, ...]]:
        c = self.config()
        H = c.hidden_size
        out: dict[str, tuple[int, ...]] = {}
        L = c.num_hidden_layers
        if c.num_mtp_layers:
            out.update({f"blk.{L}.nextn.eh_proj.weight": (H, 2 * H), f"blk.{L}.nextn.enorm.weight": (H,),
                        f"blk.{L}.nextn.hnorm.weight": (H,), f"blk.{L}.nextn.shared_head_norm.weight": (H,)})
        hd, nh, nkv, I = c.head_dim, c.num_attention_heads, c.num_key_value_heads, c.intermediate_size
        for j in range(c.num_mtp_layers):
            b = L + j
            out.update({
                f"blk.{b}.attn_norm.weight": (H,), f"blk.{b}.post_attention_norm.weight": (H,),
                f"blk.{b}.attn_q.weight": (2 * nh * hd, H), f"blk.{b}.attn_k.weight": (nkv * hd, H),
                f"blk.{b}.attn_v.weight": (nkv * hd, H), f"blk.{b}.attn_output.weight": (H, nh * hd),
                f"blk.{b}.attn_q_norm.weight": (hd,), f"blk.{b}.attn_k_norm.weight": (hd,),
                f"blk.{b}.ffn_gate.weight": (I, H), f"blk.{b}.ffn_up.weight": (I, H),
                f"blk.{b}.ffn_down.weight": (H, I),
            })
        return out

    def validate(self) -> None:
        """Check architecture, tensor presence, shapes and types; raise G906Error naming the problem."""
        if self._validated:
            return
        self.config()
        supported = _type_table()
        expected = self._expected_shapes()
        for name, shape in expected.items():
            t = self._tensors.get(name)
            if t is None:
                raise G906Error(f"{self.path}: tensor {name} is missing",
                                hint="the file is incomplete or was written for another model layout")
            if tuple(t.shape) != tuple(shape):
                raise G906Error(
                    f"{t.path}: tensor {name} has shape {list(t.shape)}, expected {list(shape)} "
                    "from the model metadata")
        for name, shape in self._mtp_shapes().items():
            t = self._tensors.get(name)
            if t is not None and tuple(t.shape) != tuple(shape):
                raise G906Error(f"{t.path}: tensor {name} has shape {list(t.shape)}, expected {list(shape)}")
        for t in self._tensors.values():
            if t.type_name not in supported:
                raise G906Error(
                    f"{t.path}: tensor {t.name} has type {t.type_name}, which g906 does not support",
                    hint="supported types: " + ", ".join(supported)
                         + "; use a GGUF quantized with one of these",
                )
        self._validated = True

    def hf_name(self, gguf_name: str) -> tuple[str, str] | None:
        """GGUF tensor name -> (HF name, transform) or None for tensors g906 does not use."""
        if gguf_name in _GLOBAL_MAP:
            return _GLOBAL_MAP[gguf_name]
        m = re.match(r"^blk\.(\d+)\.(.+)$", gguf_name)
        if not m:
            return None
        b, suf = int(m.group(1)), m.group(2)
        c = self.config()
        L = c.num_hidden_layers
        if b < L:
            if suf in _LAYER_MAP:
                hf, tr = _LAYER_MAP[suf]
                return f"model.layers.{b}.{hf}", tr
            return None
        if b < L + c.num_mtp_layers:
            if suf in _NEXTN_MAP:
                return _NEXTN_MAP[suf]
            if suf in _LAYER_MAP and suf not in _LINEAR_ONLY:
                hf, tr = _LAYER_MAP[suf]
                return f"mtp.layers.{b - L}.{hf}", tr
        return None

    def raw_tensor(self, name: str) -> torch.Tensor | QuantizedTensor:
        """The tensor as stored (no semantic transform): dense torch tensor in the file dtype
        (F32/F16/BF16), or a QuantizedTensor for 2-D quantized data."""
        t = self._tensors[name]
        supported = _type_table()
        if t.type_name not in supported:
            raise G906Error(f"{t.path}: tensor {t.name} has type {t.type_name}, which g906 does not support",
                            hint="supported types: " + ", ".join(supported))
        rt = self._readers[t.reader_index].tensors[t.tensor_index]
        arr = rt.data
        if t.type_name == "F32":
            return torch.from_numpy(arr.view(np.float32)).reshape(t.shape)
        if t.type_name == "F16":
            return torch.from_numpy(arr.view(np.float16)).reshape(t.shape)
        raw = torch.from_numpy(arr.view(np.uint8))
        if t.type_name == "BF16":
            return raw.reshape(-1).view(torch.bfloat16).reshape(t.shape)
        if len(t.shape) == 2:
            return QuantizedTensor(raw.reshape(t.shape[0], -1), t.type_name, (t.shape[0], t.shape[1]))
        from g906.engine.quant.dequant import dequantize

        return dequantize(raw.reshape(-1, raw.shape[-1]), t.type_name, t.shape)

    def weights(self, *, include_mtp: bool = True, progress: bool = False) -> Iterator[tuple[str, torch.Tensor | QuantizedTensor]]:
        """(HF name, tensor) pairs with HF semantics (see the module docstring). Dense tensors keep
        the file dtype (float32 for norms and other transformed tensors); quantized 2-D tensors stay
        QuantizedTensor (raw blocks, memory-mapped). Linear-attention V heads stay in file order."""
        self.validate()
        for name in self._tensors:
            mapped = self.hf_name(name)
            if mapped is None:
                log.debug("%s: skipping tensor %s (not used by g906)", self.path, name)
                continue
            hf, tr = mapped
            if not include_mtp and hf.startswith("mtp."):
                continue
            t = self.raw_tensor(name)
            if tr:
                t = _transform(t, tr)
            yield hf, t

    def state_dict(self, *, include_mtp: bool = True) -> dict[str, torch.Tensor | QuantizedTensor]:
        return dict(self.weights(include_mtp=include_mtp))

    # ------------------------------------------------------------------ tokenizer / template

    def tokenizer(self) -> "Tokenizer | None":
        """The tokenizer rebuilt from metadata; None when the file carries no tokenizer."""
        from g906.engine.tokenizer import Tokenizer

        if "tokenizer.ggml.model" not in self.metadata:
            return None
        try:
            return Tokenizer.from_gguf_metadata(self.metadata)
        except G906Error as exc:
            raise G906Error(f"{self.path}: {exc.message}", hint=exc.hint) from None

    def chat_template(self) -> str | None:
        v = self.metadata.get("tokenizer.chat_template")
        return v if isinstance(v, str) and v else None


def _f32(v: Any) -> float:
    """A float32 metadata value as the shortest decimal that round-trips (1e-06, not 9.99e-07)."""
    return float(str(np.float32(v)))


def _scalar_heads(v: Any) -> int:
    if isinstance(v, list):  # per-layer head counts: linear layers carry 0
        nz = [int(x) for x in v if int(x)]
        return max(nz) if nz else 0
    return int(v)


def _dense(t: torch.Tensor | QuantizedTensor) -> torch.Tensor:
    if isinstance(t, QuantizedTensor):
        from g906.engine.quant.dequant import dequantize

        return dequantize(t.data, t.qtype, t.shape)
    return t


def _transform(t: torch.Tensor | QuantizedTensor, kind: str) -> torch.Tensor:
    x = _dense(t).to(torch.float32)
    if kind == "norm":
        return x - 1.0
    if kind == "a_log":
        return torch.log(-x)
    if kind == "conv":
        return x.reshape(x.shape[0], 1, x.shape[-1]).clone()
    raise AssertionError(kind)


# ---------------------------------------------------------------------- V-head order helpers


def _permute_heads(x: torch.Tensor, dim: int, outer: int, inner: int, head_dim: int) -> torch.Tensor:
    shape = list(x.shape)
    dim = dim % len(shape)
    y = x.reshape(*shape[:dim], outer, inner, head_dim, *shape[dim + 1:])
    return y.transpose(dim, dim + 1).reshape(shape)


def grouped_to_tiled(x: torch.Tensor, dim: int, num_k_heads: int, num_v_heads: int, head_dim: int) -> torch.Tensor:
    """V heads [k0v0, k0v1, ..., k1v0, ...] (HF) -> [k0v0, k1v0, ..., k0v1, ...] (llama.cpp)."""
    return _permute_heads(x, dim, num_k_heads, num_v_heads // num_k_heads, head_dim)


def tiled_to_grouped(x: torch.Tensor, dim: int, num_k_heads: int, num_v_heads: int, head_dim: int) -> torch.Tensor:
    """Inverse of grouped_to_tiled."""
    return _permute_heads(x, dim, num_v_heads // num_k_heads, num_k_heads, head_dim)


def linear_attn_to_grouped(name: str, t: torch.Tensor, cfg: ModelConfig) -> torch.Tensor:
    """Dense HF-named linear-attention tensor in tiled V order -> HF grouped order (identity for
    other tensors or when cfg.linear_v_head_order is already "grouped")."""
    return _reorder_linear(name, t, cfg, tiled_to_grouped)


def linear_attn_to_tiled(name: str, t: torch.Tensor, cfg: ModelConfig) -> torch.Tensor:
    """Dense HF-named linear-attention tensor in grouped V order -> tiled order."""
    return _reorder_linear(name, t, cfg, grouped_to_tiled)


def _reorder_linear(name: str, t: torch.Tensor, cfg: ModelConfig, fn) -> torch.Tensor:
    nk, nv = cfg.linear_num_key_heads, cfg.linear_num_value_heads
    if nk == nv or ".linear_attn." not in name:
        return t
    dk, dv = cfg.linear_key_head_dim, cfg.linear_value_head_dim
    qk = 2 * nk * dk
    if name.endswith("in_proj_qkv.weight") or name.endswith("conv1d.weight"):
        return torch.cat([t[:qk], fn(t[qk:], 0, nk, nv, dv)], dim=0)
    if name.endswith("in_proj_z.weight"):
        return fn(t, 0, nk, nv, dv)
    if name.endswith(("in_proj_a.weight", "in_proj_b.weight", "A_log", "dt_bias")):
        return fn(t, 0, nk, nv, 1)
    if name.endswith("out_proj.weight"):
        return fn(t, 1, nk, nv, dv)
    return t


def open_gguf(path: str | os.PathLike[str]) -> GGUFModelFile:
    return GGUFModelFile.open(path)


__all__ = [
    "GGUFModelFile", "TensorEntry", "grouped_to_tiled", "linear_attn_to_grouped", "linear_attn_to_tiled",
    "open_gguf", "shard_paths", "tiled_to_grouped",
]

