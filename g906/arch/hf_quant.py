"""Hugging Face quantized checkpoints, torch-free: config.json's quantization_config read into
one HFQuant (which modules are quantized, with which bits, groups and zero-point convention),
checked against the capability table (g906/data/quant_types.toml [hf.*]).

The recipe resolver (refusals, TP group alignment), the doctor and the engine's loader
(g906/engine/loaders/hf_quant.py) all read a checkpoint's scheme through parse_quant_config,
so a scheme the engine would misread is refused before anything loads.

Facts of the formats (from their quantizers' sources):
  gptq   qweight int32 [K / P, N] (P = 32 / bits values a word, packed along the input
         features K), qzeros int32 [G, N / P] (packed along the outputs), scales [G, N], g_idx
         [K] (the group of each input feature; act order = desc_act). value = (q - z) * s; the
         v1 layout (checkpoint_format "gptq") stores z - 1, gptq_v2 stores z. `dynamic`
         ("-:regex" leaves a module unquantized, "+:regex" / "regex" overrides bits, group_size,
         sym, desc_act) and modules_to_not_convert name per-module exceptions.
  awq    (version "gemm") qweight int32 [K, N / 8], qzeros int32 [G, N / 8], both packed along
         the outputs in the order 0 2 4 6 1 3 5 7 within a word; scales [G, N]; zero points
         stored as they are. modules_to_not_convert lists 16-bit modules.
  compressed-tensors ("pack-quantized") weight_packed int32 [N, K / P] (packed along K, values
         offset by 2 ** (bits - 1)), weight_scale [N, G], weight_zero_point int32 [N / P, G]
         (asymmetric only, same offset, packed along N), weight_shape, weight_g_idx (act order).
         config_groups' targets ("Linear", "re:<regex>", names) and `ignore` pick the modules.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from typing import Any, Iterable

from g906 import data as _data
from g906.errors import G906Error


class QuantSchemeError(G906Error):
    """A quantization_config the embedded engine does not run (the message names the scheme
    and what is supported)."""


@dataclass(frozen=True)
class LayerQuant:
    """How one module's weight is stored."""

    bits: int
    group_size: int          # -1: one group per output row (per-channel)
    sym: bool
    act_order: bool          # groups in activation order (g_idx not k // group_size)
    zero_offset: int = 0     # added to stored zero points (GPTQ v1 stores z - 1)

    def describe(self) -> str:
        g = "per-channel" if self.group_size == -1 else f"group {self.group_size}"
        return f"{self.bits}-bit, {g}, {'symmetric' if self.sym else 'asymmetric'}" + (", act-order" if self.act_order else "")


@dataclass(frozen=True)
class _Rule:
    pattern: str             # regex (re.match / re.search per format) or exact name
    regex: bool
    search: bool             # substring / re.search semantics instead of a match from the start
    scheme: LayerQuant | None  # None: left unquantized
    by_class: bool = False   # compressed-tensors "Linear": any linear module, after named targets

    def matches(self, module: str) -> bool:
        if not self.regex:
            return module == self.pattern or (self.search and self.pattern in module)
        return bool((re.search if self.search else re.match)(self.pattern, module))


@dataclass(frozen=True)
class HFQuant:
    method: str              # gptq | awq | compressed-tensors
    format: str              # gptq | gptq_v2 | gemm | pack-quantized
    default: LayerQuant | None
    rules: tuple[_Rule, ...] = field(default_factory=tuple)
    # compressed-tensors: which modules the groups target at all (None: every linear module)
    targets: tuple[_Rule, ...] | None = None

    @property
    def vllm(self) -> str:
        return str(table()[self.method]["vllm"])

    def scheme_for(self, module: str) -> LayerQuant | None:
        """The scheme of module (its checkpoint name without ".weight"), or None when the config
        leaves it in 16 bit. The first matching rule wins."""
        for rule in self.rules:
            if rule.matches(module):
                return rule.scheme
        if self.targets is not None:
            for rule in self.targets:
                if rule.matches(module):
                    return rule.scheme
            return None
        return self.default

    def schemes(self) -> list[LayerQuant]:
        out = [self.default] if self.default else []
        out += [r.scheme for r in (*self.rules, *(self.targets or ())) if r.scheme is not None]
        return out

    def describe(self) -> str:
        kinds = sorted({s.describe() for s in self.schemes()})
        return f"{table()[self.method]['name']} ({self.format}): " + "; ".join(kinds)


def table() -> dict[str, dict[str, Any]]:
    """quant_method -> {name, bits, formats, vllm} (g906/data/quant_types.toml [hf.*])."""
    return _data.load("quant_types")["hf"]


def supported_summary() -> str:
    parts = []
    for t in table().values():
        bits = "/".join(str(b) for b in t["bits"])
        parts.append(f"{t['name']} {bits}-bit ({', '.join(t['formats'])})")
    return "; ".join(parts) + "; and GGUF files"


def _refuse(scheme: str, where: str = "config.json quantization_config") -> QuantSchemeError:
    return QuantSchemeError(
        f"the model is quantized with {scheme} ({where}), which g906's embedded engine does not run",
        hint="it runs: " + supported_summary() + '; engine.kind = "vllm" hands other schemes to vLLM')


def _int(v, what: str, scheme: str) -> int:
    if isinstance(v, bool) or not isinstance(v, int):
        raise QuantSchemeError(f"{scheme}: {what} = {v!r} is not an integer (config.json quantization_config)")
    return v


def _bits(method: str, bits: int) -> int:
    t = table()[method]
    if bits not in t["bits"]:
        raise _refuse(f"{t['name']} {bits}-bit")
    return bits


def _group(gs: int, scheme: str) -> int:
    if gs != -1 and gs <= 0:
        raise QuantSchemeError(f"{scheme}: group_size = {gs} is neither -1 nor a positive size "
                               "(config.json quantization_config)")
    return gs


def quant_config_of(config: dict, directory=None) -> Any:
    """The quantization_config of a config.json (or of its text_config); for an older AutoGPTQ
    directory whose config.json has none, its quantize_config.json (a GPTQ config)."""
    qc = config.get("quantization_config")
    if qc is None and isinstance(config.get("text_config"), dict):
        qc = config["text_config"].get("quantization_config")
    if qc is None and directory is not None:
        import json
        from pathlib import Path

        p = Path(directory) / "quantize_config.json"
        if p.is_file():
            try:
                qc = json.loads(p.read_text(encoding="utf-8"))
            except (OSError, ValueError) as exc:
                raise QuantSchemeError(f"{p}: unreadable ({exc})") from None
            if isinstance(qc, dict):
                qc = {"quant_method": "gptq", **qc}
    return qc


def parse_quant_config(qc: Any) -> HFQuant | None:
    """config.json's quantization_config as an HFQuant; None when there is none. Raises
    QuantSchemeError for a scheme the engine does not run (FP8, NVFP4, bitsandbytes, 3-bit,
    AWQ GEMV packing, activation quantization, ...), naming it."""
    if qc is None:
        return None
    if not isinstance(qc, dict):
        raise QuantSchemeError("config.json quantization_config is not an object")
    method = str(qc.get("quant_method") or "").lower().replace("_", "-")
    if method == "gptq":
        return _gptq(qc)
    if method == "awq":
        return _awq(qc)
    if method == "compressed-tensors":
        return _compressed_tensors(qc)
    if not method:
        raise QuantSchemeError("config.json has a quantization_config without a quant_method")
    return _refuse_named(method, qc)


def _refuse_named(method: str, qc: dict):
    names = {"fp8": "FP8", "bitsandbytes": "bitsandbytes", "mxfp4": "MXFP4", "modelopt": "NVIDIA ModelOpt (FP8/NVFP4)",
             "hqq": "HQQ", "eetq": "EETQ", "exl2": "EXL2", "aqlm": "AQLM", "quanto": "Quanto", "torchao": "torchao",
             "fbgemm-fp8": "FP8 (fbgemm)", "higgs": "HIGGS", "vptq": "VPTQ", "bitnet": "BitNet", "spqr": "SpQR"}
    name = names.get(method, repr(method))
    algo = qc.get("quant_algo")
    raise _refuse(f"{name}" + (f" ({algo})" if isinstance(algo, str) else ""))


# -- GPTQ -------------------------------------------------------------------------------------

def _gptq_layer(d: dict, base: LayerQuant | None, fmt: str, where: str) -> LayerQuant:
    bits = _bits("gptq", _int(d.get("bits", base.bits if base else None), "bits", "GPTQ"))
    gs = _group(_int(d.get("group_size", base.group_size if base else 128), "group_size", "GPTQ"), "GPTQ")
    sym = bool(d.get("sym", base.sym if base else True))
    act = bool(d.get("desc_act", base.act_order if base else False)) and not bool(d.get("static_groups", False))
    return LayerQuant(bits=bits, group_size=gs, sym=sym, act_order=act and gs != -1,
                      zero_offset=1 if fmt == "gptq" else 0)


def _gptq(qc: dict) -> HFQuant:
    fmt = str(qc.get("checkpoint_format") or qc.get("format") or "gptq").lower()
    if fmt not in table()["gptq"]["formats"]:
        raise _refuse(f"GPTQ in the {fmt!r} checkpoint format")
    if "bits" not in qc:
        raise QuantSchemeError("GPTQ: config.json quantization_config has no bits")
    default = _gptq_layer(qc, None, fmt, "")
    rules: list[_Rule] = []
    dynamic = qc.get("dynamic") or {}
    if not isinstance(dynamic, dict):
        raise QuantSchemeError("GPTQ: quantization_config.dynamic is not an object")
    for key, over in dynamic.items():
        skip = key.startswith("-:")
        pattern = key[2:] if key.startswith(("-:", "+:")) else key
        try:
            re.compile(pattern)
        except re.error as exc:
            raise QuantSchemeError(f"GPTQ: quantization_config.dynamic key {key!r} is not a regex: {exc}") from None
        scheme = None if skip else _gptq_layer(over if isinstance(over, dict) else {}, default, fmt, key)
        rules.append(_Rule(pattern, regex=True, search=False, scheme=scheme))
    rules += _not_converted(qc)
    return HFQuant("gptq", fmt, default, tuple(rules))


def _not_converted(qc: dict) -> list[_Rule]:
    """modules_to_not_convert: names matched as substrings of the module name (as transformers
    does)."""
    names = qc.get("modules_to_not_convert") or []
    if not isinstance(names, list):
        raise QuantSchemeError("quantization_config.modules_to_not_convert is not a list")
    return [_Rule(str(n), regex=False, search=True, scheme=None) for n in names if str(n)]


# -- AWQ --------------------------------------------------------------------------------------

def _awq(qc: dict) -> HFQuant:
    version = str(qc.get("version") or "gemm").lower()
    if version not in table()["awq"]["formats"]:
        raise _refuse(f"AWQ with {version.upper()} packing (version = {version!r})")
    bits = _bits("awq", _int(qc.get("bits", qc.get("w_bit")), "bits", "AWQ"))
    gs = _group(_int(qc.get("group_size", qc.get("q_group_size", 128)), "group_size", "AWQ"), "AWQ")
    sym = not bool(qc.get("zero_point", True))
    default = LayerQuant(bits=bits, group_size=gs, sym=sym, act_order=False)
    return HFQuant("awq", version, default, tuple(_not_converted(qc)))


# -- compressed-tensors -----------------------------------------------------------------------

def _ct_rules(items: Iterable, scheme: LayerQuant | None, what: str) -> list[_Rule]:
    out = []
    for t in items:
        t = str(t)
        if t.startswith("re:"):
            try:
                re.compile(t[3:])
            except re.error as exc:
                raise QuantSchemeError(f"compressed-tensors: {what} {t!r} is not a regex: {exc}") from None
            out.append(_Rule(t[3:], regex=True, search=False, scheme=scheme))
        elif t == "Linear":
            out.append(_Rule(r".*", regex=True, search=False, scheme=scheme, by_class=True))
        else:
            out.append(_Rule(t, regex=False, search=False, scheme=scheme))
    return out


def _ct_layer(group: str, w: dict, fmt: str) -> LayerQuant:
    typ = str(w.get("type", "int")).lower()
    bits = w.get("num_bits")
    if typ != "int":
        label = {4: "NVFP4/MXFP4", 8: "FP8"}.get(bits, f"{bits}-bit float") if isinstance(bits, int) else "float"
        raise _refuse(f"compressed-tensors {label} weights (config_groups.{group}: type = {typ!r})")
    bits = _bits("compressed-tensors", _int(bits, "num_bits", f"compressed-tensors config_groups.{group}"))
    strategy = str(w.get("strategy") or "tensor").lower()
    if strategy == "group":
        gs = _int(w.get("group_size"), "group_size", f"compressed-tensors config_groups.{group}")
        if gs <= 0:
            raise QuantSchemeError(f"compressed-tensors config_groups.{group}: group_size = {gs} must be positive")
    elif strategy == "channel":
        gs = -1
    else:
        raise _refuse(f"compressed-tensors {bits}-bit weights with the {strategy!r} strategy "
                      f"(config_groups.{group})")
    if w.get("dynamic"):
        raise _refuse(f"compressed-tensors dynamic weight quantization (config_groups.{group})")
    actorder = w.get("actorder")
    act = actorder in (True, "group") and gs != -1   # "weight": static groups (g_idx is k // gs)
    return LayerQuant(bits=bits, group_size=gs, sym=bool(w.get("symmetric", True)), act_order=act)


def _compressed_tensors(qc: dict) -> HFQuant:
    fmt = str(qc.get("format") or "").lower()
    groups = qc.get("config_groups") or {}
    if not isinstance(groups, dict) or not groups:
        raise QuantSchemeError("compressed-tensors: config.json quantization_config has no config_groups")
    if qc.get("sparsity_config"):
        raise _refuse("compressed-tensors sparsity (sparsity_config)")
    if qc.get("kv_cache_scheme"):
        raise _refuse("compressed-tensors KV-cache quantization (kv_cache_scheme)")
    targets: list[_Rule] = []
    for name, g in groups.items():
        if not isinstance(g, dict):
            raise QuantSchemeError(f"compressed-tensors: config_groups.{name} is not an object")
        gfmt = str(g.get("format") or fmt).lower()
        if gfmt not in table()["compressed-tensors"]["formats"]:
            raise _refuse(f"compressed-tensors in the {gfmt or 'unnamed'!r} format (config_groups.{name})")
        if g.get("input_activations") or g.get("output_activations"):
            bits = (g.get("input_activations") or {}).get("num_bits") if isinstance(g.get("input_activations"), dict) else None
            raise _refuse(f"compressed-tensors with quantized activations (config_groups.{name}: "
                          f"W?A{bits or '?'}; only weight-only W4A16 / W8A16 run)")
        w = g.get("weights")
        if not isinstance(w, dict):
            raise QuantSchemeError(f"compressed-tensors: config_groups.{name} has no weights scheme")
        targets += _ct_rules(g.get("targets") or ["Linear"], _ct_layer(name, w, gfmt), f"config_groups.{name}.targets")
    ignore = _ct_rules(qc.get("ignore") or [], None, "ignore")
    # a module named by a target (exact or re:) takes that group over a class ("Linear") target
    # (as compressed-tensors matches); the default (messages) is the class-wide group's scheme
    targets.sort(key=lambda r: r.by_class)
    default = next((r.scheme for r in targets if r.by_class), targets[0].scheme if targets else None)
    return HFQuant("compressed-tensors", fmt or "pack-quantized", default, tuple(ignore), tuple(targets))


# -- tensor parallelism -----------------------------------------------------------------------

def _layer_prefix(config: dict) -> str:
    return "model.language_model.layers" if isinstance(config.get("vision_config"), dict) else "model.layers"


def row_parallel_modules(facts: dict, config: dict) -> list[tuple[str, int]]:
    """(checkpoint module name, input features K) of every row-parallel projection (its input
    features are split over the ranks): o_proj, linear_attn.out_proj, mlp.down_proj; in an MoE
    model each routed expert's mlp.experts.<e>.down_proj (the experts' intermediate features
    are split over the ranks) and mlp.shared_expert.down_proj."""
    text = config.get("text_config") if isinstance(config.get("text_config"), dict) else config
    n = facts.get("num_hidden_layers") or 0
    types = text.get("layer_types")
    interval = facts.get("full_attention_interval") or 4
    if not isinstance(types, list) or len(types) != n:
        types = ["full_attention" if (i + 1) % interval == 0 else "linear_attention" for i in range(n)]
    prefix = _layer_prefix(config)
    heads, hd = facts.get("num_attention_heads"), facts.get("head_dim")
    if not hd and heads and facts.get("hidden_size"):
        hd = facts["hidden_size"] // heads
    hv, dv = facts.get("linear_num_value_heads"), facts.get("linear_value_head_dim")
    inter = facts.get("intermediate_size")
    moe = bool(facts.get("num_experts"))
    experts, expert_k = facts.get("num_experts") or 0, facts.get("moe_intermediate_size")
    shared_k = facts.get("shared_expert_intermediate_size") or expert_k
    out = []
    for i, t in enumerate(types):
        if t == "full_attention" and heads and hd:
            out.append((f"{prefix}.{i}.self_attn.o_proj", heads * hd))
        elif t == "linear_attention" and hv and dv:
            out.append((f"{prefix}.{i}.linear_attn.out_proj", hv * dv))
        if moe:
            # every routed expert's down_proj (the rules may name single experts) and the shared one
            if expert_k:
                out += [(f"{prefix}.{i}.mlp.experts.{e}.down_proj", expert_k) for e in range(experts)]
            if shared_k:
                out.append((f"{prefix}.{i}.mlp.shared_expert.down_proj", shared_k))
        elif inter:
            out.append((f"{prefix}.{i}.mlp.down_proj", inter))
    return out


def tp_split_problems(hq: HFQuant, facts: dict, config: dict, tp: int) -> list[str]:
    """Why splitting the row-parallel projections' input features over tp ranks would break a
    quantization group (one sentence each, with the numbers; the first of each kind of module).
    A per-channel scheme splits anywhere; an act-order one nowhere (its groups span all input
    features)."""
    if tp <= 1:
        return []
    seen: set[str] = set()
    out = []
    for module, K in row_parallel_modules(facts, config):
        kind = re.sub(r"\.\d+\.", ".", re.sub(r"^.*?\.layers\.\d+\.", "", module))   # e.g. mlp.experts.down_proj
        s = hq.scheme_for(module)
        if s is None or kind in seen or K % tp:
            continue
        share = K // tp
        pack = 32 // s.bits
        msg = None
        if s.act_order:
            msg = (f"{module} ({s.describe()}): act-order scatters each group of {s.group_size} over all {K} "
                   f"input features, so a split over {tp} ranks breaks every group")
        elif s.group_size != -1 and share % s.group_size:
            msg = (f"{module}: each of {tp} ranks would take {K} / {tp} = {share} input features, "
                   f"not a whole number of quantization groups of {s.group_size}")
        elif share % pack:
            msg = (f"{module}: each of {tp} ranks would take {share} input features, not whole "
                   f"{pack}-value words of {s.bits}-bit weights")
        if msg:
            seen.add(kind)
            out.append(msg)
    return out
