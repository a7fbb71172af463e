"""Session-wide test settings."""

import os

# Without a GPU, Triton kernels run only in Triton's interpreter. TRITON_INTERPRET is read when a
# kernel is decorated (when its module is first imported), so it must be set before any test in
# this process imports g906.kernels — not per test, or a kernel module imported earlier by another
# folder's test keeps compiled-mode helpers and the interpreter refuses to call them. On the CPU
# the registry never launches a kernel unless a test forces it, so nothing else changes.
if not (os.path.exists("/dev/nvidia0") or os.path.exists("/dev/kfd")):
    os.environ.setdefault("TRITON_INTERPRET", "1")
