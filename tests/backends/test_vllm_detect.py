"""Finding vLLM and reading its version and `serve` flags, with the on-disk cache."""

import sys

import pytest

from g906.backends import vllm_detect
from g906.backends.errors import VllmNotFoundError, VllmProbeError
from g906.backends.vllm import detect_vllm


def test_detects_vllm_on_path(fake_vllm):
    inst = detect_vllm()
    assert inst.command == [str(fake_vllm.exe)]
    assert inst.source == "executable"
    assert inst.version == "0.11.1.dev7+gfx906"
    assert inst.help_mode == "all"
    for flag in ("--served-model-name", "--host", "--port", "--tensor-parallel-size", "--max-model-len",
                 "--max-num-seqs", "--max-num-batched-tokens", "--gpu-memory-utilization", "--dtype",
                 "--enforce-eager", "--reasoning-parser", "--limit-mm-per-prompt", "--skip-mm-profiling",
                 "--api-key", "-tp", "--no-enforce-eager"):
        assert inst.supports(flag), flag
    assert not inst.supports("--enable-reasoning")
    assert inst.choices("--reasoning-parser") == ["deepseek_r1", "glm45", "qwen3", "qwen3_5"]
    assert inst.mm_limit_format == "json-options"


def test_help_is_read_once_then_cached_on_disk(fake_vllm):
    detect_vllm()
    calls = fake_vllm.call_log()
    assert calls.count("help=all") == 1 and calls.count("version") == 1
    vllm_detect.clear_memo()                          # a new g906 process: the disk cache answers
    again = detect_vllm()
    assert fake_vllm.call_log() == calls
    assert again.version == "0.11.1.dev7+gfx906" and again.supports("--skip-mm-profiling")
    assert again.flag("-tp") is again.flag("--tensor-parallel-size")
    detect_vllm(refresh=True)
    assert fake_vllm.call_log().count("help=all") == 2


def test_cache_follows_the_executable(fake_vllm):
    detect_vllm()
    vllm_detect.clear_memo()
    fake_vllm.set(version="0.12.0")
    text = fake_vllm.exe.read_text()
    fake_vllm.exe.write_text(text + "\n# reinstalled\n")   # pip rewrites the script on reinstall
    inst = detect_vllm()
    assert inst.version == "0.12.0"


def test_legacy_vllm_falls_back_to_plain_help(fake_vllm):
    fake_vllm.set(flavor="legacy", version="0.8.5")
    inst = detect_vllm()
    assert inst.help_mode == "plain"
    assert inst.version == "0.8.5"
    assert inst.supports("--enable-reasoning")
    assert not inst.supports("--skip-mm-profiling")
    assert inst.mm_limit_format == "kv"
    assert inst.choices("--reasoning-parser") == ["deepseek_r1", "granite", "qwen3"]


def test_explicit_executable_path(fake_vllm, tmp_path, monkeypatch):
    monkeypatch.setenv("PATH", "/usr/bin:/bin")
    inst = detect_vllm(executable=str(fake_vllm.exe))
    assert inst.command == [str(fake_vllm.exe)]


def test_python_interpreter_mode(fake_vllm, monkeypatch):
    fake_vllm.python_package()
    monkeypatch.setenv("PATH", "/usr/bin:/bin")      # no vllm program: only the interpreter's package
    inst = detect_vllm(python=sys.executable)
    assert inst.source == "python"
    assert inst.command == [sys.executable, "-m", "vllm.entrypoints.cli.main"]
    assert inst.version == "0.11.1.dev7+gfx906"      # no dist-info: asked `--version`
    assert inst.supports("--reasoning-parser")


def test_interpreter_without_vllm(fake_vllm):
    with pytest.raises(VllmNotFoundError, match="has no vllm package"):
        detect_vllm(python=sys.executable)


def test_not_on_path(monkeypatch, tmp_path):
    vllm_detect.clear_memo()
    monkeypatch.setenv("PATH", str(tmp_path))
    with pytest.raises(VllmNotFoundError, match="not found on PATH") as ei:
        detect_vllm()
    assert "engine.vllm.python" in ei.value.hint


def test_missing_explicit_paths(tmp_path):
    with pytest.raises(VllmNotFoundError, match="does not exist"):
        detect_vllm(executable=str(tmp_path / "nope" / "vllm"))
    with pytest.raises(VllmNotFoundError, match="does not exist"):
        detect_vllm(python=str(tmp_path / "python9"))
    (tmp_path / "plain").write_text("x")
    with pytest.raises(VllmNotFoundError, match="not an executable"):
        detect_vllm(executable=str(tmp_path / "plain"))


def test_both_python_and_executable_is_an_error(fake_vllm):
    with pytest.raises(VllmNotFoundError, match="both set"):
        detect_vllm(python=sys.executable, executable=str(fake_vllm.exe))


def test_broken_vllm_reports_its_error(fake_vllm):
    fake_vllm.set(flavor="broken")
    with pytest.raises(VllmProbeError) as ei:
        detect_vllm()
    assert any("libamdhip64" in line for line in ei.value.details)


def test_recipe_paths_are_relative_to_the_recipe(fake_vllm, tmp_path, monkeypatch):
    from g906.backends.vllm import detect_vllm_for_plan

    from .planfactory import make_plan

    monkeypatch.setenv("PATH", "/usr/bin:/bin")
    plan = make_plan(engine={"kind": "vllm", "vllm": {"executable": "bin/vllm"}})
    plan.recipe_path = tmp_path / "recipe.toml"          # the fake lives in tmp_path/bin/vllm
    inst = detect_vllm_for_plan(plan)
    assert inst.command == [str(fake_vllm.exe)]


def test_vllm_problems_for_validate(fake_vllm, monkeypatch):
    from g906.backends.vllm import vllm_problems

    from .planfactory import make_plan

    assert vllm_problems(make_plan()) == []
    assert vllm_problems(make_plan(engine={"kind": "vllm", "vllm": {"extra_args": ["--nope"]}}))[0].endswith(
        "has no --nope flag")
    monkeypatch.setenv("PATH", "/nonexistent")
    (p,) = vllm_problems(make_plan())
    assert "not found on PATH" in p and "engine.vllm.python" in p


REGISTRY = '''
_REASONING_PARSERS_TO_REGISTER = {
    "deepseek_r1": (  # name
        "deepseek_r1_reasoning_parser",  # filename
        "DeepSeekR1ReasoningParser",  # class_name
    ),
    "qwen3_5": (
        "qwen3_5_reasoning_parser",
        "Qwen35ReasoningParser",
    ),
}
'''
OLD_STYLE = '''
@ReasoningParserManager.register_module("granite")
class GraniteReasoningParser: ...

@ReasoningParserManager.register_module(["qwen3", "qwen3-alias"])
class Qwen3ReasoningParser: ...
'''


def test_reasoning_parsers_read_from_the_package_source(fake_vllm, monkeypatch):
    from g906.backends.vllm import build_vllm_command

    from .planfactory import make_plan

    fake_vllm.python_package({"__init__.py": REGISTRY, "granite_reasoning_parser.py": OLD_STYLE})
    fake_vllm.set(flavor="upstream")          # --help lists no choices for --reasoning-parser
    inst = detect_vllm(python=sys.executable)
    assert inst.choices("--reasoning-parser") is None
    assert inst.reasoning_parsers == ["deepseek_r1", "granite", "qwen3", "qwen3-alias", "qwen3_5"]
    cmd = build_vllm_command(make_plan(engine={"kind": "vllm", "reasoning_parser": "qwen3"}), inst, environ={})
    assert cmd.argv[cmd.argv.index("--reasoning-parser") + 1] == "qwen3_5"
