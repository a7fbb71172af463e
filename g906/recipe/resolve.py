"""resolve(): a Recipe checked against the file system, as a Plan.

    resolve(recipe, recipe_path)                     missing files are errors (g906 up)
    resolve(recipe, recipe_path, check_files=False)  missing files are warnings (g906 validate)

Relative paths are relative to the recipe's directory; `~` expands. Files that exist are
always checked (GGUF magic and header, split-set shards, config.json, safetensors headers),
and every problem is reported at the recipe line that caused it. No torch here.
"""

from __future__ import annotations

import difflib
import errno
import os
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from g906.recipe import registry
from g906.recipe.errors import RecipeError, RecipeIssue, located_issue
from g906.recipe.gguf_info import ModelFileError, check_magic, header_facts, read_header, shard_paths, split_parts
from g906.recipe.hf_info import inspect_hf_dir
from g906.recipe.hub import HubError, HubSpec, cached_model, parse_hub_id
from g906.recipe.plan import MediaLimitPlan, Plan
from g906.recipe.schema import MediaLimit, Recipe

_SOURCE = ("model", "source")


class _Ctx:
    def __init__(self, recipe: Recipe, recipe_path: str | os.PathLike | None, check_files: bool):
        origin = getattr(recipe, "_origin", None)
        self.index = getattr(origin, "index", None)
        path = Path(recipe_path) if recipe_path is not None else getattr(origin, "path", None)
        self.file = str(recipe_path) if recipe_path is not None else getattr(origin, "file", "<recipe>")
        self.base = Path(os.path.abspath(path)).parent if path is not None else Path.cwd()
        self.check_files = check_files
        self.errors: list[RecipeIssue] = []
        self.warnings: list[RecipeIssue] = []
        self.missing: list[Path] = []

    def error(self, key: tuple, message: str, help: str | None = None, at: str = "value") -> None:
        self.errors.append(located_issue(self.file, self.index, key, message, help, at=at))

    def warn(self, key: tuple, message: str, help: str | None = None, at: str = "value") -> None:
        self.warnings.append(located_issue(self.file, self.index, key, message, help, at=at, severity="warning"))

    def path(self, value: str) -> Path:
        p = Path(os.path.expanduser(value.strip()))
        return Path(os.path.abspath(p if p.is_absolute() else self.base / p))

    def need(self, key: tuple, p: Path, what: str) -> bool:
        """True when p exists; otherwise records it as missing (an error under check_files)."""
        if p.exists():
            return True
        self.missing.append(p)
        help = _similar(p) or ("`g906 up` will refuse to start until it exists" if not self.check_files else None)
        if self.check_files:
            self.error(key, f"{what} not found: {p}", help)
        else:
            self.warn(key, f"{what} not found: {p}", help)
        return False


def _similar(p: Path) -> str | None:
    try:
        names = [x.name for x in p.parent.iterdir()]
    except OSError:
        return None
    close = difflib.get_close_matches(p.name, names, n=2, cutoff=0.6)
    return f"did you mean {' or '.join(repr(c) for c in close)}?" if close else None


@dataclass
class _Model:
    format: str
    path: Path | None = None
    files: list[Path] = field(default_factory=list)
    architecture: str | None = None
    facts: dict[str, Any] = field(default_factory=dict)
    tensor_types: dict[str, int] = field(default_factory=dict)
    quantization: str = "none"
    name: str = "model"
    mmproj: Path | None = None
    multimodal: bool | None = None       # None: not knowable (files missing)
    hf_quant: Any = None                 # g906.arch.hf_quant.HFQuant of a quantized HF directory
    hf_config: dict[str, Any] = field(default_factory=dict)


def _media(lim: int | MediaLimit | None) -> MediaLimitPlan | None:
    if lim is None:
        return None
    if isinstance(lim, int):
        return MediaLimitPlan(count=lim)
    return MediaLimitPlan(count=lim.count, width=lim.width, height=lim.height)


def resolve(recipe: Recipe, recipe_path: str | os.PathLike | None = None, *, check_files: bool = True) -> Plan:
    """The recipe resolved against the file system: a Plan, or RecipeError naming file:line:col.
    The file system's own refusals (a name too long, a permission denied, a loop of links) are
    recipe errors too, located at the key whose path caused them."""
    try:
        return _resolve(recipe, recipe_path, check_files)
    except OSError as exc:
        cx = _Ctx(recipe, recipe_path, check_files)
        key, value = _path_key(cx, recipe, exc.filename)
        shown = value if len(value) <= 80 else value[:50] + "..." + value[-20:]
        help = None
        if exc.errno == errno.ENAMETOOLONG:
            help = (f"the path has {len(value)} characters; file systems allow at most 255 bytes per name "
                    "and about 4096 per path")
        raise RecipeError(cx.file, [located_issue(cx.file, cx.index, key, f"{_PATH_KEYS[key]} path {shown!r}: "
                                                  f"{exc.strerror or exc}", help)]) from None


_PATH_KEYS = {("model", "source"): "model", ("model", "chat_template"): "chat template",
              ("model", "mmproj"): "vision projector", ("parallel", "rccl"): "RCCL package"}


def _path_key(cx: _Ctx, recipe: Recipe, filename) -> tuple[tuple, str]:
    """The recipe key whose path an OS error is about (model.source when none matches)."""
    values = {("model", "source"): recipe.model.source, ("model", "chat_template"): recipe.model.chat_template,
              ("model", "mmproj"): recipe.model.mmproj, ("parallel", "rccl"): recipe.parallel.rccl}
    failed = os.fsdecode(filename) if filename is not None else ""
    for key, value in values.items():
        if not value or value.strip().startswith("builtin:") or value in ("auto", "none"):
            continue
        resolved = str(cx.path(value))
        if failed and (failed == resolved or failed.startswith(resolved + os.sep) or resolved.startswith(failed)):
            return key, value
    return _SOURCE, recipe.model.source


def _resolve(recipe: Recipe, recipe_path: str | os.PathLike | None, check_files: bool) -> Plan:
    cx = _Ctx(recipe, recipe_path, check_files)
    mm = {k: v for k, v in (("image", _media(recipe.multimodal.image)),
                            ("video", _media(recipe.multimodal.video))) if v is not None}
    images_on = mm.get("image") is not None and mm["image"].count > 0
    model = _resolve_model(cx, recipe, images_on)

    files = list(model.files)
    if model.mmproj is not None and images_on:
        files.append(model.mmproj)
    chat_template = None
    if recipe.model.chat_template:
        chat_template = cx.path(recipe.model.chat_template)
        if cx.need(("model", "chat_template"), chat_template, "chat template"):
            if not chat_template.is_file():
                cx.error(("model", "chat_template"), f"chat template {chat_template} is not a file")
            else:
                files.append(chat_template)
    rccl = None
    if recipe.parallel.rccl:
        rccl = cx.path(recipe.parallel.rccl)
        cx.need(("parallel", "rccl"), rccl, "RCCL package")
        if recipe.parallel.tensor_parallel_size == 1:
            cx.warn(("parallel", "rccl"), "parallel.rccl is only used with tensor_parallel_size > 1")
    _check_tensor_parallel(cx, recipe, model)
    speculative = _check_speculative(cx, recipe, model)

    _advice(cx, recipe, model, images_on)
    if cx.errors:
        raise RecipeError(cx.file, cx.errors)

    lim = recipe.limits
    return Plan(
        recipe=recipe,
        recipe_path=Path(os.path.abspath(recipe_path)) if recipe_path is not None else None,
        model_source=recipe.model.source,
        model_format=model.format,  # type: ignore[arg-type]
        model_path=model.path,
        model_files=files,
        mmproj_path=model.mmproj,
        served_model_name=recipe.model.name or model.name,
        quantization=model.quantization,  # type: ignore[arg-type]
        gguf_tensor_types=model.tensor_types,
        dtype=recipe.model.dtype,
        chat_template_path=chat_template,
        architecture=model.architecture,
        model_facts=model.facts,
        tensor_parallel_size=recipe.parallel.tensor_parallel_size,
        devices=list(recipe.parallel.devices) if recipe.parallel.devices is not None else None,
        rccl_package=rccl,
        max_model_len=lim.max_model_len,
        max_num_seqs=lim.max_num_seqs,
        max_num_batched_tokens=lim.max_num_batched_tokens,
        gpu_memory_utilization=lim.gpu_memory_utilization,
        default_max_tokens=lim.default_max_tokens,
        mm_limits=mm,
        engine_kind=recipe.engine.kind,
        enforce_eager=recipe.engine.enforce_eager,
        reasoning_parser=recipe.engine.reasoning_parser,
        tool_parser=recipe.server.tool_parser,
        speculative=speculative,
        host=recipe.server.host,
        port=recipe.server.port,
        api_key_env=recipe.server.api_key_env,
        allowed_origins=list(recipe.server.allowed_origins),
        root_path=recipe.server.root_path,
        force_include_usage=recipe.server.force_include_usage,
        per_request_metrics=recipe.server.per_request_metrics,
        log_level=recipe.server.log_level,
        access_log=recipe.server.access_log,
        env=dict(recipe.env),
        warnings=[w.render()[0] for w in cx.warnings],
        missing_files=cx.missing,
        quant_detail=model.hf_quant.describe() if model.hf_quant is not None else None,
    )


# -- the model ----------------------------------------------------------------------------

def _resolve_model(cx: _Ctx, recipe: Recipe, images_on: bool) -> _Model:
    source = recipe.model.source.strip()
    if source.startswith("builtin:"):
        return _builtin(cx, source[len("builtin:"):])
    p = cx.path(source)
    spec = parse_hub_id(source)
    hub_id = spec is not None
    if not p.exists() and spec is not None and recipe.engine.kind == "embedded":
        found = _hub(cx, recipe, spec, images_on)
        if found is not None:
            return found
    if not p.exists() and hub_id and recipe.engine.kind == "vllm":
        # vLLM downloads Hugging Face Hub ids itself
        q = recipe.model.quantization
        return _Model(format="hf", path=None, files=[], name=source,
                      quantization="none" if q in ("auto", "gguf") else q)
    if not p.exists():
        cx.need(_SOURCE, p, "model")
        if hub_id:
            (cx.errors if cx.check_files else cx.warnings)[-1].help = (
                f"no such file or folder, and {spec} is not in the Hugging Face cache either: "
                f"`g906 pull {spec}` (or `hf download {spec.repo_id}`) fetches it; `g906 up {spec}` does too")
        gguf = p.suffix.lower() == ".gguf"
        mmproj = recipe.model.mmproj.strip()
        if gguf and mmproj not in ("auto", "none"):
            cx.need(("model", "mmproj"), cx.path(mmproj), "vision projector (mmproj)")
        q = recipe.model.quantization
        return _Model(format="gguf" if gguf else "hf", path=p, files=[p],
                      quantization=("gguf" if gguf else "none") if q == "auto" else q, name=_default_name(p))
    if p.is_dir():
        return _hf(cx, recipe, p, images_on)
    return _gguf(cx, recipe, p, images_on)


def _hub(cx: _Ctx, recipe: Recipe, spec: HubSpec, images_on: bool) -> _Model | None:
    """A Hub id: the model in the local Hugging Face cache, or None when the cache lacks it
    (`g906 up` and `g906 pull` download it first; resolving never touches the network)."""
    try:
        found = cached_model(spec)
    except HubError as exc:
        cx.error(_SOURCE, exc.message, exc.hint)
        return _Model(format="hf", name=spec.repo_id)
    if found is None:
        return None
    model = _hf(cx, recipe, found, images_on) if found.is_dir() else _gguf(cx, recipe, found, images_on)
    model.name = spec.repo_id
    return model


def _builtin(cx: _Ctx, name: str) -> _Model:
    entry = registry.builtin_entry(name)
    if entry is None:
        names = registry.builtin_names()
        close = difflib.get_close_matches(name, names, n=1, cutoff=0.5)
        help = f'did you mean "builtin:{close[0]}"?' if close else "builtin models: " + ", ".join(names)
        cx.error(_SOURCE, f'there is no builtin model "{name}"', help)
        return _Model(format="builtin", name=name)
    facts = {k: v for k, v in entry.items() if k != "description"}
    return _Model(format="builtin", architecture=str(entry.get("architecture", "qwen35")),
                  facts=facts, name=name, multimodal=bool(entry.get("multimodal", False)))


def _default_name(p: Path) -> str:
    parts = split_parts(p)
    if parts is not None:
        return parts[0]
    return p.stem if p.suffix.lower() == ".gguf" else p.name


def _gguf(cx: _Ctx, recipe: Recipe, p: Path, images_on: bool) -> _Model:
    model = _Model(format="gguf", path=p, name=_default_name(p), quantization="gguf")
    if recipe.model.quantization not in ("auto", "gguf"):
        cx.error(("model", "quantization"), f"model.quantization = {recipe.model.quantization!r} "
                 "contradicts a GGUF source", 'use "auto" or "gguf"')
    try:
        check_magic(p)
        shards = shard_paths(p)
    except ModelFileError as exc:
        if p.suffix.lower() in (".safetensors", ".json", ".bin"):
            exc.help = f'for a Hugging Face model, set model.source to its directory: "{p.parent}"'
        cx.error(_SOURCE, exc.message, exc.help)
        return model
    model.files = shards
    types: Counter = Counter()
    expert_types: Counter = Counter()
    expert_bytes = 0
    first = None
    for s in shards:
        if not cx.need(_SOURCE, s, f"GGUF shard {s.name} of the split set"):
            continue
        try:
            header = read_header(s)
        except ModelFileError as exc:
            cx.error(_SOURCE, exc.message, exc.help)
            continue
        types.update(header.tensor_types)
        expert_types.update(header.expert_types)
        expert_bytes += header.expert_bytes
        if s == shards[0]:
            first = header
    model.tensor_types = dict(sorted(types.items()))
    if first is None:
        return model
    model.architecture = first.architecture
    model.facts = header_facts(first)
    model.facts["weights_bytes"] = sum(s.stat().st_size for s in shards if s.exists())
    if expert_types:  # MoE: the stacked experts, read per chosen expert at decode
        model.facts["expert_bytes"] = expert_bytes
        model.facts["expert_types"] = dict(sorted(expert_types.items()))
    declared = first.scalars.get("split.count")
    if isinstance(declared, int) and declared > 1 and declared != len(shards):
        cx.error(_SOURCE, f"{p.name} says it is one of {declared} split files, but its name does not "
                 f"follow NAME-00001-of-{declared:05d}.gguf", "keep the file names the download gave them")
    if model.architecture == "clip":
        cx.error(_SOURCE, f"{p.name} is a vision projector (mmproj), not a language model",
                 "set model.source to the model GGUF and model.mmproj to this file")
        return model
    _check_architecture(cx, recipe, model.architecture)
    model.mmproj = _find_mmproj(cx, recipe, p, shards, images_on)
    model.multimodal = model.mmproj is not None
    model.facts["multimodal"] = model.multimodal
    return model


def _find_mmproj(cx: _Ctx, recipe: Recipe, p: Path, shards: list[Path], images_on: bool) -> Path | None:
    setting = recipe.model.mmproj.strip()
    key = ("model", "mmproj")
    if setting == "none":
        return None
    if setting != "auto":
        mp = cx.path(setting)
        if not cx.need(key, mp, "vision projector (mmproj)"):
            return mp
        _check_mmproj(cx, key, mp)
        if not images_on:
            cx.warn(key, "model.mmproj is set but images are off (multimodal.image is unset or 0)",
                    "set multimodal.image = 1 (or a table) to accept images")
        return mp
    found = sorted(x for x in p.parent.iterdir()
                   if x.is_file() and x.suffix.lower() == ".gguf" and "mmproj" in x.name.lower() and x not in shards)
    if len(found) == 1:
        if images_on:
            _check_mmproj(cx, key, found[0])
        return found[0]
    if not images_on:
        return None
    where = ("multimodal", "image")
    if found:
        cx.error(where, f"images are on and model.mmproj = \"auto\", but {p.parent} holds several projectors: "
                 + ", ".join(x.name for x in found), f'choose one: mmproj = "{found[0].name}"')
    else:
        cx.error(where, f"images are on but no mmproj*.gguf is beside {p.name}",
                 'set model.mmproj to the vision projector GGUF, or multimodal.image = 0')
    return None


def _check_mmproj(cx: _Ctx, key: tuple, mp: Path) -> None:
    try:
        arch = read_header(mp).architecture
    except ModelFileError as exc:
        cx.error(key, exc.message, exc.help)
        return
    if arch != "clip":
        cx.error(key, f"{mp.name} is not a vision projector (general.architecture = {arch!r}, expected 'clip')")


def _hf(cx: _Ctx, recipe: Recipe, p: Path, images_on: bool) -> _Model:
    model = _Model(format="hf", path=p, name=p.name)
    try:
        info = inspect_hf_dir(p)
    except ModelFileError as exc:
        cx.error(_SOURCE, exc.message, exc.help)
        return model
    for w in info.warnings:
        cx.warn(_SOURCE, w)
    model.files = info.other_files[:1] + info.weight_files + info.other_files[1:]
    model.architecture = info.architecture
    model.facts = info.facts
    model.multimodal = info.multimodal
    model.hf_config = info.config
    q, detected = recipe.model.quantization, _detected_quant(cx, recipe, info, model)
    qkey = ("model", "quantization")
    if q == "gguf":
        cx.error(qkey, 'model.quantization = "gguf" but model.source is a Hugging Face directory',
                 'use "auto" (detected: ' + (detected or "none") + ")")
    elif q != "auto" and q != (detected or "none"):
        cx.error(qkey, f"model.quantization = {q!r} but config.json says {detected or 'none'!r}",
                 'use "auto" to take what the model declares')
    model.quantization = detected or "none"
    if recipe.model.mmproj.strip() not in ("auto", "none"):
        cx.error(("model", "mmproj"), "model.mmproj applies to GGUF models; a Hugging Face directory "
                 "carries its own vision tower", "remove model.mmproj")
    if images_on and not info.multimodal:
        cx.error(("multimodal", "image"), "images are on but the model has no vision tower "
                 "(config.json has no vision_config)", "remove multimodal.image or set it to 0")
    _check_architecture(cx, recipe, info.architecture)
    return model


def _detected_quant(cx: _Ctx, recipe: Recipe, info, model: _Model) -> str | None:
    """The checkpoint's quant_method (normalised), its scheme parsed into model.hf_quant. A scheme
    the embedded engine does not run is an error naming it (vLLM reads more: it is passed on)."""
    from g906.arch.hf_quant import QuantSchemeError, parse_quant_config, quant_config_of

    if info.quant_method is None:
        return None
    try:
        model.hf_quant = parse_quant_config(quant_config_of(info.config))
    except QuantSchemeError as exc:
        if recipe.engine.kind == "embedded":
            cx.error(_SOURCE, exc.message, exc.hint)
        return info.quant_method.replace("_", "-")
    return model.hf_quant.method if model.hf_quant is not None else None


def _check_architecture(cx: _Ctx, recipe: Recipe, arch: str | None) -> None:
    if recipe.engine.kind != "embedded":
        return
    found = registry.architecture(arch)
    runs = ", ".join(registry.embedded_architectures())
    if arch is None:
        cx.warn(_SOURCE, "the model does not declare its architecture")
    elif found is None:
        cx.error(_SOURCE, f"the embedded engine does not run {arch!r} models (it runs: {runs})",
                 'engine.kind = "vllm" hands the model to an installed vLLM')
    elif not found.embedded:
        cx.error(_SOURCE, f"the embedded engine does not run {arch!r} models yet",
                 'engine.kind = "vllm" hands the model to an installed vLLM')


def _check_tensor_parallel(cx: _Ctx, recipe: Recipe, model: _Model) -> None:
    """The embedded engine splits attention/KV/linear-attention heads and MLP features over the
    ranks: tensor_parallel_size must divide each count (the engine applies the same rule,
    g906.arch.tp; counts the files do not give are checked at load)."""
    tp = recipe.parallel.tensor_parallel_size
    if tp <= 1 or recipe.engine.kind != "embedded":
        return
    from g906.arch.tp import tp_message, valid_tp_sizes

    msg = tp_message(model.facts, tp)
    if msg:
        sizes = ", ".join(str(n) for n in valid_tp_sizes(model.facts))
        cx.error(("parallel", "tensor_parallel_size"), msg, f"tensor-parallel sizes this model allows: {sizes}")
        return
    if model.hf_quant is not None:
        # packed weights split along their input features must keep whole quantization groups
        from g906.arch.hf_quant import tp_split_problems

        problems = tp_split_problems(model.hf_quant, model.facts, model.hf_config, tp)
        if problems:
            sizes = [n for n in valid_tp_sizes(model.facts)
                     if not tp_split_problems(model.hf_quant, model.facts, model.hf_config, n)]
            cx.error(("parallel", "tensor_parallel_size"),
                     f"tensor_parallel_size {tp} would break the checkpoint's quantization groups: "
                     + "; ".join(problems),
                     "tensor-parallel sizes this checkpoint allows: " + ", ".join(str(n) for n in sizes))


def _check_speculative(cx: _Ctx, recipe: Recipe, model: _Model) -> dict | None:
    """[engine.speculative] as vLLM's dict; method "mtp" needs an MTP block in the model file
    (GGUF nextn_predict_layers, HF mtp_num_hidden_layers)."""
    sec = recipe.engine.speculative
    if sec is None:
        return None
    spec = sec.config()
    n = 0 if model.format == "builtin" else model.facts.get("num_mtp_layers")    # builtins have none
    known = model.facts or model.format == "builtin"                  # else the file already failed
    if spec.method == "mtp" and known and (n or 0) < 1:
        where = {"gguf": "its GGUF metadata has no nextn_predict_layers",
                 "hf": "its config.json has no mtp_num_hidden_layers"}.get(model.format, "it is a synthetic model")
        cx.error(("engine", "speculative", "method"),
                 f"speculative method {sec.method!r} needs the model's MTP block, and this model has none ({where})",
                 'use method = "ngram", or a checkpoint that ships its MTP weights')
    return spec.to_vllm()


# -- advice that does not stop a start ----------------------------------------------------

def _advice(cx: _Ctx, recipe: Recipe, model: _Model, images_on: bool) -> None:
    ctx_len = model.facts.get("context_length")
    n = recipe.limits.max_model_len
    if isinstance(ctx_len, int) and n is not None and n > ctx_len:
        cx.warn(("limits", "max_model_len"), f"limits.max_model_len {n} is above the model's context length {ctx_len}",
                "the model was not trained for longer contexts; output quality may collapse")
    video = recipe.multimodal.video
    if model.multimodal is False and video is not None and _media(video).count > 0:  # type: ignore[union-attr]
        cx.error(("multimodal", "video"), "videos are on but the model has no vision support")
    if recipe.server.host not in ("127.0.0.1", "localhost", "::1") and not recipe.server.api_key_env:
        cx.warn(("server", "host"), f"serving on {recipe.server.host} without an API key",
                "set server.api_key_env to the name of a variable holding a key")
    engine = recipe.engine
    if engine.kind == "embedded" and engine.vllm.model_fields_set:
        cx.warn(("engine", "vllm"), '[engine.vllm] options are ignored: engine.kind is "embedded"')
    if engine.kind == "vllm" and engine.embedded.model_fields_set:
        cx.warn(("engine", "embedded"), '[engine.embedded] options are ignored: engine.kind is "vllm"')
