"""`g906 bench` offline on the builtin model and on a small synthetic shape, and online against a
real `g906 up` on 127.0.0.1 (through httpx, and cross-checked with the openai client)."""

from __future__ import annotations

import json

import pytest
from typer.testing import CliRunner

from g906.cli.app import app

SMALL = ["--shape-override", "num_hidden_layers=4", "--shape-override", "hidden_size=256",
         "--shape-override", "intermediate_size=512", "--shape-override", "vocab_size=1024",
         "--shape-override", "num_attention_heads=2", "--shape-override", "num_key_value_heads=1",
         "--shape-override", "head_dim=64", "--shape-override", "linear_num_key_heads=2",
         "--shape-override", "linear_num_value_heads=4", "--shape-override", "linear_key_head_dim=32",
         "--shape-override", "linear_value_head_dim=32"]


def _bench(args):
    res = CliRunner().invoke(app, ["bench", *args])
    return res


def _check(res: dict, n: int, out_len: int):
    assert res["completed"] == n and res["failed"] == 0
    assert res["output_tokens"] == n * out_len
    for key in ("output_tok_s", "prefill_tok_s", "decode_tok_s"):
        assert res[key] and res[key] > 0, key
    for key in ("ttft_ms", "itl_ms"):
        assert 0 < res[key]["p50"] <= res[key]["p99"], key


def test_offline_builtin_json():
    r = _bench(["--model", "builtin:tiny-qwen35", "-n", "6", "--prompt-len", "20:40", "--output-len", "8",
                "-c", "3", "--json", "--device", "cpu"])
    assert r.exit_code == 0, r.output
    res = json.loads(r.stdout[r.stdout.index("{"):])
    _check(res, 6, 8)
    assert res["mode"] == "offline" and res["workload"]["concurrency"] == 3
    assert res["workload"]["prompt_len"] == "20:40"
    assert 6 * 20 <= res["prompt_tokens"] <= 6 * 40
    assert res["engine"]["max_num_seqs"] == 3
    bw = res["bandwidth"]
    assert bw["copy_gb_s"] > 0 and bw["bytes_per_token"] > 0 and "pct_of_limit" not in bw   # batch > 1


def test_offline_shape_batch1_reports_pct_of_limit():
    r = _bench(["--shape", "qwen3.5-0.8b", *SMALL, "--quant", "q8_0", "-n", "2", "-c", "1",
                "--prompt-len", "24", "--output-len", "6", "--json", "--device", "cpu"])
    assert r.exit_code == 0, r.output
    res = json.loads(r.stdout[r.stdout.index("{"):])
    _check(res, 2, 6)
    assert res["model"]["quant"] == "q8_0" and res["model"]["shape"] == "qwen3.5-0.8b"
    bw = res["bandwidth"]
    assert 0 < bw["pct_of_limit"]
    assert bw["limit_tok_s"] == pytest.approx(bw["copy_gb_s"] * 1e9 / bw["bytes_per_token"], rel=0.01)


def test_offline_rich_table_and_rate():
    r = _bench(["--model", "builtin:tiny-qwen35", "-n", "3", "--prompt-len", "8", "--output-len", "4",
                "--request-rate", "50", "--device", "cpu", "--no-progress"])
    assert r.exit_code == 0, r.output
    for label in ("output tok/s", "prefill tok/s", "TTFT p50 / p99", "ITL p50 / p99", "3 ok, 0 failed"):
        assert label in r.stdout


@pytest.mark.parametrize("args, msg", [
    (["--model", "builtin:tiny-qwen35", "--shape", "qwen3.5-9b"], "exactly one of"),
    (["--shape", "qwen3.5-1b"], "unknown model shape"),
    (["--model", "builtin:tiny-qwen35", "--prompt-len", "9:3"], "bad --prompt-len"),
    (["--url", "http://127.0.0.1:9", "--model", "x"], "leave out --model"),
    (["--url", "http://127.0.0.1:9", "-n", "1"], "cannot reach"),
    (["--url", "http://127.0.0.1:9", "--multi-turn", "2"], "--multi-turn runs the embedded engine"),
    (["--model", "builtin:tiny-qwen35", "--multi-turn", "2", "--prompt-len", "9:30"], "fixed lengths"),
    (["--model", "builtin:tiny-qwen35", "--prompt-len", "5000", "--max-model-len", "256"], "exceeds max_model_len"),
])
def test_bad_input_is_a_message(args, msg):
    from g906.cli.app import main  # noqa: F401  (the error mapping lives in main)
    import subprocess
    import sys

    p = subprocess.run([sys.executable, "-m", "g906", "bench", *args, "--device", "cpu"] if "--url" not in args
                       else [sys.executable, "-m", "g906", "bench", *args], capture_output=True, text=True,
                       timeout=120)
    assert p.returncode in (1, 2), p.stderr
    assert msg in p.stderr and "Traceback" not in p.stderr


def test_negative_prefill_graphs_is_a_usage_error():
    r = _bench(["--model", "builtin:tiny-qwen35", "--prefill-graphs", "-1", "--device", "cpu"])
    assert r.exit_code == 2 and "--prefill-graphs" in r.output


# -- online ----------------------------------------------------------------------------------

RECIPE = """
[model]
source = "builtin:tiny-qwen35"
name = "tiny"

[limits]
max_model_len = 512
max_num_seqs = 8
max_num_batched_tokens = 256
"""


@pytest.fixture(scope="module")
def served(tmp_path_factory):
    from tests.server.conftest import start_server, stop_server

    s = start_server(tmp_path_factory.mktemp("bench-up"), RECIPE)
    yield s
    assert stop_server(s) == 0


def test_online_against_g906_up(served):
    from g906.bench.metrics import LengthSpec, Workload
    from g906.bench.online import run_online

    wl = Workload(num_requests=6, prompt_len=LengthSpec(16, 32), output_len=LengthSpec(10, 10), concurrency=3)
    res = run_online(served.url, wl, vocab=500)
    _check(res, 6, 10)
    assert res["served_model"] == "tiny"
    # the server agrees on the token counts (its own counters)
    m = served.metrics()
    assert any("generation" in k or "tokens" in k for k in m)


def test_online_cli_text_prompts_and_rate(served):
    r = _bench(["--url", served.url, "-n", "4", "--prompt-len", "12", "--output-len", "5", "-c", "2",
                "--request-rate", "20", "--prompt-mode", "text", "--vocab", "500", "--json"])
    assert r.exit_code == 0, r.output
    res = json.loads(r.stdout[r.stdout.index("{"):])
    _check(res, 4, 5)
    assert res["mode"] == "online" and res["workload"]["request_rate"] == 20


def test_online_counts_match_the_openai_client(served):
    openai = pytest.importorskip("openai")
    client = openai.OpenAI(base_url=served.url + "/v1", api_key="none", max_retries=0, timeout=60)
    out = client.completions.create(model="tiny", prompt=list(range(100, 120)), max_tokens=7, temperature=0,
                                    extra_body={"ignore_eos": True})
    assert out.usage.completion_tokens == 7
    from g906.bench.metrics import LengthSpec, Workload
    from g906.bench.online import run_online

    res = run_online(served.url, Workload(num_requests=1, prompt_len=LengthSpec(20, 20),
                                          output_len=LengthSpec(7, 7)), vocab=500, warm=False)
    assert res["output_tokens"] == 7


def test_write_gguf_then_bench_the_file(tmp_path):
    path = tmp_path / "tiny-q4k.gguf"
    r = _bench(["--shape", "qwen3.5-9b", *SMALL, "--quant", "q4_k", "--write-gguf", str(path), "--json"])
    assert r.exit_code == 0, r.output
    info = json.loads(r.stdout[r.stdout.index("{"):])
    assert info["bytes"] == path.stat().st_size and info["tensors"] > 0
    import gguf

    types = {t.name: t.tensor_type.name for t in gguf.GGUFReader(str(path)).tensors}
    assert types["output.weight"] == "Q6_K" and types["blk.3.ffn_down.weight"] == "Q6_K"
    assert types["blk.0.attn_qkv.weight"] == "Q5_K" and types["blk.1.ffn_gate.weight"] == "Q4_K"
    assert types["blk.0.ssm_conv1d.weight"] == "F32" and types["output_norm.weight"] == "F32"
    r = _bench(["--model", str(path), "-n", "2", "-c", "1", "--prompt-len", "16", "--output-len", "4",
                "--json", "--device", "cpu"])
    assert r.exit_code == 0, r.output
    res = json.loads(r.stdout[r.stdout.index("{"):])
    _check(res, 2, 4)
    assert res["bandwidth"]["bytes_per_token"] > 0
    r = _bench(["--model", "builtin:tiny-qwen35", "--write-gguf", str(tmp_path / "x.gguf")])
    assert r.exit_code != 0


def test_write_moe_gguf_as_llama_cpp_lays_it_out_then_bench_it(tmp_path):
    path = tmp_path / "tiny-moe-q4k.gguf"
    moe = ["--shape-override", "num_experts=8", "--shape-override", "num_experts_per_tok=2",
           "--shape-override", "moe_intermediate_size=256", "--shape-override", "shared_expert_intermediate_size=256"]
    pairs = [SMALL[i:i + 2] for i in range(0, len(SMALL), 2)]
    small = [a for pair in pairs if not pair[1].startswith("intermediate_size") for a in pair]
    r = _bench(["--shape", "qwen3.5-35b-a3b", *small, *moe, "--quant", "q4_k", "--write-gguf", str(path), "--json"])
    assert r.exit_code == 0, r.output
    import gguf

    reader = gguf.GGUFReader(str(path))
    assert bytes(reader.fields["general.architecture"].parts[-1]).decode() == "qwen35moe"
    assert int(reader.fields["qwen35moe.expert_count"].parts[-1][0]) == 8
    tensors = {t.name: t for t in reader.tensors}
    # llama.cpp's element order: [in, out, experts]; the router and the shared gate stay F32
    assert [int(x) for x in tensors["blk.0.ffn_gate_exps.weight"].shape] == [256, 256, 8]
    assert [int(x) for x in tensors["blk.0.ffn_down_exps.weight"].shape] == [256, 256, 8]
    assert tensors["blk.0.ffn_gate_exps.weight"].tensor_type.name == "Q4_K"
    assert tensors["blk.3.ffn_down_exps.weight"].tensor_type.name == "Q6_K"
    assert tensors["blk.0.ffn_gate_inp.weight"].tensor_type.name == "F32"
    assert [int(x) for x in tensors["blk.0.ffn_gate_inp_shexp.weight"].shape] == [256]
    r = _bench(["--model", str(path), "-n", "2", "-c", "2", "--prompt-len", "16", "--output-len", "4",
                "--json", "--device", "cpu"])
    assert r.exit_code == 0, r.output
    _check(json.loads(r.stdout[r.stdout.index("{"):]), 2, 4)


def test_offline_recipe(tmp_path):
    recipe = tmp_path / "r.toml"
    recipe.write_text('[model]\nsource = "builtin:tiny-qwen35"\n\n[limits]\nmax_model_len = 256\nmax_num_seqs = 2\n')
    r = _bench(["--recipe", str(recipe), "-n", "3", "--prompt-len", "16", "--output-len", "4", "--device", "cpu",
                "--json"])
    assert r.exit_code == 0, r.output
    res = json.loads(r.stdout[r.stdout.index("{"):])
    _check(res, 3, 4)
    assert res["engine"]["max_num_seqs"] == 2 and res["engine"]["max_model_len"] == 256


def test_multi_turn_reports_hits_and_ttft_per_turn():
    base = ["--model", "builtin:tiny-qwen35", "--multi-turn", "3", "--prompt-len", "40", "--turn-len", "10",
            "--output-len", "4", "--device", "cpu", "--json"]
    r = _bench(base)
    assert r.exit_code == 0, r.output
    res = json.loads(r.stdout[r.stdout.index("{"):])
    assert res["mode"] == "multi-turn" and res["prefix_caching"] is True
    turns = res["turns"]
    assert [t["prompt_tokens"] for t in turns] == [40, 54, 68]
    assert turns[0]["cached_tokens"] == 0
    # each turn resumes at the previous prompt's end, rounded down to the block size (16)
    assert turns[1]["cached_tokens"] == 32 and turns[2]["cached_tokens"] == 48
    assert all(t["ttft_ms"] > 0 for t in turns) and res["hit_rate"] == (32 + 48) / (54 + 68)
    off = json.loads((r2 := _bench(base + ["--no-prefix-caching", "--drop-answer"])).stdout[r2.stdout.index("{"):])
    assert off["prefix_caching"] is False and all(t["cached_tokens"] == 0 for t in off["turns"])
    assert [t["prompt_tokens"] for t in off["turns"]] == [40, 50, 60]


def test_offline_speculative_reports_acceptance_and_speedup(tmp_path):
    """--speculative-config: the run with speculation, then the same workload without it."""
    from tests.engine.gguf_writer import write_gguf
    from tests.engine.spec_models import markov_mtp_dir

    d = markov_mtp_dir(tmp_path)
    gguf = write_gguf(d, tmp_path / "m.gguf", qtype="F32", mtp_layers=1, tokenizer_dir=d)[0]
    r = _bench(["--model", str(gguf), "-n", "2", "--prompt-len", "8", "--output-len", "12", "--json",
                "--no-bandwidth", "--device", "cpu", "--speculative-config",
                '{"method": "mtp", "num_speculative_tokens": 2}'])
    assert r.exit_code == 0, r.output
    res = json.loads(r.stdout[r.stdout.index("{"):])
    # tokens of one verify step arrive together: inter-token latencies of 0 are real here
    assert res["completed"] == 2 and res["output_tokens"] == 24 and res["output_tok_s"] > 0
    sp = res["speculative"]
    assert sp["config"] == {"method": "mtp", "num_speculative_tokens": 2}
    assert sp["drafts"] > 0 and 1.0 <= sp["mean_acceptance_length"] <= 3.0
    assert len(sp["accepted_per_pos"]) == 2 and sp["speedup"] > 0 and sp["baseline_output_tok_s"] > 0
    import subprocess
    import sys

    bad = subprocess.run([sys.executable, "-m", "g906", "bench", "--model", str(gguf), "-n", "1",
                          "--speculative-config", '{"method": "mtp"}'], capture_output=True, text=True, timeout=120)
    assert bad.returncode == 2 and "num_speculative_tokens: is required" in bad.stderr + bad.stdout
