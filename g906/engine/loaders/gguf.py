"""GGUF model files (single or split) as llama.cpp's convert_hf_to_gguf.py writes them.

    f = GGUFModelFile.open("Qwen3.5-27B-UD-Q4_K_XL-00001-of-00002.gguf")
    cfg = f.config()                      # ModelConfig, mapped by the file's g906.arch module
    for name, t in f.weights():           # HF names, HF semantics; quantized types stay quantized
        ...
    tok = f.tokenizer(); template = f.chat_template()

The architecture module (g906/arch/<arch>.py) names every tensor and its transform; this file
reads the tensors and applies the transforms. What the converter does to a Qwen3.5 checkpoint,
and how the loader undoes it (details and sources in docs/engine-gguf.md):

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

from g906.arch import quant as _quant
from g906.arch import registry as _arch
from g906.arch.config import ModelConfig
from g906.binfmt.gguf import GGUFFile, GGUFFormatError, NotGGUFError, TensorInfo, UnknownTensorTypeError
from g906.engine.weights import QuantizedExperts, QuantizedTensor
from g906.errors import G906Error

if TYPE_CHECKING:  # pragma: no cover
    from g906.engine.tokenizer import Tokenizer

log = logging.getLogger(__name__)

_SPLIT_RE = re.compile(r"^(?P<stem>.*)-(?P<no>\d{5})-of-(?P<count>\d{5})\.gguf$")

@dataclass(frozen=True)
class TensorEntry:
    """One tensor of a (possibly split) GGUF file."""

    name: str
    type_id: int
    type_name: str       # ggml name (e.g. "Q4_K"), also for types g906 does not support
    shape: tuple[int, ...]  # torch order (outermost first), i.e. ggml ne reversed
    path: Path
    file_index: int      # which part of a split set
    info: TensorInfo     # the part's tensor table entry (offset, n_bytes)


def _type_table() -> dict[str, dict]:
    return _quant.gguf_types()


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


def _open_file(path: Path) -> GGUFFile:
    if not path.exists():
        raise G906Error(f"{path}: no such GGUF file")
    if not path.is_file():
        raise G906Error(f"{path}: not a regular file")
    try:
        f = GGUFFile(path, "c")  # private copy-on-write map: pages load lazily, views are writable
    except NotGGUFError as exc:
        raise G906Error(f"{path}: {exc.detail}",
                        hint="pass a .gguf model file, or an HF model directory for safetensors") from None
    except UnknownTensorTypeError as exc:
        raise G906Error(f"{path}: {exc.detail}", hint="supported types: " + ", ".join(_type_table())) from None
    except GGUFFormatError as exc:
        raise G906Error(
            f"{path}: truncated or corrupt GGUF file ({path.stat().st_size} bytes): {exc.located}",
            hint="an interrupted download? compare the size with the source and download it again",
        ) from None
    except OSError as exc:
        raise G906Error(f"{path}: cannot read the file: {exc.strerror or exc}") from None
    _check_tensor_layout(f)
    return f


def _check_tensor_layout(f: GGUFFile) -> None:
    """GGUF writers (gguf-py, llama.cpp) lay tensors end to end, each padded to the alignment:
    two tensors sharing bytes, or bytes no tensor uses, mean a damaged table (a changed type or
    shape whose data would be read from the wrong place). The reader already refused unaligned
    offsets and data past the end of the file."""
    spans = sorted((t.data_start, t.data_start + t.n_bytes, t.name) for t in f.tensors)
    prev_end, prev = f.data_offset, None
    for begin, end, name in spans:
        if begin < prev_end:
            raise G906Error(f"{f.path}: tensors {prev} and {name} overlap in the file",
                            hint="the file is corrupt: download it again")
        if begin - prev_end >= f.alignment:
            raise G906Error(f"{f.path}: {begin - prev_end} bytes before tensor {name} belong to no tensor: the "
                            "file's tensor table is corrupt", hint="download the file again")
        prev_end, prev = end, name


def _python_value(value: Any) -> Any:
    """Metadata as the engine consumes it: numeric arrays as lists (of lists when nested)."""
    if isinstance(value, np.ndarray):
        return value.tolist()
    if isinstance(value, list) and value and not isinstance(value[0], str):
        return [_python_value(v) for v in value]
    return value


def _check_split_metadata(paths: list[Path], files: list[GGUFFile]) -> None:
    count = files[0].get("split.count")
    if len(paths) > 1:
        if count is not None and int(count) != len(paths):
            raise G906Error(f"{paths[0]}: metadata says split.count={count} but the file names say {len(paths)}")
        for i, (p, f) in enumerate(zip(paths, files)):
            no = f.get("split.no")
            if no is not None and int(no) != i:
                raise G906Error(f"{p}: metadata says this is split part {int(no) + 1}, the name says {i + 1}")
    elif count is not None and int(count or 1) > 1:
        raise G906Error(
            f"{paths[0]}: this is part of a {int(count)}-file split set but its name "
            "does not follow NAME-0000k-of-0000N.gguf",
            hint="keep the original split file names",
        )


class _LazyMetadata(Mapping):
    """Metadata key -> python value; numeric arrays become lists on first access per key."""

    def __init__(self, fields: Mapping[str, Any]):
        self._fields = dict(fields)
        self._cache: dict[str, Any] = {}

    def __getitem__(self, key: str) -> Any:
        if key not in self._cache:
            self._cache[key] = _python_value(self._fields[key].value)
        return self._cache[key]

    def __contains__(self, key: object) -> bool:
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
        files = [_open_file(p) for p in paths]
        _check_split_metadata(paths, files)
        self.paths = paths
        self.path = paths[0]
        self._files = files
        fields: dict[str, Any] = {}
        for f in files:  # metadata lives in the first shard; later shards only add split.*
            for k, fld in f.fields.items():
                fields.setdefault(k, fld)
        self.metadata: Mapping[str, Any] = _LazyMetadata(fields)
        self._tensors: dict[str, TensorEntry] = {}
        for fi, f in enumerate(files):
            for t in f.tensors:
                if t.name in self._tensors:
                    raise G906Error(f"{paths[fi]}: tensor {t.name} appears twice in the split set")
                self._tensors[t.name] = TensorEntry(
                    name=t.name,
                    type_id=int(t.type),
                    type_name=t.type_name,
                    shape=t.shape,
                    path=paths[fi],
                    file_index=fi,
                    info=t,
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
        return sum(t.info.n_bytes for t in self._tensors.values())

    @property
    def file_bytes(self) -> int:
        """Total size of the file(s) on disk."""
        return sum(p.stat().st_size for p in self.paths)

    def arch(self):
        """The g906.arch Architecture of this file (G906Error when the engine does not run it)."""
        return _arch.for_engine(self.architecture, str(self.path))

    def config(self) -> ModelConfig:
        if self._config is not None:
            return self._config
        from g906.engine.tokenizer import gguf_eos_token_ids

        shapes = {name: t.shape for name, t in self._tensors.items()}
        try:
            cfg = _arch.config_from_gguf(self.metadata, shapes, str(self.path))
        except G906Error as exc:
            if str(self.path) in exc.message:
                raise
            raise G906Error(f"{self.path}: {exc.message}", hint=exc.hint) from None
        except (TypeError, ValueError, ZeroDivisionError, AttributeError) as exc:
            raise G906Error(f"{self.path}: a metadata value has the wrong type or is out of range "
                            f"({type(exc).__name__}: {exc})", hint="the file is damaged") from None
        cfg.eos_token_ids = gguf_eos_token_ids(self.metadata)
        self._config = cfg
        return cfg

    # ------------------------------------------------------------------ tensors

    def validate(self) -> None:
        """Check architecture, tensor presence, shapes and types; raise G906Error naming the problem."""
        if self._validated:
            return
        self.config()
        supported = _type_table()
        expected = self.arch().gguf_shapes(self.config(), self._tensors)
        for name, shape in expected.items():
            t = self._tensors.get(name)
            if t is None:
                raise G906Error(f"{self.path}: tensor {name} is missing",
                                hint="the file is incomplete or was written for another model layout")
            if not _same_shape(t.shape, shape):
                raise G906Error(
                    f"{t.path}: tensor {name} has shape {list(t.shape)}, expected {list(shape)} "
                    "from the model metadata")
        for name, shape in self.arch().gguf_optional_shapes(self.config(), self._tensors).items():
            t = self._tensors.get(name)
            if t is not None and not _same_shape(t.shape, shape):
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
        return self.arch().gguf_to_hf(gguf_name, self.config())

    def raw_tensor(self, name: str) -> torch.Tensor | QuantizedTensor:
        """The tensor as stored (no semantic transform): dense torch tensor in the file dtype
        (F32/F16/BF16), a QuantizedTensor for 2-D quantized data, QuantizedExperts for 3-D
        (stacked experts)."""
        t = self._tensors[name]
        supported = _type_table()
        if t.type_name not in supported:
            raise G906Error(f"{t.path}: tensor {t.name} has type {t.type_name}, which g906 does not support",
                            hint="supported types: " + ", ".join(supported))
        arr = self._files[t.file_index].tensor_data(t.info)
        if t.type_name == "F32":
            return torch.from_numpy(arr.view(np.float32)).reshape(t.shape)
        if t.type_name == "F16":
            return torch.from_numpy(arr.view(np.float16)).reshape(t.shape)
        raw = torch.from_numpy(arr.view(np.uint8))
        if t.type_name == "BF16":
            return raw.reshape(-1).view(torch.bfloat16).reshape(t.shape)
        if len(t.shape) == 2:
            return QuantizedTensor(raw.reshape(t.shape[0], -1), t.type_name, (t.shape[0], t.shape[1]))
        if len(t.shape) == 3:  # stacked experts: the routed kernels read the chosen ones in place
            return QuantizedExperts(raw.reshape(t.shape[0], t.shape[1], -1), t.type_name, t.shape)
        from g906.engine.quant.dequant import dequantize

        return dequantize(raw.reshape(-1, raw.shape[-1]), t.type_name, t.shape)

    def weights(self, *, include_mtp: bool = True, progress: bool = False) -> Iterator[tuple[str, torch.Tensor | QuantizedTensor]]:
        """(HF name, tensor) pairs with HF semantics (see the module docstring). Dense tensors keep
        the file dtype (float32 for norms and other transformed tensors); quantized 2-D tensors stay
        QuantizedTensor (raw blocks, memory-mapped). Linear-attention V heads stay in file order."""
        from g906.engine.progress import Step

        self.validate()
        label = f"Loading {self.path.name}" + (f" (+{len(self.paths) - 1} parts)" if len(self.paths) > 1 else "")
        with Step(label, total=self.tensor_bytes(), unit="bytes", count_noun="tensors", enabled=progress) as step:
            for name in self._tensors:
                entry = self._tensors[name]
                nbytes = entry.info.n_bytes
                mapped = self.hf_name(name)
                if mapped is None:
                    log.debug("%s: skipping tensor %s (not used by g906)", self.path, name)
                    step.advance(nbytes)
                    continue
                hf, tr = mapped
                if not include_mtp and hf.startswith("mtp."):
                    step.advance(nbytes)
                    continue
                t = self.raw_tensor(name)
                if tr:
                    t = _transform(t, tr)
                yield hf, t
                step.advance(nbytes, count=1)      # after the model took it: its copy is part of the load

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
        except Exception as exc:  # noqa: BLE001 - the tokenizers library's own errors: a corrupt vocabulary
            raise G906Error(f"{self.path}: the tokenizer in the metadata (tokenizer.ggml.tokens / "
                            f"tokenizer.ggml.merges) is corrupt: {type(exc).__name__}: {exc}",
                            hint="the file is damaged: download it again") from None

    def chat_template(self) -> str | None:
        v = self.metadata.get("tokenizer.chat_template")
        return v if isinstance(v, str) and v else None


def _same_shape(got: tuple[int, ...], want: tuple[int, ...]) -> bool:
    """Equal shapes; a vector may also come as one row [1, n] (a converter that kept the HF
    [1, H] of a gate vector)."""
    got, want = tuple(got), tuple(want)
    return got == want or (len(want) == 1 and got == (1, *want))


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

