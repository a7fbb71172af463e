"""The model on a GPU (Triton kernels where the registry picks them) against transformers on CPU."""

from __future__ import annotations

import pytest
import torch

from g906.engine.loader import load_model

from .conftest import TinyRunner, hf_greedy, hf_logits, random_prompt, rel_err

pytestmark = [
    pytest.mark.gpu,
    pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA/ROCm GPU"),
]

# fp32 on GPU may use TF32-class dot products inside Triton kernels; half types are half types
TOLS = {"float32": 5e-3, "bfloat16": 6e-2, "float16": 2e-2}


@pytest.mark.parametrize("dtype", ["float32", "float16", "bfloat16"])
def test_gpu_model_matches_transformers(tiny_qwen35_hf_dir, tiny_qwen35_hf_model, dtype):
    if dtype == "bfloat16" and not torch.cuda.is_bf16_supported():
        pytest.skip("no bf16 on this GPU")
    lm = load_model(str(tiny_qwen35_hf_dir), dtype=dtype, device="cuda", progress=False)
    tol = TOLS[dtype]
    lengths = [1, 17, 300, 70]
    prompts = [random_prompt(n, seed=n) for n in lengths]
    refs = [hf_logits(tiny_qwen35_hf_model, p)[-1] for p in prompts]
    for p, ref in zip(prompts, refs):
        got = TinyRunner(lm.model).step([0], [p])[0].cpu()
        assert rel_err(got, ref) < tol, (dtype, len(p))
    # one flat batch
    together = TinyRunner(lm.model).step([0, 1, 2, 3], prompts).cpu()
    for i, ref in enumerate(refs):
        assert rel_err(together[i], ref) < tol, (dtype, "batch", i)
    # chunked prefill (chunks of 100) then decode, against transformers
    r = TinyRunner(lm.model)
    for i in range(0, 300, 100):
        chunked = r.step([1], [prompts[2][i : i + 100]])[0].cpu()
    assert rel_err(chunked, refs[2]) < tol
    seq = list(prompts[2])
    for tok in random_prompt(5, seed=99):
        seq.append(tok)
        got = r.step([1], [[tok]], is_prefill=False)[0].cpu()
        assert rel_err(got, hf_logits(tiny_qwen35_hf_model, seq)[-1]) < tol
    if dtype == "float32":
        prompt = random_prompt(17, seed=17)
        assert TinyRunner(lm.model).greedy(0, prompt, 32) == hf_greedy(tiny_qwen35_hf_model, prompt, 32)
