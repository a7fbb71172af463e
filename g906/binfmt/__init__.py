"""Binary formats g906 reads without external tools: ELF files and clang offload bundles.

    from g906.binfmt import read_elf, offload_targets, has_gfx_target, rccl_version
    has_gfx_target(offload_targets("torch/lib/librccl.so.1"), "gfx906")

elf.py reads headers, sections and the dynamic section; offload_bundle.py finds the GPU code
objects a library carries (its .hip_fatbin) and names their targets. Shared by `g906 doctor` and
`g906 rccl`; pure Python, torch-free.

gguf.py reads GGUF model files (metadata, tensor table, tensor bytes as views of one mapping) for
the recipe, the doctor and the engine's loader. It needs numpy and the gguf package's enums, so it
is imported as g906.binfmt.gguf and not re-exported here (the doctor and rccl stay light).
"""

from g906.binfmt.elf import (
    EM_AARCH64,
    EM_AMDGPU,
    EM_X86_64,
    ET_DYN,
    ET_EXEC,
    ET_REL,
    ElfError,
    ElfFile,
    build_elf,
    rccl_version,
    read_elf,
)
from g906.binfmt.offload_bundle import (
    BUNDLE_MAGIC,
    CCOB_MAGIC,
    OffloadBundle,
    OffloadEntry,
    gfx_targets,
    has_gfx_target,
    offload_targets,
    parse_offload_bundles,
    read_offload_bundles,
    target_features,
    target_processor,
    write_offload_bundle,
)

__all__ = [
    "BUNDLE_MAGIC", "CCOB_MAGIC", "EM_AARCH64", "EM_AMDGPU", "EM_X86_64", "ET_DYN", "ET_EXEC", "ET_REL",
    "ElfError", "ElfFile", "OffloadBundle", "OffloadEntry", "build_elf", "gfx_targets", "has_gfx_target",
    "offload_targets", "parse_offload_bundles", "rccl_version", "read_elf", "read_offload_bundles",
    "target_features", "target_processor", "write_offload_bundle",
]
