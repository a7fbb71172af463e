"""[engine.speculative]: vLLM's speculative_config as a recipe table. Method "mtp" (or a vLLM
model-specific MTP name) needs an MTP block, which the resolver reads from GGUF
nextn_predict_layers or HF mtp_num_hidden_layers; bad values point at their key (exit 2)."""

from __future__ import annotations

from .helpers import write_gguf, write_hf_dir
from .test_resolve import errors_of, plan_of

MTP = '[engine.speculative]\nmethod = "{m}"\nnum_speculative_tokens = 2\n'


def test_mtp_needs_the_block(tmp_path):
    write_gguf(tmp_path / "with.gguf", nextn=1)
    write_gguf(tmp_path / "without.gguf")
    write_hf_dir(tmp_path / "hf-with", mtp=1)
    write_hf_dir(tmp_path / "hf-without")
    for src in ("with.gguf", "hf-with"):
        plan = plan_of(tmp_path, f'[model]\nsource = "{src}"\n' + MTP.format(m="qwen3_next_mtp"))
        assert plan.speculative == {"method": "mtp", "num_speculative_tokens": 2}
    for src, why in (("without.gguf", "nextn_predict_layers"), ("hf-without", "mtp_num_hidden_layers"),
                     ("builtin:tiny-qwen35", "synthetic")):
        (err,) = errors_of(tmp_path, f'[model]\nsource = "{src}"\n' + MTP.format(m="mtp"))
        assert "needs the model's MTP block" in err["message"] and why in err["message"], err
        assert err["line"] == 4
    # n-gram needs nothing of the model
    plan = plan_of(tmp_path, '[model]\nsource = "without.gguf"\n[engine.speculative]\nmethod = "ngram"\n'
                             'num_speculative_tokens = 4\nprompt_lookup_max = 3\n')
    assert plan.speculative == {"method": "ngram", "num_speculative_tokens": 4, "prompt_lookup_min": 3,
                                "prompt_lookup_max": 3}


def test_bad_values_point_at_their_key(tmp_path):
    write_gguf(tmp_path / "m.gguf", nextn=1)
    head = '[model]\nsource = "m.gguf"\n[engine.speculative]\n'
    (err,) = errors_of(tmp_path, head + 'method = "eagle3"\nnum_speculative_tokens = 2\n')
    assert "'eagle3' is not a method" in err["message"] and err["line"] == 4
    (err,) = errors_of(tmp_path, head + 'method = "mtp"\nnum_speculative_tokens = 0\n')
    assert err["line"] == 5
    (err,) = errors_of(tmp_path, head + 'method = "mtp"\n')
    assert "num_speculative_tokens" in err["message"]
    (err,) = errors_of(tmp_path, head + 'method = "ngram"\nnum_speculative_tokens = 2\nprompt_lookup_min = 4\n'
                                        'prompt_lookup_max = 2\n')
    assert "prompt_lookup_min" in err["message"]
