"""The vLLM hand-off reads `vllm serve`'s flags from vLLM's own argument parser (in vLLM's own
Python), and falls back to its help text when that parser cannot be reached."""

from __future__ import annotations

import sys

import pytest

from g906.backends import vllm_detect
from g906.backends.vllm_argparse import parse_argparse_dump
from g906.backends.vllm_detect import detect_vllm


def _flag_table(inst) -> dict[str, tuple]:
    """What the hand-off uses of each flag (argparse's own -h/--help aside)."""
    return {n: (tuple(f.names), bool(f.metavar), tuple(f.choices or ())) for n, f in inst.flags.items()
            if n not in ("-h", "--help")}


@pytest.mark.parametrize("flavor", ["fork", "upstream"])
def test_flags_come_from_the_parser_and_agree_with_the_help_text(fake_vllm, monkeypatch, flavor):
    fake_vllm.set(flavor=flavor)
    from_help = detect_vllm(executable=str(fake_vllm.exe))     # its #! Python has no vllm: help text
    assert from_help.help_mode == "all"
    vllm_detect.clear_memo()
    fake_vllm.python_package(argparse=True)
    monkeypatch.setenv("PATH", "/usr/bin:/bin")
    calls_before = len(fake_vllm.call_log())
    inst = detect_vllm(python=sys.executable, refresh=True)
    assert inst.help_mode == "argparse"
    assert not [c for c in fake_vllm.call_log()[calls_before:] if c.startswith("help")]   # no --help run
    assert _flag_table(inst) == _flag_table(from_help)
    assert inst.supports("--max_model_len") and inst.flag("-tp").name == "--tensor-parallel-size"
    assert not inst.flag("--enforce-eager").takes_value and inst.flag("--port").takes_value
    assert inst.choices("--uvicorn-log-level") == ["debug", "info", "warning", "error", "critical", "trace"]
    assert "Fraction of GPU memory" in inst.flag("--gpu-memory-utilization").help


def test_a_broken_parser_falls_back_to_the_help_text(fake_vllm, monkeypatch):
    site = fake_vllm.python_package(argparse=True)
    (site / "vllm" / "entrypoints" / "openai" / "cli_args.py").write_text("raise ImportError('no torch here')\n")
    monkeypatch.setenv("PATH", "/usr/bin:/bin")
    inst = detect_vllm(python=sys.executable)
    assert inst.help_mode == "all" and inst.supports("--reasoning-parser")
    assert "help=all" in fake_vllm.call_log()


def test_an_executable_whose_python_has_vllm_uses_the_parser(fake_vllm, monkeypatch):
    fake_vllm.python_package(argparse=True)          # the #! interpreter (this Python) now imports vllm
    inst = detect_vllm(executable=str(fake_vllm.exe))
    assert inst.help_mode == "argparse" and inst.command == [str(fake_vllm.exe)]
    assert inst.supports("--skip-mm-profiling")
    cached = vllm_detect.VllmInstall.from_json(inst.to_json())    # the disk cache keeps the mode
    assert cached.help_mode == "argparse" and _flag_table(cached) == _flag_table(inst)


def test_parse_argparse_dump():
    flags = parse_argparse_dump([
        {"names": ["--max_model_len"], "metavar": "MAX_MODEL_LEN", "choices": None, "help": "Context."},
        {"names": ["--enforce-eager", "--no-enforce-eager"], "metavar": "", "choices": None, "help": ""},
        {"names": ["--dtype"], "metavar": "{auto,half}", "choices": ["auto", "half"], "help": "x"},
        {"names": [], "metavar": "", "choices": None, "help": "a positional: skipped"},
    ])
    assert set(flags) == {"--max-model-len", "--enforce-eager", "--no-enforce-eager", "--dtype"}
    assert flags["--no-enforce-eager"] is flags["--enforce-eager"] and not flags["--enforce-eager"].takes_value
    assert flags["--dtype"].choices == ["auto", "half"]
