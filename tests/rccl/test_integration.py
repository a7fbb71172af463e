"""ensure_rccl_for_plan: the RCCL step of `g906 up`, against real Plans and doctor Facts."""

from __future__ import annotations

import subprocess
import sys

import pytest

from g906.doctor.facts import Facts
from g906.recipe.resolve import resolve
from g906.recipe.schema import Recipe
from g906.rccl import ensure_rccl_for_plan, status
from g906.rccl.target import resolve_target

from .helpers import real_torch_env, sha

GFX906 = {"gfx": "gfx906", "node": 1, "name": "Radeon VII"}


def plan(tp: int, rccl=None):
    parallel = {"tensor_parallel_size": tp}
    if rccl:
        parallel["rccl"] = str(rccl)
    rec = Recipe.model_validate({"model": {"source": "builtin:tiny-qwen35"}, "parallel": parallel})
    return resolve(rec, None, check_files=False)


def facts(env=None, *, gpus=(GFX906, GFX906), rccl=None, lib_dir=None) -> Facts:
    torch = {"found": True, "lib_dir": lib_dir or (str(env.lib_dir) if env else "/nowhere/torch/lib")}
    return Facts(gpus=[dict(g) for g in gpus], torch=torch,
                 python={"executable": str(env.python) if env else "/nowhere/bin/python"},
                 rccl=rccl if rccl is not None else {})


def test_single_gpu_never_touches_rccl():
    d = ensure_rccl_for_plan(plan(1), None, assume_yes=True, dry_run=False, interactive=False)
    assert d.action == "not_needed" and not d.blocking


def test_not_a_gfx906_machine():
    f = facts(gpus=[{"gfx": "gfx90a"}, {"gfx": "gfx90a"}])
    d = ensure_rccl_for_plan(plan(2), f, assume_yes=True, dry_run=False, interactive=False)
    assert d.action == "not_needed" and "gfx90a" in d.reason


def test_already_fine_from_facts():
    f = facts(rccl={"has_gfx906": True, "gfx_targets": ["gfx906"]})
    d = ensure_rccl_for_plan(plan(2), f, assume_yes=False, dry_run=False, interactive=False)
    assert d.action == "ok"


def test_stop_with_exact_command_when_no_package_is_named():
    """A gfx906 fixture (facts only, the paths need not exist here) without gfx906 RCCL."""
    f = facts(rccl={"has_gfx906": False, "gfx_targets": ["gfx908", "gfx90a"]})
    d = ensure_rccl_for_plan(plan(2), f, assume_yes=True, dry_run=True, interactive=False)
    assert d.blocking and d.action == "stop"
    assert d.command == "g906 rccl install PATH/TO/rccl-gfx906.tar.gz --python /nowhere/bin/python"
    assert "[parallel] rccl" in d.hint
    assert "STOP" in d.plan_line() and d.command in d.plan_line()


def test_dry_run_shows_the_install_step(gfx906_lib):
    f = facts(rccl={"has_gfx906": False})
    d = ensure_rccl_for_plan(plan(2, gfx906_lib), f, assume_yes=False, dry_run=True, interactive=False)
    assert d.action == "install" and not d.blocking
    assert d.command == f"g906 rccl install {gfx906_lib} --python /nowhere/bin/python"
    assert "will install" in d.plan_line()


def test_dry_run_validates_the_package(make_lib):
    from g906.errors import G906Error

    bad = make_lib("other", archs=("gfx90a",))
    with pytest.raises(G906Error, match="no gfx906 device code"):
        ensure_rccl_for_plan(plan(2, bad), facts(rccl={"has_gfx906": False}), assume_yes=True, dry_run=True,
                             interactive=False)


def test_missing_package_stops(tmp_path):
    d = ensure_rccl_for_plan(plan(2, tmp_path / "gone.tar.gz"), facts(rccl={"has_gfx906": False}),
                             assume_yes=True, dry_run=False, interactive=False)
    assert d.blocking and "does not exist" in d.reason


def test_needs_confirmation_without_yes(fake_env, gfx906_lib):
    env = fake_env()
    before = env.files()
    d = ensure_rccl_for_plan(plan(2, gfx906_lib), facts(env), assume_yes=False, dry_run=False, interactive=False)
    assert d.blocking and "--yes" in d.hint
    asked = []
    d = ensure_rccl_for_plan(plan(2, gfx906_lib), facts(env), assume_yes=False, dry_run=False, interactive=True,
                             confirm=lambda q: asked.append(q) or False)
    assert d.blocking and asked and "rollback" in asked[0]
    assert env.files() == before                       # inspected the real file, changed nothing


def test_installs_through_the_transaction(tmp_path, gfx906_lib, stock_lib):
    env = real_torch_env(tmp_path / "real", stock_lib)
    d = ensure_rccl_for_plan(plan(2, gfx906_lib), facts(env), assume_yes=True, dry_run=False, interactive=False,
                             log=lambda s: None)
    assert d.action == "installed", d
    assert sha(env.lib_dir / "librccl.so.1") == sha(gfx906_lib)
    assert d.result["probe"]["status"] == "unavailable"      # CPU torch: no RCCL backend to probe here
    assert any("could not run" in w for w in d.warnings)     # ... which keeps the library, and says so
    assert status(resolve_target(str(env.python)))["g906_swap"]
    again = ensure_rccl_for_plan(plan(2, gfx906_lib), facts(env), assume_yes=True, dry_run=False, interactive=False)
    assert again.action == "ok"


def test_plain_dict_facts():
    d = ensure_rccl_for_plan(plan(2), {"gpu_archs": ["gfx906:sramecc+:xnack-"], "torch_lib_dir": "/x/torch/lib",
                                       "rccl": {"has_gfx906": False}},
                             assume_yes=False, dry_run=True, interactive=False)
    assert d.blocking and d.command.endswith("--lib-dir /x/torch/lib")


def test_without_facts_the_kfd_gpus_that_hip_sees_decide(monkeypatch):
    """facts=None: the GPUs come from the KFD topology (g906.kfd), filtered like HIP filters them."""
    import g906.rccl.integration as integration

    kfd = [{"index": 0, "gfx": "gfx90a"}, {"index": 1, "gfx": "gfx906"}]
    monkeypatch.setattr(integration, "topology_gpus", lambda: [dict(g) for g in kfd])
    monkeypatch.delenv("ROCR_VISIBLE_DEVICES", raising=False)
    monkeypatch.delenv("CUDA_VISIBLE_DEVICES", raising=False)
    monkeypatch.setenv("HIP_VISIBLE_DEVICES", "0")
    d = ensure_rccl_for_plan(plan(2), None, assume_yes=False, dry_run=True, interactive=False)
    assert d.action == "not_needed" and "gfx90a" in d.reason
    monkeypatch.setenv("HIP_VISIBLE_DEVICES", "1")     # the gfx906: this interpreter's torch/lib is read
    d = ensure_rccl_for_plan(plan(2), None, assume_yes=False, dry_run=True, interactive=False)
    assert d.action != "not_needed" and d.lib_dir and d.lib_dir.endswith("lib")


def test_rccl_never_imports_the_doctor():
    code = ("import sys, g906.rccl, g906.rccl.integration, g906.rccl.transaction; "
            "assert not [m for m in sys.modules if m.startswith('g906.doctor')], 'the doctor was imported'")
    p = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert p.returncode == 0, p.stderr
