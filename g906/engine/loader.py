"""One entry point that loads any model source into a ready model (the class its architecture
names in g906.arch), on one device or split over tensor-parallel workers."""

from __future__ import annotations

import time

import torch

from g906.arch.config import bound_positions
from g906.engine.device import auto_dtype_for, default_device, resolve_dtype
from g906.engine.kernel_errors import reported_as_g906_errors
from g906.engine.sources import LoadedModel, open_source, tokenizer_and_template


@reported_as_g906_errors
def load_model(
    source: str,
    *,
    dtype: str | torch.dtype = "auto",
    device=None,
    chat_template: str | None = None,
    progress: bool = True,
    tensor_parallel_size: int = 1,
    devices: list[int] | None = None,
    max_model_len: int | None = None,
    keep_mtp: bool = False,
) -> LoadedModel:
    """Load `source` (HF dir, GGUF file, builtin:NAME) onto `device` in `dtype`.

    chat_template overrides the model's own template: a path to a .jinja file or the template
    text itself. keep_mtp: keep the multi-token-prediction block's weights (speculative decoding
    with method "mtp"). tensor_parallel_size > 1 splits the model over that many worker processes
    (g906.engine.parallel; `devices`: one GPU index per rank); .model is then a TPModel.
    max_model_len: the longest sequence the model will run; tables sized by the config's
    positions (rotary) are built for at most this many."""
    if int(tensor_parallel_size) > 1:
        from g906.engine.parallel import load_model_tp

        return load_model_tp(source, tensor_parallel_size=int(tensor_parallel_size), dtype=dtype, device=device,
                             devices=devices, chat_template=chat_template, progress=progress,
                             max_model_len=max_model_len, keep_mtp=keep_mtp)
    from g906.engine.models import model_class

    dev = torch.device(device) if device is not None else default_device()
    src, fmt = open_source(str(source))
    cdtype = resolve_dtype(auto_dtype_for(src, fmt, dev, dtype), dev)
    config = bound_positions(src.config(), max_model_len, source=str(source))
    t0 = time.perf_counter()
    model = model_class(config)(config, dtype=cdtype, device=dev, keep_mtp=keep_mtp)
    try:
        weights = src.weights(progress=progress)
    except TypeError:
        weights = src.weights()
    stats = model.load_weights(weights)
    load_s = time.perf_counter() - t0

    tok, template = tokenizer_and_template(src, chat_template)
    info = {
        "source": str(source),
        "format": fmt,
        "dtype": str(cdtype).replace("torch.", ""),
        "device": str(dev),
        "load_seconds": round(load_s, 3),
        **stats,
    }
    for attr in ("total_bytes", "file_bytes"):
        val = getattr(src, attr, None)
        if callable(val):
            val = val()
        if isinstance(val, int):
            info["file_bytes"] = val
            break
    if fmt == "builtin":
        info.update({k: v for k, v in getattr(src, "info", {}).items() if k not in info})
    return LoadedModel(model, config, tok, template, fmt, info)
