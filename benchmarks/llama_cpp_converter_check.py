#!/usr/bin/env python
"""GGUF files written by llama.cpp's own converter (convert_hf_to_gguf.py), loaded by g906: greedy
tokens equal transformers' on the same weights, with and without speculative decoding.

    python benchmarks/llama_cpp_converter_check.py --llama-src DIR [--work DIR]

DIR is a llama.cpp source tree (never part of this repository: e.g. the vendor/llama.cpp of the
llama-cpp-python source package on the package index, or a clone). Not a test of the suite: it
needs that tree. Cases, on tiny random models built by the tests' helpers and saved as HF
folders with the tests' tokenizer:
  dense + MTP  Qwen3.5 with one MTP layer (tests/engine/spec_models.py), converted to F16 and
               Q8_0; g906 greedy plain, MTP k = 1, 2 and 3, n-gram k = 3
  MoE          Qwen3.5 MoE (16 experts, top-4; tests/engine/conftest.py), converted to F16 and Q8_0
The converter identifies a tokenizer's pre-tokenizer by a hash of known vocabularies; the tests'
tiny tokenizer is not among them, so the check tells it "qwen35" (the tensors are what is checked).
Prints one line per case; exits 1 if an F16 file differs from transformers or speculation
changes a file's greedy tokens (Q8_0 against transformers is shown, not required)."""

from __future__ import annotations

import argparse
import contextlib
import importlib
import io
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

PROMPTS = ["one two three four five", "the quick brown fox", "a b c d e f g"]
SPECS = (None, {"method": "mtp", "num_speculative_tokens": 1}, {"method": "mtp", "num_speculative_tokens": 2},
         {"method": "mtp", "num_speculative_tokens": 3},
         {"method": "ngram", "num_speculative_tokens": 3, "prompt_lookup_min": 1, "prompt_lookup_max": 3})


def convert(src: Path, hf: Path, out: Path, outtype: str, extra: tuple[str, ...] = ()) -> None:
    """Run the converter in this process, its pre-tokenizer lookup answered with qwen35."""
    sys.path[:0] = [str(src), str(src / "gguf-py")]
    for name in [m for m in sys.modules if m == "gguf" or m.startswith("gguf.")]:
        del sys.modules[name]                 # the converter's own gguf-py, not the installed one
    try:
        conv = importlib.import_module("convert_hf_to_gguf")
        base = importlib.import_module("conversion.base") if (src / "conversion").is_dir() else conv
        for cls in vars(base).values():
            if isinstance(cls, type) and hasattr(cls, "get_vocab_base_pre"):
                cls.get_vocab_base_pre = lambda self, tokenizer: "qwen35"
        argv = sys.argv
        sys.argv = ["convert_hf_to_gguf.py", str(hf), "--outfile", str(out), "--outtype", outtype, *extra]
        with contextlib.redirect_stderr(io.StringIO()):
            conv.main()
    finally:
        sys.argv = argv
        del sys.path[:2]
        for name in [m for m in sys.modules if m == "gguf" or m.startswith("gguf.")]:
            del sys.modules[name]


def greedy(model: str, spec: dict | None) -> tuple[list[list[int]], dict | None]:
    from g906 import LLM, SamplingParams

    llm = LLM(model, device="cpu", **({} if spec is None else {"speculative_config": spec}))
    outs = llm.generate(PROMPTS, SamplingParams(temperature=0, max_tokens=24, ignore_eos=True))
    spec_dec = getattr(getattr(llm, "engine", None), "spec", None)
    return [o.outputs[0].token_ids for o in outs], (spec_dec.metrics.to_json() if spec_dec is not None else None)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--llama-src", required=True, help="a llama.cpp source tree (holds convert_hf_to_gguf.py)")
    ap.add_argument("--work", default=None)
    args = ap.parse_args(argv)
    src = Path(args.llama_src).resolve()
    if not (src / "convert_hf_to_gguf.py").is_file():
        ap.error(f"{src} holds no convert_hf_to_gguf.py")
    import tests.engine.spec_models as sm
    from tests.engine.conftest import build_tiny_qwen35moe
    from tests.engine.qwen_tokenizer import save_hf_tokenizer

    work = Path(args.work or tempfile.mkdtemp(prefix="g906-conv-"))
    dense = work / "dense-mtp"
    plain_build = sm.build_tiny_qwen35
    # llama.cpp's converter writes full_attention_interval, not a free layer pattern: every 4th
    sm.build_tiny_qwen35 = lambda **kw: plain_build(layer_types=["linear_attention"] * 3 + ["full_attention"], **kw)
    sm.markov_mtp_dir(dense, eos_token_id=sm.MARKOV_EOS)
    moe = work / "moe"
    m = build_tiny_qwen35moe(seed=0, layer_types=["linear_attention"] * 3 + ["full_attention"], eos_token_id=sm.MARKOV_EOS)
    m.save_pretrained(moe)
    save_hf_tokenizer(moe)
    failed = 0
    for name, hf, specs in (("dense+MTP", dense, SPECS), ("MoE", moe, SPECS[:1] + SPECS[4:])):
        ref, _ = greedy(str(hf), None)
        for outtype in ("f16", "q8_0"):
            gguf_path = work / f"{hf.name}-{outtype}.gguf"
            # a checkpoint without an MTP block is converted with --no-mtp (else the converter asks for one)
            convert(src, hf, gguf_path, outtype, () if hf == dense else ("--no-mtp",))
            plain = None
            for spec in specs:
                got, metrics = greedy(str(gguf_path), spec)
                plain = got if spec is None else plain
                # F16 against transformers; Q8_0 (other weights) against its own plain greedy
                want, against = (ref, "transformers") if outtype == "f16" or spec is None else (plain, "plain")
                ok = got == want
                failed += not ok and (outtype == "f16" or spec is not None)
                what = "plain" if spec is None else f"{spec['method']} k={spec['num_speculative_tokens']}"
                acc = "" if not metrics else (f", {metrics.get('spec_num_accepted_tokens')} of "
                                              f"{metrics.get('spec_num_draft_tokens')} drafts accepted")
                print(f"{name:9s} {outtype:5s} {what:10s} greedy == {against}: {ok}{acc}", flush=True)
    return 1 if failed else 0


if __name__ == "__main__":
    raise SystemExit(main())
