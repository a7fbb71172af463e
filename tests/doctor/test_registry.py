"""The registry itself: unique ids, crash isolation, selection, robustness on partial facts,
Facts (de)serialisation errors, preflight."""

from __future__ import annotations

import json

import pytest

from g906.doctor import blocking, collect_facts, preflight, preflight_error, run_checks
from g906.doctor.checks import GROUPS, REGISTRY, all_checks, check, exit_code, select
from g906.doctor.facts import Facts, gfx_name, normalise_arch
from g906.errors import UsageError

from tests.doctor.plans import make_plan
from tests.doctor.sysroot import GiB, Machine, alice, amd_devices, build, torch_probe


def test_ids_groups_and_titles():
    specs = all_checks()
    ids = [s.id for s in specs]
    assert len(ids) == len(set(ids)) >= 25
    for s in specs:
        assert s.group in GROUPS and s.title and "." in s.id and s.id == s.id.lower()


def test_a_crashing_check_is_a_fail_row_and_the_others_run():
    @check("test.crash", "System", "A check that crashes")
    def _boom(ctx):
        raise ZeroDivisionError("division by zero")

    try:
        findings = run_checks(Facts())
        row = next(f for f in findings if f.id == "test.crash")
        assert row.status == "fail" and "ZeroDivisionError: division by zero" in row.summary
        assert "--collect" in row.fix
        assert len(findings) > 10
        assert exit_code(findings) == 1
    finally:
        del REGISTRY["test.crash"]


def test_select():
    assert [s.id for s in select(["gpu.arch"])] == ["gpu.arch"]
    assert {s.id for s in select(["access"])} == {"access.kfd", "access.render"}
    with pytest.raises(UsageError, match="no check named"):
        select(["gpu.archh"])


def scenario_facts(tmp_path) -> Facts:
    root = build(tmp_path / "root", Machine(gpus=[("gfx906", 32 * GiB)] * 2, rocm="6.3.0",
                                            rocblas_archs=["gfx906"], rccl_targets=["gfx906"]))
    return collect_facts(root, probe=torch_probe(devices=amd_devices(("gfx906", 32 * GiB))), env={},
                         identity=alice(), run_tools=False)


def test_no_check_crashes_on_partial_facts(tmp_path):
    """Facts from older versions or failed collectors: every section emptied in turn."""
    base = scenario_facts(tmp_path).to_json()
    plan = make_plan(tmp_path, tp=2)
    for key, value in base.items():
        if key in ("schema",):
            continue
        data = json.loads(json.dumps(base))
        data[key] = type(value)() if value is not None else None
        facts = Facts.from_json(data)
        for f in run_checks(facts, plan):
            assert "crashed" not in f.summary, (key, f.id, f.summary)
    for f in run_checks(Facts(), plan):
        assert "crashed" not in f.summary, (f.id, f.summary)


def test_facts_json_errors(tmp_path):
    with pytest.raises(UsageError, match="schema"):
        Facts.from_json({"schema": 2})
    with pytest.raises(UsageError, match="unknown facts field"):
        Facts.from_json({"schema": 1, "gpuz": []})
    with pytest.raises(UsageError, match="should be a list"):
        Facts.from_json({"schema": 1, "gpus": {}})
    with pytest.raises(UsageError, match="expected a JSON object"):
        Facts.from_json([1])
    facts = scenario_facts(tmp_path)
    p = tmp_path / "f.json"
    facts.save(p)
    assert Facts.load(p) == facts


def test_arch_names():
    assert gfx_name(90006) == "gfx906" and gfx_name(90010) == "gfx90a" and gfx_name(110000) == "gfx1100"
    assert gfx_name(90402) == "gfx942" and gfx_name(100300) == "gfx1030" and gfx_name(0) is None
    assert normalise_arch("gfx906:sramecc+:xnack-") == "gfx906"
    assert normalise_arch("gfx9006") == "gfx906"   # amdsmi's spelling
    assert normalise_arch("90006") == "gfx906"     # KFD's gfx_target_version
    assert normalise_arch("gfx1100") == "gfx1100"


def test_preflight_on_recorded_facts(tmp_path):
    facts = scenario_facts(tmp_path)
    ok_plan = make_plan(tmp_path, tp=2)
    findings = preflight(ok_plan, facts=facts)
    assert blocking(findings) == []
    assert {f.id for f in findings} >= {"recipe.memory", "rccl.gfx906", "rocblas.tensile", "engine.device"}
    assert not any(f.id.startswith("deep.") for f in findings)
    assert preflight_error(findings) is None
    too_many = make_plan(tmp_path / "b", tp=4)
    bad = preflight(too_many, facts=facts)
    assert [f.id for f in blocking(bad)] == ["recipe.tensor_parallel"]
    err = preflight_error(bad)
    assert "1 problem(s)" in err.message and "recipe.tensor_parallel" in err.details[0] and "fix:" in err.details[0]


def test_rccl_package_in_recipe_does_not_block_up(tmp_path):
    root = build(tmp_path / "root", Machine(gpus=[("gfx906", 32 * GiB)] * 2, rocm="7.2.0", rocblas_archs=["gfx906"],
                                            rccl_targets=["gfx942"]))
    facts = collect_facts(root, probe=torch_probe("2.11.0+rocm7.2", "7.2.1",
                                                  devices=amd_devices(("gfx906", 32 * GiB), ("gfx906", 32 * GiB))),
                          env={}, identity=alice(), run_tools=False)
    plan = make_plan(tmp_path, tp=2)
    assert [f.id for f in blocking(preflight(plan, facts=facts))] == ["rccl.gfx906"]
    plan.rccl_package = tmp_path / "rccl-gfx906.tar.gz"
    f = next(f for f in preflight(plan, facts=facts) if f.id == "rccl.gfx906")
    assert f.status == "warn" and "g906 up` installs parallel.rccl" in f.summary


def test_deep_results_become_checks(tmp_path):
    facts = scenario_facts(tmp_path)
    facts.torch["deep"] = {"matmul": [{"device": 0, "ok": True, "rel_err": 1e-4, "seconds": 0.1},
                                      {"device": 1, "ok": False, "error": "hipErrorNoBinaryForGpu", "seconds": 0.1}],
                           "allreduce": {"ok": False, "world_size": 2, "errors": ["rank 0: invalid device function"]}}
    rows = {f.id: f for f in run_checks(facts)}
    assert rows["deep.matmul"].status == "fail" and "hipErrorNoBinaryForGpu" in rows["deep.matmul"].summary
    assert rows["deep.allreduce"].status == "fail" and "invalid device function" in rows["deep.allreduce"].summary
    assert "deep.matmul" not in {f.id for f in run_checks(scenario_facts(tmp_path / "x"))}
