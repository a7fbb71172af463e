"""Without vLLM, a dry run assumes the newest vLLM g906 knows (and says so); a real start does not."""

from __future__ import annotations

import json
import sys

import pytest

from g906.backends import vllm_detect
from g906.backends.errors import VllmNotFoundError, VllmProbeError, VllmUnsupportedError
from g906.backends.vllm import build_vllm_command, detect_vllm_for_plan, dry_run_json, format_dry_run, serve
from g906.backends.vllm_assumed import NEWEST_KNOWN_VERSION
from g906.backends.vllm_detect import CLI_MODULE

from .planfactory import make_plan
from .test_vllm_recipes import RECIPES, _golden, _plan

NOTE = f"assuming vLLM {NEWEST_KNOWN_VERSION} (the newest g906 knows); install it to check against the real one"


@pytest.fixture
def no_vllm(tmp_path, monkeypatch):
    vllm_detect.clear_memo()
    monkeypatch.setenv("PATH", str(tmp_path / "empty-bin"))
    monkeypatch.setenv("G906_CACHE_DIR", str(tmp_path / "cache"))
    yield tmp_path
    vllm_detect.clear_memo()


def test_missing_vllm_still_raises_unless_assumed(no_vllm):
    plan = make_plan()
    with pytest.raises(VllmNotFoundError, match="not found on PATH"):
        detect_vllm_for_plan(plan)
    inst = detect_vllm_for_plan(plan, assume_if_missing=True)
    assert inst.version == NEWEST_KNOWN_VERSION and inst.command == ["vllm"]
    assert inst.assumed.startswith("vLLM not found (the vLLM executable 'vllm' was not found on PATH): ")
    assert inst.assumed.endswith(NOTE)
    assert not (no_vllm / "cache").exists()          # a stand-in is never cached


def test_dry_run_text_and_json_say_what_was_assumed(no_vllm):
    plan = make_plan(model={"source": "Qwen/Qwen3.5-9B"}, server={"api_key_env": "G906_UNSET_KEY"},
                     engine={"kind": "vllm", "reasoning_parser": "qwen3", "vllm": {"skip_mm_profiling": True}})
    cmd = build_vllm_command(plan, detect_vllm_for_plan(plan, assume_if_missing=True), environ={},
                             allow_missing_secret=True)
    text = format_dry_run(cmd)
    lines = text.splitlines()
    assert lines[0].startswith(f"# vLLM {NEWEST_KNOWN_VERSION} (assumed); OpenAI API on http://127.0.0.1:8000/v1")
    assert lines[1].startswith("# vLLM not found") and lines[1].endswith(NOTE)
    assert "vllm serve Qwen/Qwen3.5-9B \\" in lines
    assert "  --reasoning-parser qwen3 \\" in lines and "  --skip-mm-profiling \\" in lines
    assert lines[-1] == '  --api-key "$G906_UNSET_KEY"'
    doc = json.loads(json.dumps(dry_run_json(cmd)))
    assert doc["vllm_version"] == NEWEST_KNOWN_VERSION and doc["vllm_assumed"].endswith(NOTE)
    assert doc["argv"][:3] == ["vllm", "serve", "Qwen/Qwen3.5-9B"]
    assert doc["argv"][doc["argv"].index("--api-key") + 1] == "$G906_UNSET_KEY"   # never a key's value
    assert doc["missing_secrets"] == ["G906_UNSET_KEY"] and doc["command"] == text


def test_recipe_paths_shape_the_assumed_command(no_vllm):
    plan = make_plan(engine={"kind": "vllm", "vllm": {"executable": "/opt/vllm/bin/vllm"}})
    inst = detect_vllm_for_plan(plan, assume_if_missing=True)
    assert inst.command == ["/opt/vllm/bin/vllm"] and "does not exist" in inst.assumed
    plan = make_plan(engine={"kind": "vllm", "vllm": {"python": "/opt/vllm/bin/python"}})
    inst = detect_vllm_for_plan(plan, assume_if_missing=True)
    assert inst.command == ["/opt/vllm/bin/python", "-m", CLI_MODULE] and inst.source == "python"


def test_a_broken_or_ambiguous_vllm_is_not_assumed_away(fake_vllm):
    fake_vllm.set(flavor="broken")
    with pytest.raises(VllmProbeError):
        detect_vllm_for_plan(make_plan(), assume_if_missing=True)
    plan = make_plan(engine={"kind": "vllm", "vllm": {"python": sys.executable, "executable": str(fake_vllm.exe)}})
    with pytest.raises(VllmNotFoundError, match="both set"):
        detect_vllm_for_plan(plan, assume_if_missing=True)


def test_an_installed_vllm_wins_over_the_assumption(fake_vllm):
    fake_vllm.set(version="0.10.2+gfx906")
    inst = detect_vllm_for_plan(make_plan(), assume_if_missing=True)
    assert inst.version == "0.10.2+gfx906" and inst.assumed is None


def test_serve_refuses_an_assumed_command(no_vllm):
    plan = make_plan()
    cmd = build_vllm_command(plan, detect_vllm_for_plan(plan, assume_if_missing=True), environ={})
    with pytest.raises(VllmNotFoundError, match="a dry run assumed"):
        serve(cmd, echo=None, check_port=False)


SERVED_RECIPES = [p for p in RECIPES if "argv" in _golden().get(p.name, {})]


@pytest.mark.parametrize("path", SERVED_RECIPES, ids=[p.name for p in SERVED_RECIPES])
def test_assumed_vllm_gives_the_recipes_the_fork_command(path, no_vllm, monkeypatch):
    """The stand-in knows every flag g906 sets: each recipe's command equals the golden one (made
    with the fake gfx906 fork), but for the reasoning parser's name, which only the fork adds."""
    monkeypatch.setenv("HOME", "/home/g906")
    golden = _golden()[path.name]
    plan = _plan(path)
    cmd = build_vllm_command(plan, detect_vllm_for_plan(plan, assume_if_missing=True),
                             environ={"HOME": "/home/g906"}, allow_missing_secret=True)
    want = ["qwen3" if tok == "qwen3_5" else tok for tok in golden["argv"]]
    assert cmd.argv[1:] == want and cmd.env == golden["env"]


def test_extra_args_without_vllm_pass_unchecked_but_managed_flags_are_refused(no_vllm):
    plan = make_plan(engine={"kind": "vllm", "vllm": {"extra_args": ["--kv-cache-dtype", "fp8", "-O3"]}})
    cmd = build_vllm_command(plan, detect_vllm_for_plan(plan, assume_if_missing=True), environ={})
    assert cmd.argv[-3:] == ["--kv-cache-dtype", "fp8", "-O3"]
    for extra in (["--port", "9"], ["-tp", "2"], ["--max_model_len=4096"]):
        plan = make_plan(engine={"kind": "vllm", "vllm": {"extra_args": extra}})
        with pytest.raises(VllmUnsupportedError) as ei:
            build_vllm_command(plan, detect_vllm_for_plan(plan, assume_if_missing=True), environ={})
        assert "is set by g906 from the recipe" in "\n".join(ei.value.details)


def test_multimodal_sizes_fit_the_assumed_vllm(no_vllm):
    plan = make_plan(multimodal={"image": {"count": 1, "width": 512, "height": 512}})
    inst = detect_vllm_for_plan(plan, assume_if_missing=True)
    assert inst.mm_limit_format == "json-options" and not inst.supports("--enable-reasoning")
    cmd = build_vllm_command(plan, inst, environ={})
    value = cmd.argv[cmd.argv.index("--limit-mm-per-prompt") + 1]
    assert json.loads(value) == {"image": {"count": 1, "width": 512, "height": 512}, "video": 0}


def test_speculative_config_is_handed_over(no_vllm):
    """[engine.speculative] reaches vLLM as --speculative-config JSON (a model-specific MTP name
    normalised to vLLM's "mtp")."""
    plan = make_plan(model={"source": "Qwen/Qwen3.5-9B"},
                     engine={"kind": "vllm", "speculative": {"method": "qwen3_next_mtp", "num_speculative_tokens": 2}})
    cmd = build_vllm_command(plan, detect_vllm_for_plan(plan, assume_if_missing=True), environ={})
    argv = dry_run_json(cmd)["argv"]
    assert json.loads(argv[argv.index("--speculative-config") + 1]) == {"method": "mtp", "num_speculative_tokens": 2}
    plan = make_plan(model={"source": "Qwen/Qwen3.5-9B"},
                     engine={"kind": "vllm", "speculative": {"method": "ngram", "num_speculative_tokens": 4,
                                                             "prompt_lookup_max": 3}})
    argv = dry_run_json(build_vllm_command(plan, detect_vllm_for_plan(plan, assume_if_missing=True), environ={}))["argv"]
    assert json.loads(argv[argv.index("--speculative-config") + 1]) == {
        "method": "ngram", "num_speculative_tokens": 4, "prompt_lookup_min": 3, "prompt_lookup_max": 3}
