"""Fixture sysroots for the doctor tests: real files under tmp_path laid out as a machine's
/sys, /dev, /opt/rocm, /etc and a torch install, plus recorded probe output for torch/triton
(what probe.py prints on such a machine; a gfx906 GPU cannot exist here)."""

from __future__ import annotations

import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from g906.binfmt import build_elf, write_offload_bundle

GiB = 1024 ** 3
ALICE_UID, ALICE_GID = 4242, 4243  # a user that owns none of the fixture files


def alice(root_gid_member: bool = True) -> tuple[int, list[int]]:
    """The identity whose device access is judged: alice, with the render group active or not."""
    return (ALICE_UID, [ALICE_GID, 44, os.getgid()] if root_gid_member else [ALICE_GID])
HOST = "host-x86_64-unknown-linux-gnu-"
TORCH_LIB = "/usr/lib/python3/dist-packages/torch/lib"
TORCH_PKG = "/usr/lib/python3/dist-packages/torch"

GFX = {  # processor -> (gfx_target_version, PCI device id, simd_per_cu, CUs)
    "gfx906": (90006, 0x66A1, 4, 60),
    "gfx1100": (110000, 0x744C, 2, 96),
    "gfx90a": (90010, 0x740C, 4, 110),
}


def gpu_target(gfx: str) -> str:
    return f"hipv4-amdgcn-amd-amdhsa--{gfx}" + (":sramecc+:xnack-" if gfx in ("gfx906", "gfx90a") else "")


@dataclass
class Machine:
    """What to lay out. Everything optional: the default is a bare Linux box."""

    gpus: list[tuple[str, int]] = field(default_factory=list)   # (processor, VRAM bytes)
    vram_used: list[int] | None = None
    rocm: str | None = None                                       # e.g. "6.3.0"
    amdgpu_version: str | None = "6.10.5"
    dev_mode: int = 0o666                                         # /dev/kfd and render nodes
    torch_lib: bool = True                                        # lay out torch/lib
    rocblas_archs: list[str] = field(default_factory=list)        # Tensile archs in torch/lib/rocblas/library
    tensile_as_code_objects: bool = True
    rccl_targets: list[str] | None = None                         # processors in librccl's bundle (None: no librccl)
    rccl_version: str = "2.21.5"
    rccl_compress: str | None = "zstd"
    nvidia: list[str] | None = None                               # NVIDIA GPU models
    kfd_processes: list[tuple[int, str, int]] = field(default_factory=list)  # (pid, comm, vram)
    mem_total: int = 64 * GiB
    user_in_render: bool = True                                   # alice listed in render/video


def write(path: Path, text: str | bytes) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    if isinstance(text, bytes):
        path.write_bytes(text)
    else:
        path.write_text(text)
    return path


def build(root: Path, m: Machine) -> Path:
    root.mkdir(parents=True, exist_ok=True)
    gid = os.getgid()  # the device nodes written below belong to this group: call it "render"
    members = "alice" if m.user_in_render else ""
    groups = [f"render:x:{gid}:{members}", f"video:x:44:{members}", f"alice:x:{ALICE_GID}:"]
    if gid != 0:
        groups.insert(0, "root:x:0:")
    write(root / "etc/group", "\n".join(groups) + "\n")
    write(root / "etc/passwd", f"root:x:0:0:root:/root:/bin/bash\nalice:x:{ALICE_UID}:{ALICE_GID}::/home/alice:/bin/bash\n")
    write(root / "proc/sys/kernel/osrelease", "6.8.0-45-generic\n")
    write(root / "proc/meminfo", f"MemTotal:       {m.mem_total // 1024} kB\nMemAvailable:   {m.mem_total // 2048} kB\n")
    if m.gpus:
        nodes = root / "sys/class/kfd/kfd/topology/nodes"
        write(nodes / "0/properties", "cpu_cores_count 32\nsimd_count 0\nmem_banks_count 1\ngfx_target_version 0\n")
        for i, (gfx, vram) in enumerate(m.gpus, start=1):
            gtv, dev_id, spc, cus = GFX[gfx]
            write(nodes / f"{i}/properties",
                  f"cpu_cores_count 0\nsimd_count {spc * cus}\nmem_banks_count 1\nsimd_per_cu {spc}\n"
                  f"gfx_target_version {gtv}\nvendor_id 4098\ndevice_id {dev_id}\nlocation_id {i * 256}\n"
                  f"drm_render_minor {127 + i}\nunique_id {0x1234 + i}\n")
            write(nodes / f"{i}/name", f"{gfx}\n")
            write(nodes / f"{i}/mem_banks/0/properties", f"heap_type 1\nsize_in_bytes {vram}\nflags 0\nwidth 4096\n")
            if m.vram_used is not None:
                write(nodes / f"{i}/mem_banks/0/used_memory", f"{m.vram_used[i - 1]}\n")
            dev = write(root / f"dev/dri/renderD{127 + i}", "")
            dev.chmod(m.dev_mode)
        (root / "sys/class/kfd/kfd/proc").mkdir(parents=True, exist_ok=True)
        for pid, comm, vram in m.kfd_processes:
            write(root / f"sys/class/kfd/kfd/proc/{pid}/vram_1", f"{vram}\n")
            write(root / f"proc/{pid}/comm", comm + "\n")
        write(root / "dev/kfd", "").chmod(m.dev_mode)
        write(root / "dev/dri/card0", "")
        if m.amdgpu_version is not None:
            write(root / "sys/module/amdgpu/version", m.amdgpu_version + "\n")
        else:
            (root / "sys/module/amdgpu").mkdir(parents=True, exist_ok=True)
    if m.rocm:
        write(root / f"opt/rocm-{m.rocm}/.info/version", f"{m.rocm}-123\n")
        (root / "opt/rocm").symlink_to(f"rocm-{m.rocm}")
        write(root / f"opt/rocm-{m.rocm}/lib/librocblas.so.4", build_elf({".rodata": b"rocblas\0"}, soname="librocblas.so.4"))
    if m.nvidia is not None:
        write(root / "proc/driver/nvidia/version",
              "NVRM version: NVIDIA UNIX x86_64 Kernel Module  570.86.15  Thu Jan 16 2025\n")
        for i, model in enumerate(m.nvidia):
            write(root / f"proc/driver/nvidia/gpus/0000:{i + 1:02x}:00.0/information", f"Model: \t\t {model}\nIRQ: 42\n")
            write(root / f"dev/nvidia{i}", "")
    if m.torch_lib:
        lib = root / TORCH_LIB.lstrip("/")
        lib.mkdir(parents=True, exist_ok=True)
        if m.gpus:
            write(lib / "librocblas.so", build_elf({".rodata": b"rocblas\0"}, soname="librocblas.so.4"))
            tdir = lib / "rocblas/library"
            tdir.mkdir(parents=True, exist_ok=True)
            for arch in m.rocblas_archs:
                write(tdir / f"TensileLibrary_lazy_{arch}.dat", b"\x00tensile")
                if m.tensile_as_code_objects:
                    write(tdir / f"Kernels.so-000-{arch}.hsaco", b"\x7fELF")
                    write(tdir / f"TensileLibrary_Type_HH_Contraction_l_Ailk_Bjlk_Cijk_Dijk_{arch}.co", b"\x7fELF")
        if m.rccl_targets is not None:
            entries = {HOST: b""}
            for gfx in m.rccl_targets:
                entries[gpu_target(gfx)] = b"\x7fELF" + gfx.encode() * 64
            fat = write_offload_bundle(entries, m.rccl_compress)
            rodata = f"\0RCCL version : {m.rccl_version}-release:abcdef0\0".encode()
            so = write(lib / "librccl.so.1", build_elf({".rodata": rodata, ".hip_fatbin": fat}, soname="librccl.so.1",
                                                      needed=["libamdhip64.so.6"]))
            (lib / "librccl.so").symlink_to(so.name)
    return root


def torch_probe(version: str = "2.9.1+rocm6.3", hip: str | None = "6.3.42131-fa1d09cbd", cuda: str | None = None,
                devices: list[dict[str, Any]] | None = None, arch_list: list[str] | None = None,
                import_error: str | None = None, triton: dict[str, Any] | None = None,
                found: bool = True) -> dict[str, Any]:
    """Recorded probe.py output for an interpreter with this torch."""
    backend = "rocm" if hip else ("cuda" if cuda else "cpu")
    t: dict[str, Any] = {"found": found}
    if found:
        t.update(path=TORCH_PKG, lib_dir=TORCH_LIB, distribution="torch", distribution_version=version,
                 version=version, hip=hip, cuda=cuda, backend=backend)
        if import_error:
            t.update(import_ok=False, error=import_error)
        else:
            devs = devices or []
            t.update(import_ok=True, import_s=0.9, devices=devs, device_count=len(devs),
                     arch_list=arch_list if arch_list is not None else
                     (["gfx900", "gfx906", "gfx908", "gfx90a", "gfx942", "gfx1030", "gfx1100"] if hip else
                      (["sm_80", "sm_90"] if cuda else [])))
    tr = triton if triton is not None else {"found": True, "path": "/usr/lib/python3/dist-packages/triton",
                                            "distribution": "triton", "version": "3.5.0+gfx906",
                                            "backends": ["amd", "nvidia"], "mentions_gfx906": True}
    return {"python": {"executable": "/usr/bin/python3", "version": "3.12.3", "prefix": "/usr"},
            "torch": t, "triton": tr, "seconds": 1.2}


def amd_devices(*gfx_vram: tuple[str, int]) -> list[dict[str, Any]]:
    names = {"gfx906": "AMD Instinct MI50/MI60", "gfx1100": "AMD Radeon RX 7900 XTX", "gfx90a": "AMD Instinct MI210"}
    feats = {"gfx906": ":sramecc+:xnack-", "gfx90a": ":sramecc+:xnack-", "gfx1100": ""}
    return [{"index": i, "name": names[g], "arch": g + feats[g], "total_memory": v, "capability": [9, 0]}
            for i, (g, v) in enumerate(gfx_vram)]
