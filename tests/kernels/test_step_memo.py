"""step_memo: per-step bookkeeping computed once for all layers, never reused for other data."""

import torch

from g906.kernels._triton_util import next_pow2, step_memo


def test_reused_for_the_same_tensors_only():
    calls = []

    def make(t):
        calls.append(1)
        return t * 2

    cu = torch.tensor([0, 3, 7])
    a = step_memo("t", (cu,), 7, lambda: make(cu))
    b = step_memo("t", (cu,), 7, lambda: make(cu))
    assert a is b and len(calls) == 1                       # same step: one computation
    step_memo("t", (cu,), 8, lambda: make(cu))               # other extra (token count)
    assert len(calls) == 2
    cu.add_(1)                                               # modified in place: recomputed
    c = step_memo("t", (cu,), 8, lambda: make(cu))
    assert len(calls) == 3 and c.tolist() == [2, 8, 16]
    other = torch.tensor([0, 3, 7])                          # equal values, another tensor
    step_memo("t", (other,), 8, lambda: make(other))
    assert len(calls) == 4


def test_inference_mode_tensors():
    """Tensors made under torch.inference_mode() have no version counter: identity decides."""
    with torch.inference_mode():
        cu = torch.tensor([0, 4])
        a = step_memo("inf", (cu,), None, lambda: cu + 1)
        assert step_memo("inf", (cu,), None, lambda: cu + 2) is a
        other = torch.tensor([0, 4])
        assert step_memo("inf", (other,), None, lambda: other + 2).tolist() == [2, 6]


def test_next_pow2():
    assert [next_pow2(n) for n in (0, 1, 2, 3, 16, 17, 1000)] == [1, 1, 2, 4, 16, 32, 1024]


def test_prefill_kernels_do_not_specialize_on_token_or_sequence_counts():
    """Triton compiles one variant per specialization (an int arg == 1, divisible by 16, or
    neither): a count that changes with the batch would recompile mid-serving (the GDN scan
    takes ~10-25 s to compile). The prefill kernels exclude those arguments."""
    from g906.kernels.conv1d import kernel as conv
    from g906.kernels.gdn import kernel as gdn
    from g906.kernels.linear import gguf_matmul, packed_gemm
    from g906.kernels.norm import kernel as norm

    def excluded(fn):
        names = getattr(fn, "kwargs", {}).get("do_not_specialize")        # interpreter
        if names is None:
            names = [fn.arg_names[i] if isinstance(i, int) else i for i in fn.do_not_specialize]
        return set(names)

    assert excluded(conv._conv_prefill_kernel) >= {"T"}
    assert excluded(gdn._gdn_chunk_kernel) >= {"B", "T"}
    assert excluded(gdn._gdn_scan_kernel) >= {"T"}
    assert excluded(norm._gated_rms_norm_kernel) >= {"N"}
    assert excluded(packed_gemm._pq_gemm_kernel) >= {"M"}
    assert excluded(gguf_matmul._qgemm_kernel) >= {"M"}
