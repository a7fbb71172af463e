"""Qwen3.5 / Qwen3.6 MoE text model: the Qwen3.5 hybrid stack (models/qwen35.py builds a
SparseMoeBlock for every layer's MLP when the config has experts), loaded from any of the forms
its expert weights come in:

- stacked [E, N, K] per projection: mlp.experts.gate_proj / up_proj / down_proj (GGUF
  ffn_*_exps, dense or QuantizedExperts);
- fused as transformers holds them: mlp.experts.gate_up_proj [E, 2I, H] ([gate; up] per
  expert; also GGUF ffn_gate_up_exps) -> split into gate_proj and up_proj;
- one tensor per expert (the checkpoints on the Hub): mlp.experts.<e>.{gate,up,down}_proj.weight
  -> stacked once all E of a projection have arrived; GPTQ / AWQ / compressed-tensors experts
  arrive as GroupQuantWeights (loaders/hf_quant.py) and stack into one GroupQuantExperts per
  projection, still packed."""

from __future__ import annotations

import re
from typing import Iterable, Iterator

import torch

from g906.engine.models.qwen35 import Qwen35ForCausalLM
from g906.engine.weights import GroupQuantExperts, GroupQuantWeight, QuantizedExperts, QuantizedTensor
from g906.errors import G906Error

_PER_EXPERT = re.compile(r"^(?P<prefix>.*\.mlp\.experts)\.(?P<e>\d+)\.(?P<proj>gate|up|down)_proj\.weight$")


def _split_gate_up(name: str, t) -> Iterator[tuple[str, object]]:
    base = name[: -len("gate_up_proj")]
    rows = t.shape[1]
    if rows % 2:
        raise G906Error(f"tensor {name} has shape {list(t.shape)}: an odd number of gate/up rows")
    half = rows // 2
    if isinstance(t, QuantizedExperts):
        idx = torch.arange(rows)
        yield base + "gate_proj", t.select_rows(idx[:half])
        yield base + "up_proj", t.select_rows(idx[half:])
    else:
        yield base + "gate_proj", t[:, :half]
        yield base + "up_proj", t[:, half:]


def _stack(name: str, parts: list) -> object:
    if all(isinstance(p, torch.Tensor) for p in parts):
        return torch.stack(parts)
    if all(isinstance(p, QuantizedTensor) for p in parts) and len({p.qtype for p in parts}) == 1:
        n, k = parts[0].shape
        return QuantizedExperts(torch.stack([p.data for p in parts]), parts[0].qtype, (len(parts), n, k))
    if all(isinstance(p, GroupQuantWeight) for p in parts):
        problem = GroupQuantExperts.stack_problem(parts)
        if problem:
            raise G906Error(f"tensor {name}: the experts are quantized differently ({problem})",
                            hint="every expert of one projection must share bits and group size "
                                 "(check quantization_config's dynamic rules)")
        return GroupQuantExperts.stack(parts)
    raise G906Error(f"tensor {name}: the experts' weights are stored in different types",
                    hint="every expert of one projection must share one storage type")


class Qwen35MoeForCausalLM(Qwen35ForCausalLM):
    """Qwen35ForCausalLM with a sparse MoE MLP; load_weights also takes fused or per-expert
    expert tensors (see the module docstring)."""

    def _expert_stream(self, weights: Iterable) -> Iterator[tuple[str, object]]:
        E = self.config.num_experts
        pending: dict[str, dict[int, object]] = {}
        for name, t in weights:
            if name.endswith(".mlp.experts.gate_up_proj"):
                yield from _split_gate_up(name, t)
                continue
            m = _PER_EXPERT.match(name)
            if m is None:
                yield name, t
                continue
            e = int(m.group("e"))
            if e >= E:
                raise G906Error(f"unexpected tensor {name}: the model config has {E} experts")
            key = f"{m.group('prefix')}.{m.group('proj')}_proj"
            got = pending.setdefault(key, {})
            got[e] = t
            if len(got) == E:
                yield key, _stack(key, [got[i] for i in range(E)])
                del pending[key]
        for key, got in pending.items():
            missing = next(i for i in range(E) if i not in got)
            prefix, proj = key.rsplit(".", 1)
            raise G906Error(f"the checkpoint lacks tensor {prefix}.{missing}.{proj}.weight",
                            hint="the files are incomplete or belong to a different model")

    def load_weights(self, weights) -> dict:
        return super().load_weights(self._expert_stream(weights))
