"""The vision runtime a Plan asks for: the tower from the mmproj GGUF (or the HF checkpoint),
limits from the recipe's multimodal.image (and image_fetch), allowed local image folders from the environment."""

from __future__ import annotations

from typing import TYPE_CHECKING

from g906.errors import G906Error
from g906.serving.engine_config import model_source

if TYPE_CHECKING:
    from g906.engine.vision.runtime import VisionRuntime
    from g906.recipe.plan import Plan


def fetch_policy(plan: Plan):
    """The recipe's multimodal.image_fetch as the engine's FetchPolicy (None: remote images off)."""
    from g906.engine.vision.fetch import FetchPolicy

    f = plan.recipe.multimodal.image_fetch
    if not f.allowed_hosts:
        return None
    return FetchPolicy(allowed_hosts=tuple(f.allowed_hosts), schemes=tuple(f.schemes), timeout_s=f.timeout_s,
                       max_bytes=f.max_bytes, allow_private_networks=f.allow_private_networks,
                       max_concurrent=f.max_concurrent)


def vision_from_plan(plan: Plan, loaded) -> VisionRuntime | None:
    """None when the recipe leaves images off. `loaded`: the text model (the tower takes its
    dtype and device, and checks its hidden size and vocabulary)."""
    if not plan.images_enabled:
        return None
    import torch

    from g906.engine.vision.image import allowed_local_dirs_from_env
    from g906.engine.vision.runtime import load_vision

    lim = plan.mm_limits["image"]
    source = model_source(plan)
    mmproj = plan.mmproj_path if plan.model_format == "gguf" else None
    if plan.model_format == "gguf" and mmproj is None:
        raise G906Error(f"{source}: images are on but no vision projector (mmproj) was found for it",
                        hint="put the mmproj-*.gguf beside the model or name it in model.mmproj")
    model = loaded.model
    inner = getattr(model, "inner", model)      # a tensor-parallel model: rank 0's
    dtype = getattr(model, "dtype", None) or getattr(inner, "dtype", torch.float32)
    device = getattr(model, "device", None) or getattr(inner, "device", None)
    vision = load_vision(source, mmproj=mmproj, text_config=loaded.config, tokenizer=loaded.tokenizer,
                         dtype=dtype, device=device, required=True)
    vision.configure_limits(count=lim.count, width=lim.width, height=lim.height,
                            allowed_local_dirs=allowed_local_dirs_from_env(), fetch=fetch_policy(plan))
    return vision
