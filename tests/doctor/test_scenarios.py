"""The issue's scenarios, each a fixture sysroot + recorded torch/triton probe output: the exact
set of failing check ids, and the fix text, for every one. Each scenario also goes through
save -> load (what --collect / --from do) and must give the same verdicts."""

from __future__ import annotations

from pathlib import Path

from g906.doctor import collect_facts, run_checks
from g906.doctor.checks import Finding, exit_code
from g906.doctor.facts import Facts

from tests.doctor.plans import GB, QWEN35_27B, QWEN35_9B, make_plan
from tests.doctor.sysroot import GiB, Machine, alice, amd_devices, build, torch_probe


def evaluate(tmp_path: Path, machine: Machine, probe: dict, *, plan=None, env: dict | None = None,
             identity=None) -> tuple[Facts, list[Finding]]:
    root = build(tmp_path / "root", machine)
    facts = collect_facts(root, probe=probe, env=env or {}, identity=identity or alice(), run_tools=False)
    assert facts.errors == []
    findings = run_checks(facts, plan)
    for f in findings:  # every problem comes with a concrete fix
        if f.status in ("warn", "fail"):
            assert f.fix, f"{f.id} ({f.status}) has no fix: {f.summary}"
    # --collect then --from: the same verdicts
    saved = tmp_path / "facts.json"
    facts.save(saved)
    again = run_checks(Facts.load(saved), plan)
    assert [(f.id, f.status, f.summary) for f in again] == [(f.id, f.status, f.summary) for f in findings]
    return facts, findings


def ids(findings: list[Finding], status: str) -> set[str]:
    return {f.id for f in findings if f.status == status}


def by_id(findings: list[Finding], cid: str) -> Finding:
    return next(f for f in findings if f.id == cid)


def mi50_rocm63(**kw) -> Machine:
    base = dict(gpus=[("gfx906", 32 * GiB), ("gfx906", 32 * GiB)], rocm="6.3.0", rocblas_archs=["gfx906", "gfx90a"],
                rccl_targets=["gfx906", "gfx908", "gfx90a"], rccl_version="2.21.5")
    base.update(kw)
    return Machine(**base)


MI50_PROBE = torch_probe("2.9.1+rocm6.3", "6.3.42131-fa1d09cbd", devices=amd_devices(("gfx906", 32 * GiB), ("gfx906", 32 * GiB)))


def rocm72_probe(n: int = 1) -> dict:
    return torch_probe("2.11.0+rocm7.2", "7.2.26015-abc", devices=amd_devices(*[("gfx906", 32 * GiB)] * n),
                       triton={"found": True, "distribution": "triton", "version": "3.6.0+gfx906",
                               "backends": ["amd"], "mentions_gfx906": True})


# --- 1. healthy MI50 + ROCm 6.3 ---------------------------------------------------------------------


def test_healthy_mi50_rocm63(tmp_path):
    facts, findings = evaluate(tmp_path, mi50_rocm63(), MI50_PROBE)
    assert ids(findings, "fail") == set()
    assert ids(findings, "warn") == set()
    assert exit_code(findings, strict=True) == 0
    assert [g["gfx"] for g in facts.gpus] == ["gfx906", "gfx906"]
    assert facts.gpus[0]["vram_bytes"] == 32 * GiB and facts.gpus[0]["cu_count"] == 60
    assert by_id(findings, "compat.stack").summary == "matches the known-good stack rocm6.3-torch2.9"
    assert "rocblas/library" in by_id(findings, "rocblas.tensile").summary
    assert by_id(findings, "rccl.gfx906").status == "ok"
    assert facts.rccl["version"] == "2.21.5-release:abcdef0"
    assert facts.rccl["soname"] == "librccl.so.1"
    assert "the embedded engine will run on 2 x gfx906 via ROCm (float16)" == by_id(findings, "engine.device").summary


def test_healthy_mi50_with_tp2_recipe(tmp_path):
    plan = make_plan(tmp_path, tp=2, facts=QWEN35_27B, weights=17 * GB, max_model_len=32768, max_num_seqs=8)
    _, findings = evaluate(tmp_path, mi50_rocm63(), MI50_PROBE, plan=plan)
    assert ids(findings, "fail") == set(), [(f.id, f.summary) for f in findings if f.status == "fail"]
    mem = by_id(findings, "recipe.memory")
    assert mem.status == "ok" and "weights" in mem.detail and "KV cache" in mem.detail
    assert by_id(findings, "recipe.tensor_parallel").summary == "TP=2 on GPU(s) 0,1 of 2"


# --- 2. ROCm 7.2 + torch 2.11 without gfx906 Tensile files --------------------------------------------


def test_rocm72_torch211_missing_tensile(tmp_path):
    machine = Machine(gpus=[("gfx906", 32 * GiB)], rocm="7.2.0", rocblas_archs=["gfx90a", "gfx942", "gfx1100"],
                      rccl_targets=["gfx908", "gfx90a", "gfx942"], rccl_version="2.27.7")
    _, findings = evaluate(tmp_path, machine, rocm72_probe())
    assert ids(findings, "fail") == {"rocblas.tensile"}
    f = by_id(findings, "rocblas.tensile")
    assert "TensileLibrary_lazy_gfx906.dat" in f.fix
    assert "/usr/lib/python3/dist-packages/torch/lib/rocblas/library" in f.fix
    assert "ROCBLAS_TENSILE_LIBPATH" in f.fix
    assert "Cannot read TensileLibrary" in f.detail and "gfx90a" in f.detail
    # one GPU: an RCCL without gfx906 is only a note
    assert by_id(findings, "rccl.gfx906").status == "ok"
    assert by_id(findings, "compat.stack").status == "ok"
    assert exit_code(findings) == 1


def test_tensile_env_override_is_searched_exclusively(tmp_path):
    machine = Machine(gpus=[("gfx906", 32 * GiB)], rocm="7.2.0", rocblas_archs=["gfx906"], rccl_targets=["gfx906"])
    root = tmp_path / "root"
    _, findings = evaluate(tmp_path, machine, rocm72_probe(), env={"ROCBLAS_TENSILE_LIBPATH": "/opt/tensile"})
    f = by_id(findings, "rocblas.tensile")
    assert f.status == "fail" and "(ROCBLAS_TENSILE_LIBPATH)" in f.summary and "/opt/tensile" in f.fix
    # the same files in the override's gfx906/ subfolder count
    (root / "opt/tensile/gfx906").mkdir(parents=True)
    (root / "opt/tensile/gfx906/TensileLibrary_lazy_gfx906.dat").write_bytes(b"x")
    facts = collect_facts(root, probe=rocm72_probe(), env={"ROCBLAS_TENSILE_LIBPATH": "/opt/tensile"},
                          identity=alice(), run_tools=False)
    f = by_id(run_checks(facts), "rocblas.tensile")
    assert f.status == "ok" and f.summary.endswith("/opt/tensile/gfx906")


# --- 3. Tensile present, RCCL without gfx906, TP=2 recipe -----------------------------------------------


def test_rocm72_rccl_without_gfx906_and_tp2(tmp_path):
    machine = Machine(gpus=[("gfx906", 32 * GiB)] * 2, rocm="7.2.0", rocblas_archs=["gfx906", "gfx942"],
                      rccl_targets=["gfx908", "gfx90a", "gfx942", "gfx1100"], rccl_version="2.27.7")
    plan = make_plan(tmp_path, tp=2, facts=QWEN35_9B, weights=6 * GB)
    facts, findings = evaluate(tmp_path, machine, rocm72_probe(2), plan=plan)
    assert ids(findings, "fail") == {"rccl.gfx906"}
    f = by_id(findings, "rccl.gfx906")
    assert "tensor_parallel_size=2" in f.summary
    assert "g906 rccl install" in f.fix
    assert "invalid device function" in f.detail
    assert "gfx908, gfx90a, gfx942, gfx1100" in f.detail
    assert facts.rccl["has_gfx906"] is False
    # without a recipe, two visible gfx906 GPUs make it a warning, not a failure
    assert by_id(run_checks(facts), "rccl.gfx906").status == "warn"


# --- 4. no GPU ------------------------------------------------------------------------------------------


def test_no_gpu_cpu_torch(tmp_path):
    probe = torch_probe("2.13.0+cpu", None, triton={"found": True, "distribution": "triton", "version": "3.5.1",
                                                     "backends": ["amd", "nvidia"], "mentions_gfx906": False})
    plan = make_plan(tmp_path, facts=QWEN35_9B, weights=1 * GB, max_model_len=4096, max_num_seqs=2)
    _, findings = evaluate(tmp_path, Machine(), probe, plan=plan)
    assert ids(findings, "fail") == set()
    assert ids(findings, "warn") == set()
    eng = by_id(findings, "engine.device")
    assert eng.summary == "the embedded engine will run on the CPU (float32)"
    assert eng.data == {"engine_device": "cpu", "dtype": "float32"}
    assert by_id(findings, "gpu.detect").summary == "no GPU found: the embedded engine will run on the CPU"
    for cid in ("rocblas.tensile", "rccl.gfx906", "access.kfd", "gpu.arch", "torch.arch_list"):
        assert by_id(findings, cid).status == "skip"


def test_no_gpu_tp2_recipe_warns(tmp_path):
    # the embedded engine runs TP over gloo on the CPU (how TP is tested): a warning, not a failure
    probe = torch_probe("2.13.0+cpu", None)
    plan = make_plan(tmp_path, tp=2, weights=1 * GB)
    _, findings = evaluate(tmp_path, Machine(), probe, plan=plan)
    assert ids(findings, "fail") == set()
    assert "recipe.tensor_parallel" in ids(findings, "warn")
    assert "tensor_parallel_size = 1" in by_id(findings, "recipe.tensor_parallel").fix


# --- 5. NVIDIA --------------------------------------------------------------------------------------------


def test_nvidia_machine(tmp_path):
    probe = torch_probe("2.9.0+cu128", None, cuda="12.8",
                        devices=[{"index": 0, "name": "NVIDIA H200", "arch": None, "total_memory": 140 * GiB,
                                  "capability": [9, 0]}],
                        triton={"found": True, "distribution": "triton", "version": "3.5.0", "backends": ["amd", "nvidia"],
                                "mentions_gfx906": False})
    plan = make_plan(tmp_path, facts=QWEN35_27B, weights=17 * GB)
    facts, findings = evaluate(tmp_path, Machine(nvidia=["NVIDIA H200"]), probe, plan=plan)
    assert ids(findings, "fail") == set()
    assert ids(findings, "warn") == set()
    assert by_id(findings, "gpu.detect").summary == "NVIDIA: NVIDIA H200 (driver 570.86.15)"
    assert by_id(findings, "engine.device").summary == "the embedded engine will run on CUDA: NVIDIA H200 (bfloat16)"
    assert by_id(findings, "recipe.memory").status == "ok"
    assert facts.nvidia["driver_version"] == "570.86.15"


# --- 6. permission problem ----------------------------------------------------------------------------------


def test_permission_problem(tmp_path):
    machine = mi50_rocm63(dev_mode=0o660, user_in_render=False)
    probe = torch_probe("2.9.1+rocm6.3", "6.3.42131-fa1d09cbd", devices=[])  # what torch reports then
    _, findings = evaluate(tmp_path, machine, probe, identity=alice(root_gid_member=False))
    assert ids(findings, "fail") == {"access.kfd", "access.render", "torch.devices"}
    kfd = by_id(findings, "access.kfd")
    assert "usermod -aG" in kfd.fix and "render" in kfd.fix and "video" in kfd.fix
    assert "log out" in kfd.fix
    assert "/dev/kfd" in kfd.summary and "group render" in kfd.detail
    assert "torch sees no GPU although 2 AMD GPU(s) are visible" == by_id(findings, "torch.devices").summary


def test_group_added_but_session_not_refreshed(tmp_path):
    machine = mi50_rocm63(dev_mode=0o660, user_in_render=True)
    _, findings = evaluate(tmp_path, machine, MI50_PROBE, identity=alice(root_gid_member=False))
    f = by_id(findings, "access.kfd")
    assert f.status == "fail" and "not active yet" in f.summary and "newgrp render" in f.fix


def test_missing_dev_kfd(tmp_path):
    root = build(tmp_path / "root", mi50_rocm63())
    (root / "dev/kfd").unlink()
    facts = collect_facts(root, probe=MI50_PROBE, env={}, identity=alice(), run_tools=False)
    f = by_id(run_checks(facts), "access.kfd")
    assert f.status == "fail" and "--device=/dev/kfd" in f.fix


# --- 7. mixed gfx906 + gfx1100 -----------------------------------------------------------------------------


def test_mixed_gfx906_gfx1100(tmp_path):
    machine = Machine(gpus=[("gfx906", 32 * GiB), ("gfx1100", 24 * GiB)], rocm="6.3.0",
                      rocblas_archs=["gfx906", "gfx1100"], rccl_targets=["gfx906", "gfx1100"])
    probe = torch_probe(devices=amd_devices(("gfx906", 32 * GiB), ("gfx1100", 24 * GiB)))
    _, findings = evaluate(tmp_path, machine, probe)
    assert ids(findings, "fail") == set()
    assert ids(findings, "warn") == {"gpu.arch"}
    f = by_id(findings, "gpu.arch")
    assert f.fix.startswith("export HIP_VISIBLE_DEVICES=0")

    # a TP=2 recipe across both architectures fails
    plan = make_plan(tmp_path, tp=2, weights=2 * GB)
    _, findings = evaluate(tmp_path / "tp2", machine, probe, plan=plan)
    assert ids(findings, "fail") == {"gpu.arch", "recipe.tensor_parallel"}
    assert "HIP_VISIBLE_DEVICES=0" in by_id(findings, "gpu.arch").fix

    # with HIP_VISIBLE_DEVICES=0 the machine is fine for gfx906
    probe1 = torch_probe(devices=amd_devices(("gfx906", 32 * GiB)))
    _, findings = evaluate(tmp_path / "vis", machine, probe1, env={"HIP_VISIBLE_DEVICES": "0"})
    assert ids(findings, "fail") == set() and ids(findings, "warn") == set()
    assert by_id(findings, "gpu.arch").summary.startswith("mixed machine; only gfx906 visible")


# --- 8. a recipe that does not fit in VRAM --------------------------------------------------------------------


def test_recipe_does_not_fit(tmp_path):
    machine = mi50_rocm63(gpus=[("gfx906", 16 * GiB)])
    probe = torch_probe(devices=amd_devices(("gfx906", 16 * GiB)))
    plan = make_plan(tmp_path, facts=QWEN35_27B, weights=17 * GB, max_model_len=262144, max_num_seqs=16)
    _, findings = evaluate(tmp_path, machine, probe, plan=plan)
    assert ids(findings, "fail") == {"recipe.memory"}
    f = by_id(findings, "recipe.memory")
    assert f.summary.startswith("does not fit: needs about")
    assert "max_model_len" in f.fix and "smaller quantization" in f.fix
    est = f.data["estimate"]
    assert est["fits"] is False and est["per_device"][0]["capacity"] == 16 * GiB
    # and the table is there
    assert "weights" in f.detail and "budget" in f.detail and "14.4 GiB" in f.detail


# --- more traps ------------------------------------------------------------------------------------------------


def test_hsa_override_and_visibility_disagreement(tmp_path):
    env = {"HSA_OVERRIDE_GFX_VERSION": "10.3.0", "HIP_VISIBLE_DEVICES": "0,1", "CUDA_VISIBLE_DEVICES": "1"}
    _, findings = evaluate(tmp_path, mi50_rocm63(), MI50_PROBE, env=env)
    assert ids(findings, "fail") == {"gpu.hsa_override"}
    assert "unset HSA_OVERRIDE_GFX_VERSION" in by_id(findings, "gpu.hsa_override").fix
    vis = by_id(findings, "gpu.visibility")
    assert vis.status == "warn" and "disagree" in vis.summary


def test_visible_devices_out_of_range(tmp_path):
    _, findings = evaluate(tmp_path, mi50_rocm63(), MI50_PROBE, env={"HIP_VISIBLE_DEVICES": "0,3"})
    f = by_id(findings, "gpu.visibility")
    assert f.status == "fail" and "only 2 GPU(s)" in f.summary and f.fix == "export HIP_VISIBLE_DEVICES=0,1"


def test_busy_gpus_and_upstream_triton(tmp_path):
    machine = mi50_rocm63(kfd_processes=[(4711, "python3", 20 * GiB)])
    probe = torch_probe(devices=amd_devices(("gfx906", 32 * GiB), ("gfx906", 32 * GiB)),
                        triton={"found": True, "distribution": "pytorch-triton-rocm", "version": "3.5.0",
                                "backends": ["amd"], "mentions_gfx906": False})
    _, findings = evaluate(tmp_path, machine, probe)
    assert ids(findings, "fail") == set()
    assert ids(findings, "warn") == {"gpu.busy", "triton.gfx906"}
    assert "pid 4711 (python3)" in by_id(findings, "gpu.busy").detail
    assert "no gfx906 target" in by_id(findings, "triton.gfx906").summary


def test_broken_torch_import(tmp_path):
    probe = torch_probe(import_error="ImportError: libamdhip64.so.6: cannot open shared object file")
    _, findings = evaluate(tmp_path, mi50_rocm63(), probe)
    assert "torch.import" in ids(findings, "fail")
    f = by_id(findings, "torch.import")
    assert "libamdhip64.so.6" in f.summary and "rocm6.3" in f.fix


def test_torch_for_other_rocm_and_no_gfx906_kernels(tmp_path):
    probe = torch_probe("2.11.0+rocm7.2", "7.2.26015", devices=amd_devices(("gfx906", 32 * GiB), ("gfx906", 32 * GiB)),
                        arch_list=["gfx90a", "gfx942", "gfx1100"])
    _, findings = evaluate(tmp_path, mi50_rocm63(), probe)
    assert {"rocm.torch_match", "torch.arch_list"} <= ids(findings, "fail") | ids(findings, "warn")
    assert by_id(findings, "torch.arch_list").status == "fail"
    assert "rocm6.3" in by_id(findings, "rocm.torch_match").fix


def test_known_bad_combinations(tmp_path):
    machine = mi50_rocm63()
    hf = tmp_path / "models/hf"
    plan = make_plan(tmp_path, fmt="hf", quantization="gptq", architecture="Qwen3_5MoeForConditionalGeneration",
                     engine_kind="vllm", weights=10 * GB, tp=2)
    (hf / "config.json").write_text('{"quantization_config": {"bits": 4, "quant_method": "gptq"}}')
    _, findings = evaluate(tmp_path, machine, MI50_PROBE, plan=plan)
    f = by_id(findings, "recipe.known_bad")
    assert f.status == "fail" and f.summary.startswith("moe-gptq-int4:")
    assert "GGUF" in f.fix and "embedded" in f.fix
    # the embedded engine runs int4 MoE checkpoints with its own kernels: not known-bad there
    plan = make_plan(tmp_path / "emb", fmt="hf", quantization="gptq", architecture="Qwen3_5MoeForConditionalGeneration",
                     weights=10 * GB, tp=2)
    (tmp_path / "emb/models/hf/config.json").write_text('{"quantization_config": {"bits": 4, "quant_method": "gptq"}}')
    _, findings = evaluate(tmp_path / "emb", machine, MI50_PROBE, plan=plan)
    assert by_id(findings, "recipe.known_bad").status == "ok"

    plan = make_plan(tmp_path / "awq", fmt="hf", quantization="awq", architecture="Qwen3_5ForCausalLM",
                     weights=5 * GB, dtype="bfloat16", engine_kind="vllm")
    _, findings = evaluate(tmp_path / "awq", machine, MI50_PROBE, plan=plan)
    f = by_id(findings, "recipe.known_bad")
    assert f.status == "warn" and set(f.data["ids"]) == {"awq-gfx906", "bf16-gfx906"}
    # the embedded engine runs AWQ with its own kernels: only the bf16 advice remains
    plan = make_plan(tmp_path / "awq-e", fmt="hf", quantization="awq", architecture="Qwen3_5ForCausalLM",
                     weights=5 * GB, dtype="bfloat16")
    _, findings = evaluate(tmp_path / "awq-e", machine, MI50_PROBE, plan=plan)
    assert set(by_id(findings, "recipe.known_bad").data["ids"]) == {"bf16-gfx906"}


def test_recipe_file_checks(tmp_path):
    machine = mi50_rocm63()
    plan = make_plan(tmp_path, tensor_types={"Q4_K": 10, "TQ1_0": 3}, images=2, mmproj=None)
    plan.model_files.append(tmp_path / "models/missing-00002-of-00002.gguf")
    _, findings = evaluate(tmp_path, machine, MI50_PROBE, plan=plan)
    assert {"recipe.model_files", "recipe.gguf_types", "recipe.mmproj"} <= ids(findings, "fail")
    assert "missing-00002-of-00002.gguf" in by_id(findings, "recipe.model_files").detail
    assert "TQ1_0" in by_id(findings, "recipe.gguf_types").summary
    assert "mmproj" in by_id(findings, "recipe.mmproj").fix


def test_rccl_swap_interrupted(tmp_path, monkeypatch):
    """g906's own swap manifest, read through g906.rccl.state (when that module exists)."""
    import pytest

    state = pytest.importorskip("g906.rccl.state")
    monkeypatch.setenv("G906_STATE_DIR", str(tmp_path / "state"))
    root = build(tmp_path / "root", mi50_rocm63())
    lib_dir = root / "usr/lib/python3/dist-packages/torch/lib"
    area = state.area_for(lib_dir)
    area.mkdir(parents=True)
    m = state.Manifest(txn="t1", state=state.INSTALLING, step="staged", lib_dir=str(lib_dir), python=None,
                       torch_version="2.9.1", source="rccl.tar.gz", created=state.now_iso(), updated=state.now_iso(),
                       original=[], destinations=["librccl.so.1"], new={"sha256": "0" * 64, "size": 1})
    state.save_manifest(area, m, step="staged")
    facts = collect_facts(root, probe=MI50_PROBE, env={}, identity=alice(), run_tools=False)
    f = by_id(run_checks(facts), "rccl.swap")
    assert f.status == "fail" and "interrupted" in f.summary and "g906 rccl rollback" in f.fix


def test_radeon_vii_sramecc_off_vs_rccl_built_for_sramecc_on(tmp_path):
    """A Radeon VII runs gfx906:sramecc-; code objects for gfx906:sramecc+ (MI50) do not load there."""
    machine = mi50_rocm63(gpus=[("gfx906", 16 * GiB)] * 2)
    devs = [dict(d, name="AMD Radeon VII", arch="gfx906:sramecc-:xnack-") for d in
            amd_devices(("gfx906", 16 * GiB), ("gfx906", 16 * GiB))]
    plan = make_plan(tmp_path, tp=2, weights=4 * GB, max_model_len=8192)
    _, findings = evaluate(tmp_path, machine, torch_probe(devices=devs), plan=plan)
    assert ids(findings, "fail") == {"rccl.gfx906"}
    f = by_id(findings, "rccl.gfx906")
    assert "target features" in f.summary and "gfx906:sramecc-:xnack-" in f.summary
