"""Plan -> `vllm serve` argv and environment: the seed project's documented deployments, every
translation rule, what an installed vLLM cannot do, and a dry-run text that runs as printed."""

import json
import shlex
import subprocess

import pytest

from g906.backends.errors import MissingSecretError, VllmUnsupportedError
from g906.backends.vllm import (
    build_vllm_command,
    check_plan_against_vllm,
    detect_vllm,
    format_dry_run,
)

from .planfactory import make_plan, plan_from_toml

SEED_08B = """
[model]
source = "Qwen/Qwen3.5-0.8B"
[limits]
max_model_len = 8192
[multimodal]
image = 0
video = 0
[engine]
kind = "vllm"
reasoning_parser = "qwen3"
[engine.vllm]
use_modelscope = true
[server]
port = 8000
"""

SEED_27B = """
[model]
source = "/path/to/Qwen3.8-27B-UD-Q6_K_XL.gguf"
[parallel]
tensor_parallel_size = 2
devices = [0, 1]
[limits]
max_model_len = "32k"
[engine]
kind = "vllm"
reasoning_parser = "qwen3"
[server]
port = 8000
"""

SEED_MM = """
[model]
source = "/models/Qwen3.5-9B-Q8_0.gguf"
[multimodal]
image = { count = 1, width = 512, height = 512 }
[engine]
kind = "vllm"
"""

# The command lines the seed project (a gfx906 vLLM fork) documents for these deployments.
DOC_08B = """VLLM_USE_MODELSCOPE=true vllm serve Qwen/Qwen3.5-0.8B --port 8000 --tensor-parallel-size 1
  --max-model-len 8192 --reasoning-parser qwen3_5 --limit-mm-per-prompt '{"image": 0, "video": 0}'"""
DOC_27B = """HIP_VISIBLE_DEVICES=0,1 vllm serve /path/to/Qwen3.8-27B-UD-Q6_K_XL.gguf --port 8000
  --tensor-parallel-size 2 --max-model-len 32768 --reasoning-parser qwen3_5
  --limit-mm-per-prompt '{"image": 0, "video": 0}'"""
DOC_MM = """vllm serve /models/Qwen3.5-9B-Q8_0.gguf
  --limit-mm-per-prompt '{"image":{"count":1,"width":512,"height":512},"video":0}'"""


def _pairs(argv):
    """{flag: value or True} of an argv after `serve MODEL` (values JSON-decoded when they are JSON)."""
    out, i = {}, 0
    while i < len(argv):
        tok = argv[i]
        if i + 1 < len(argv) and not argv[i + 1].startswith("--"):
            val = argv[i + 1]
            try:
                val = json.loads(val) if val.startswith("{") else val
            except ValueError:
                pass
            out[tok] = val
            i += 2
        else:
            out[tok] = True
            i += 1
    return out


def assert_documented(cmd, documented: str):
    """Every env assignment, the model, and every flag of the documented line are in cmd."""
    toks = shlex.split(documented)
    env = {}
    while "=" in toks[0] and not toks[0].startswith("-"):
        k, v = toks.pop(0).split("=", 1)
        env[k] = v
    assert toks[:2] == ["vllm", "serve"]
    model = toks[2]
    assert cmd.argv[1:3] == ["serve", model]
    for k, v in env.items():
        assert cmd.env.get(k) == v, (k, cmd.env)
    mine = _pairs(cmd.argv[3:])
    for flag, value in _pairs(toks[3:]).items():
        assert mine.get(flag) == value, (flag, value, mine.get(flag))


def test_seed_qwen35_08b(vllm):
    cmd = build_vllm_command(plan_from_toml(SEED_08B), vllm, environ={})
    assert cmd.argv == [
        vllm.command[0], "serve", "Qwen/Qwen3.5-0.8B",
        "--served-model-name", "Qwen/Qwen3.5-0.8B",
        "--host", "127.0.0.1", "--port", "8000",
        "--tensor-parallel-size", "1",
        "--max-model-len", "8192",
        "--max-num-seqs", "16",
        "--gpu-memory-utilization", "0.9",
        "--dtype", "float16",
        "--reasoning-parser", "qwen3_5",
        "--enable-auto-tool-choice", "--tool-call-parser", "qwen3_coder",
        "--limit-mm-per-prompt", '{"image": 0, "video": 0}',
    ]
    assert cmd.env == {"VLLM_USE_MODELSCOPE": "true"}
    assert cmd.unset_env == []
    assert_documented(cmd, DOC_08B)


def test_seed_27b_gguf_on_two_gpus(vllm):
    cmd = build_vllm_command(plan_from_toml(SEED_27B), vllm, environ={})
    assert cmd.argv[1:] == [
        "serve", "/path/to/Qwen3.8-27B-UD-Q6_K_XL.gguf",
        "--served-model-name", "Qwen3.8-27B-UD-Q6_K_XL",
        "--host", "127.0.0.1", "--port", "8000",
        "--tensor-parallel-size", "2",
        "--max-model-len", "32768",
        "--max-num-seqs", "16",
        "--gpu-memory-utilization", "0.9",
        "--dtype", "float16",
        "--reasoning-parser", "qwen3_5",
        "--enable-auto-tool-choice", "--tool-call-parser", "qwen3_coder",
        "--limit-mm-per-prompt", '{"image": 0, "video": 0}',
    ]
    assert cmd.env == {"HIP_VISIBLE_DEVICES": "0,1"}
    assert_documented(cmd, DOC_27B)


def test_seed_multimodal_gguf(vllm):
    cmd = build_vllm_command(plan_from_toml(SEED_MM), vllm, environ={})
    i = cmd.argv.index("--limit-mm-per-prompt")
    assert cmd.argv[i + 1] == '{"image": {"count": 1, "width": 512, "height": 512}, "video": 0}'
    assert "--reasoning-parser" not in cmd.argv
    assert_documented(cmd, DOC_MM)


def test_every_recipe_key_reaches_the_command(vllm):
    plan = make_plan(
        model={"source": "/models/Qwen3.5-9B", "name": "q9", "dtype": "float32"},
        parallel={"tensor_parallel_size": 2, "devices": [2, 3]},
        limits={"max_model_len": "16k", "max_num_seqs": 8, "max_num_batched_tokens": 2048,
                "gpu_memory_utilization": 0.85},
        multimodal={"image": 2, "video": {"count": 1, "width": 320, "height": 240}},
        engine={"kind": "vllm", "enforce_eager": True,
                "vllm": {"skip_mm_profiling": True, "use_modelscope": True, "gfx906_mobydick_awq": True,
                         "extra_args": ["--kv-cache-dtype", "fp8", "--enable-prefix-caching"]
                         if False else ["--kv-cache-dtype", "fp8", "--block-size=32", "--trust-remote-code"]}},
        server={"host": "0.0.0.0", "port": 9001, "api_key_env": "G906_TEST_KEY", "tool_parser": "qwen3_coder"},
        env={"ROCBLAS_TENSILE_LIBPATH": "/opt/tensile/gfx906", "PYTORCH_ROCM_ARCH": "gfx906"},
    )
    cmd = build_vllm_command(plan, vllm, environ={"G906_TEST_KEY": "sk-secret"})
    assert cmd.argv[1:] == [
        "serve", "/models/Qwen3.5-9B",
        "--served-model-name", "q9",
        "--host", "0.0.0.0", "--port", "9001",
        "--tensor-parallel-size", "2",
        "--max-model-len", "16384",
        "--max-num-seqs", "8",
        "--max-num-batched-tokens", "2048",
        "--gpu-memory-utilization", "0.85",
        "--dtype", "float32",
        "--enforce-eager",
        "--enable-auto-tool-choice", "--tool-call-parser", "qwen3_coder",
        "--limit-mm-per-prompt", '{"image": 2, "video": {"count": 1, "width": 320, "height": 240}}',
        "--skip-mm-profiling",
        "--api-key", "sk-secret",
        "--kv-cache-dtype", "fp8", "--block-size=32", "--trust-remote-code",
    ]
    assert cmd.env == {
        "HIP_VISIBLE_DEVICES": "2,3",
        "ROCBLAS_TENSILE_LIBPATH": "/opt/tensile/gfx906",
        "PYTORCH_ROCM_ARCH": "gfx906",
        "VLLM_USE_MODELSCOPE": "true",
        "VLLM_ROCM_USE_GFX906_MOBYDICK_AWQ": "1",
    }
    assert cmd.api_key == "sk-secret" and cmd.port == 9001 and cmd.host == "0.0.0.0"
    # the key never shows: not in the display, the dry run, the redacted argv or repr()
    text = format_dry_run(cmd)
    for shown in (cmd.display, text, " ".join(cmd.redacted_argv), repr(cmd)):
        assert "sk-secret" not in shown
    assert '--api-key "$G906_TEST_KEY"' in cmd.display


def test_tool_parser_auto_none_and_refusals(vllm):
    """server.tool_parser: auto takes the architecture's parser (qwen3_coder for Qwen3.5); none
    passes no tool flags; a vLLM without the flags, or without the parser, is refused by name."""
    plan = make_plan(model={"source": "/models/Qwen3.5-9B"}, engine={"kind": "vllm", "reasoning_parser": "auto"})
    cmd = build_vllm_command(plan, vllm, environ={})
    i = cmd.argv.index("--tool-call-parser")
    assert cmd.argv[i - 1:i + 2] == ["--enable-auto-tool-choice", "--tool-call-parser", "qwen3_coder"]
    assert _value(cmd, "--reasoning-parser") == "qwen3_5"           # auto: the architecture's qwen3
    plan = make_plan(model={"source": "/models/Qwen3.5-9B"}, engine={"kind": "vllm"}, server={"tool_parser": "none"})
    cmd = build_vllm_command(plan, vllm, environ={})
    assert "--tool-call-parser" not in cmd.argv and "--enable-auto-tool-choice" not in cmd.argv


def test_dtype_auto_means_float16_and_explicit_dtypes_pass(vllm):
    assert "float16" == _value(build_vllm_command(make_plan(), vllm, environ={}), "--dtype")
    cmd = build_vllm_command(make_plan(model={"source": "/m/x", "dtype": "bfloat16"}), vllm, environ={})
    assert _value(cmd, "--dtype") == "bfloat16"


def _value(cmd, flag):
    return cmd.argv[cmd.argv.index(flag) + 1]


def test_defaults_text_only_and_no_optional_flags(vllm):
    cmd = build_vllm_command(make_plan(), vllm, environ={})
    for absent in ("--max-model-len", "--max-num-batched-tokens", "--enforce-eager", "--reasoning-parser",
                   "--skip-mm-profiling", "--api-key"):
        assert absent not in cmd.argv
    assert _value(cmd, "--limit-mm-per-prompt") == '{"image": 0, "video": 0}'
    assert cmd.env == {}


def test_reasoning_parser_follows_the_installed_vllm(fake_vllm):
    plan = make_plan(engine={"kind": "vllm", "reasoning_parser": "qwen3"})
    fake_vllm.set(flavor="upstream")                  # choices checked after parsing: not in --help
    assert _value(build_vllm_command(plan, detect_vllm(), environ={}), "--reasoning-parser") == "qwen3"


def test_legacy_vllm_spelling(fake_vllm):
    fake_vllm.set(flavor="legacy", version="0.8.5")
    inst = detect_vllm()
    plan = make_plan(engine={"kind": "vllm", "reasoning_parser": "qwen3"}, multimodal={"image": 1})
    cmd = build_vllm_command(plan, inst, environ={})
    i = cmd.argv.index("--enable-reasoning")
    assert cmd.argv[i + 1:i + 3] == ["--reasoning-parser", "qwen3"]
    assert _value(cmd, "--limit-mm-per-prompt") == "image=1,video=0"


def test_unsupported_requests_fail_with_reasons(fake_vllm):
    fake_vllm.set(flavor="legacy", version="0.8.5")
    inst = detect_vllm()
    plan = make_plan(
        multimodal={"image": {"count": 1, "width": 512, "height": 512}},
        engine={"kind": "vllm", "vllm": {"skip_mm_profiling": True}},
    )
    problems = check_plan_against_vllm(plan, inst)
    assert any("--skip-mm-profiling" in p and "engine.vllm.skip_mm_profiling" in p for p in problems)
    assert any("width/height" in p for p in problems)
    assert all("vLLM 0.8.5" in p for p in problems)
    with pytest.raises(VllmUnsupportedError) as ei:
        build_vllm_command(plan, inst, environ={})
    assert ei.value.exit_code == 2
    assert len(ei.value.details) == 2


def test_missing_reasoning_parser_lists_the_choices(vllm):
    inst = vllm
    inst.flags["--reasoning-parser"].choices = ["deepseek_r1", "granite"]
    problems = check_plan_against_vllm(make_plan(engine={"kind": "vllm", "reasoning_parser": "qwen3"}), inst)
    assert len(problems) == 1
    assert "qwen3_5 or qwen3" in problems[0] and "deepseek_r1, granite" in problems[0]


def test_extra_args_are_checked_against_help(vllm):
    def problems(extra):
        return check_plan_against_vllm(make_plan(engine={"kind": "vllm", "vllm": {"extra_args": extra}}), vllm)

    assert problems(["--kv-cache-dtype", "fp8", "-tp", "1"]) == [
        "engine.vllm.extra_args[2]: -tp is set by g906 from the recipe; use parallel.tensor_parallel_size instead"]
    assert problems(["--trust-remote-code", "--limit-mm-per-prompt.image", "2"]) == [
        "engine.vllm.extra_args[1]: --limit-mm-per-prompt.image is set by g906 from the recipe; "
        "use [multimodal] image / video instead"]
    (p,) = problems(["--kv-cache-dtyp", "fp8"])
    assert "has no --kv-cache-dtyp flag; did you mean --kv-cache-dtype?" in p
    (p,) = problems(["--kv-cache-dtype", "int3"])
    assert "'int3' is not one of --kv-cache-dtype's choices" in p
    (p,) = problems(["--kv_cache_dtype=fp9"])
    assert "'fp9'" in p
    (p,) = problems(["/models/other"])
    assert "is not a flag" in p
    (p,) = problems(["--port", "1"])
    assert "server.port" in p
    assert "has no --max-num-seqs-typo flag" in problems(["--seed", "-1", "--max_num_seqs_typo"])[0]
    assert problems(["--seed=3", "--distributed-executor-backend", "mp", "-O", "3", "-O3"]) == []


def test_builtin_model_cannot_go_to_vllm(vllm):
    (p,) = check_plan_against_vllm(make_plan(model={"source": "builtin:tiny"}, engine={"kind": "embedded"}), vllm)
    assert "engine.kind = \"embedded\"" in p


def test_env_devices_conflict(vllm):
    plan = make_plan(parallel={"tensor_parallel_size": 2, "devices": [0, 1]}, env={"HIP_VISIBLE_DEVICES": "2,3"})
    (p,) = check_plan_against_vllm(plan, vllm)
    assert "parallel.devices" in p


def test_missing_api_key(vllm):
    plan = make_plan(server={"api_key_env": "G906_NOT_SET"})
    with pytest.raises(MissingSecretError, match=r"\$G906_NOT_SET is not set"):
        build_vllm_command(plan, vllm, environ={})
    cmd = build_vllm_command(plan, vllm, environ={}, allow_missing_secret=True)   # --dry-run
    assert cmd.missing_secrets == ["G906_NOT_SET"]
    assert "$G906_NOT_SET is not set" in format_dry_run(cmd)


def test_conflicting_cuda_visible_devices_is_unset(vllm):
    plan = make_plan(parallel={"tensor_parallel_size": 2, "devices": [0, 1]})
    cmd = build_vllm_command(plan, vllm, environ={"CUDA_VISIBLE_DEVICES": "3"})
    assert cmd.unset_env == ["CUDA_VISIBLE_DEVICES"]
    full = cmd.full_env({"CUDA_VISIBLE_DEVICES": "3", "HOME": "/h"})
    assert full == {"HIP_VISIBLE_DEVICES": "0,1", "HOME": "/h"}
    assert cmd.display.startswith("env -u CUDA_VISIBLE_DEVICES \\\nHIP_VISIBLE_DEVICES=0,1 \\\n")
    same = build_vllm_command(plan, vllm, environ={"CUDA_VISIBLE_DEVICES": "0,1"})
    assert same.unset_env == []


def test_dry_run_text(vllm, monkeypatch):
    import os

    monkeypatch.setenv("PATH", os.path.dirname(vllm.command[0]) + ":/usr/bin:/bin")  # `vllm` is found
    cmd = build_vllm_command(plan_from_toml(SEED_27B), vllm, environ={})
    text = format_dry_run(cmd)
    assert text.splitlines()[0].startswith("# vLLM 0.11.1.dev7+gfx906")
    assert text.splitlines()[1:] == [
        "HIP_VISIBLE_DEVICES=0,1 \\",
        "vllm serve /path/to/Qwen3.8-27B-UD-Q6_K_XL.gguf \\",
        "  --served-model-name Qwen3.8-27B-UD-Q6_K_XL \\",
        "  --host 127.0.0.1 \\",
        "  --port 8000 \\",
        "  --tensor-parallel-size 2 \\",
        "  --max-model-len 32768 \\",
        "  --max-num-seqs 16 \\",
        "  --gpu-memory-utilization 0.9 \\",
        "  --dtype float16 \\",
        "  --reasoning-parser qwen3_5 \\",
        "  --enable-auto-tool-choice \\",
        "  --tool-call-parser qwen3_coder \\",
        "  --limit-mm-per-prompt '{\"image\": 0, \"video\": 0}'",
    ]


def test_dry_run_text_runs_as_printed(fake_vllm, vllm, tmp_path):
    """Paste the dry run into bash: the fake vllm receives exactly cmd.argv and cmd.env."""
    plan = make_plan(
        model={"source": "/models/My Model's dir", "name": "a b"},
        parallel={"tensor_parallel_size": 1, "devices": [1]},
        multimodal={"image": {"count": 1, "width": 512, "height": 512}},
        engine={"kind": "vllm", "reasoning_parser": "qwen3", "vllm": {"use_modelscope": True}},
        server={"api_key_env": "G906_TEST_KEY"},
        env={"WEIRD": "a b $HOME 'q'"},
    )
    cmd = build_vllm_command(plan, vllm, environ={"G906_TEST_KEY": "k e y"})
    fake_vllm.set(mode="crash", delay="0")
    env = {"PATH": str(fake_vllm.bin) + ":/usr/bin:/bin", "G906_TEST_KEY": "k e y",
           "FAKE_VLLM_RECORD": str(fake_vllm.record), "FAKE_VLLM_MODE": "crash", "FAKE_VLLM_DELAY": "0"}
    subprocess.run(["bash", "-c", format_dry_run(cmd)], env=env, capture_output=True, timeout=30)
    rec = fake_vllm.recorded()
    assert rec["argv"] == cmd.argv[1:]
    for k, v in cmd.env.items():
        assert rec["env"][k] == v


def test_mmproj_must_sit_beside_the_gguf(vllm):
    from pathlib import Path

    plan = make_plan(model={"source": "/m/a/Qwen3.5-9B-Q4_K_M.gguf"}, multimodal={"image": 1})
    plan.mmproj_path = Path("/m/b/mmproj-F16.gguf")
    (p,) = check_plan_against_vllm(plan, vllm)
    assert "not beside /m/a/Qwen3.5-9B-Q4_K_M.gguf" in p
    plan.mmproj_path = Path("/m/a/mmproj-F16.gguf")
    assert check_plan_against_vllm(plan, vllm) == []


def test_dollar_in_values_is_quoted_literally(vllm):
    plan = make_plan(engine={"kind": "vllm", "vllm": {"extra_args": ["--chat-template", "$HOME/t.jinja"]}})
    cmd = build_vllm_command(plan, vllm, environ={})
    assert "  --chat-template '$HOME/t.jinja'" in cmd.display.splitlines()[-1]


def test_default_log_file(vllm, monkeypatch, tmp_path):
    from g906.backends.vllm import default_log_file

    cmd = build_vllm_command(make_plan(model={"source": "Qwen/Qwen3.5-0.8B"}), vllm, environ={})
    monkeypatch.delenv("G906_LOG_DIR", raising=False)
    monkeypatch.setenv("XDG_STATE_HOME", str(tmp_path))
    assert default_log_file(cmd) == tmp_path / "g906" / "logs" / "vllm-Qwen_Qwen3.5-0.8B-8000.log"
    monkeypatch.setenv("G906_LOG_DIR", "/var/log/g906")
    assert str(default_log_file(cmd)) == "/var/log/g906/vllm-Qwen_Qwen3.5-0.8B-8000.log"


@pytest.mark.parametrize("scheme, flag", [("gptq", "gptq"), ("awq", "awq"),
                                          ("compressed-tensors", "compressed-tensors")])
def test_quantized_checkpoint_passes_its_quantization(vllm, scheme, flag):
    import dataclasses

    plan = dataclasses.replace(make_plan(model={"source": "/m/q"}), quantization=scheme)
    assert _value(build_vllm_command(plan, vllm, environ={}), "--quantization") == flag
    # a choice in extra_args (e.g. a Marlin kernel) is the user's: not doubled
    own = dataclasses.replace(make_plan(model={"source": "/m/q"}, engine={"kind": "vllm", "vllm": {
        "extra_args": ["--quantization", "gptq_marlin"]}}), quantization="gptq")
    cmd = build_vllm_command(own, vllm, environ={})
    assert cmd.argv.count("--quantization") == 1 and _value(cmd, "--quantization") == "gptq_marlin"
    for other in ("none", "gguf"):
        assert "--quantization" not in build_vllm_command(
            dataclasses.replace(make_plan(model={"source": "/m/q"}), quantization=other), vllm, environ={}).argv
