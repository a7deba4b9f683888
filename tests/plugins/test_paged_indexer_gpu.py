"""The paged indexer + top-k kernels (float pools and FP8 keys, one- and multi-block top-k) against the
float64 references, on a GPU. Inputs and checks are the emulator cases' (tests/emulation/
cases_paged_indexer.py): shuffled pages, invalid table entries, NaN in pages no row names, ragged
query_start / lengths; selections compared up to ties at the k-th place, in the C ABI's order.
"""

from __future__ import annotations

import zlib

import pytest

torch = pytest.importorskip("torch")

from tests.emulation import cases as _emulation_cases  # noqa: F401  (defines Case before the family modules)
from tests.emulation.cases_paged_indexer import check_paged_selection, paged_inputs, quantize_q_e4m3

pytestmark = pytest.mark.gpu

PAGED_CASES = [
    # name, B, S, M, page, H, D, topk, causal, dtype, w_dtype, fp8
    ("bf16-prefill", 2, 9, 12, 64, 16, 64, 64, True, "bf16", "bf16", False),
    ("fp16-noncausal-wfp32", 2, 4, 10, 32, 32, 64, 48, False, "fp16", "fp32", False),
    ("fp32-generic", 1, 5, 6, 16, 4, 32, 16, True, "fp32", "fp32", False),
    ("fp8-bf16-decode-H64", 4, 1, 64, 64, 64, 128, 2048, True, "bf16", "fp32", True),
    ("fp8-fp16-prefill", 1, 16, 20, 64, 64, 128, 256, True, "fp16", "fp16", True),
    ("fp8-decode-T32K-multi-block", 1, 1, 512, 64, 64, 128, 2048, True, "bf16", "fp32", True),
    ("bf16-decode-T128K-multi-block", 1, 2, 2048, 64, 64, 128, 2048, True, "bf16", "fp32", False),
]


def _cuda(inputs):
    return tuple(None if t is None else t.cuda() for t in inputs)


def _run(kl, inputs, *, topk, scale, causal):
    q, k_pool, k_scale, w, table, start, lengths = _cuda(inputs)
    out = kl.indexer_topk_paged(q, k_pool, w, table, start, lengths, topk=topk, scale=scale, causal=causal,
                                k_scale_pool=k_scale)
    torch.cuda.synchronize()
    return out.cpu()


@pytest.mark.parametrize("case", PAGED_CASES, ids=[c[0] for c in PAGED_CASES])
def test_paged_indexer_matches_reference(cuda_kernels, case):
    name, B, S, M, page, H, D, topk, causal, dt, wdt, fp8 = case
    gen = torch.Generator().manual_seed(zlib.crc32(name.encode()))
    inputs = paged_inputs(B, S, M, page, H, D, dtype=dt, w_dtype=wdt, fp8=fp8, gen=gen)
    got = _run(cuda_kernels, inputs, topk=topk, scale=D ** -0.5, causal=causal)
    assert got.shape == (B, S, topk) and got.dtype == torch.int32
    check_paged_selection(got, *inputs, topk=topk, scale=D ** -0.5, causal=causal, order=True)


@pytest.mark.parametrize("fp8", [False, True], ids=["bf16", "fp8"])
def test_multi_block_top_k_equals_one_block(cuda_kernels, fp8):
    gen = torch.Generator().manual_seed(7)
    inputs = paged_inputs(1, 2, 256, 64, 64, 128, w_dtype="fp32", fp8=fp8, gen=gen)
    previous = cuda_kernels.indexer_topk_set_select_mode("one-block")
    try:
        want = _run(cuda_kernels, inputs, topk=2048, scale=128 ** -0.5, causal=True)
        for mode in ("multi-block", "multi-block-small-buffer", "auto"):
            cuda_kernels.indexer_topk_set_select_mode(mode)
            got = _run(cuda_kernels, inputs, topk=2048, scale=128 ** -0.5, causal=True)
            assert torch.equal(got, want), f"{mode} differs from the one-block top-k"
    finally:
        cuda_kernels.indexer_topk_set_select_mode(previous)


def test_fp8_mma_matches_the_quantized_q_reference(cuda_kernels):
    """The opt-in e4m3 MMA (sm_89+): the selection of the reference whose q is quantized the same way."""
    major, minor = torch.cuda.get_device_capability()
    if major * 10 + minor < 89:
        pytest.skip("the e4m3 MMA needs sm_89+")
    gen = torch.Generator().manual_seed(11)
    inputs = list(paged_inputs(2, 4, 64, 64, 64, 128, w_dtype="fp32", fp8=True, ragged=False, gen=gen))
    previous = cuda_kernels.indexer_topk_set_fp8_mma(True)
    try:
        got = _run(cuda_kernels, inputs, topk=2048, scale=128 ** -0.5, causal=True)
    finally:
        cuda_kernels.indexer_topk_set_fp8_mma(previous)
    inputs[0] = quantize_q_e4m3(inputs[0])
    check_paged_selection(got, *inputs, topk=2048, scale=128 ** -0.5, causal=True, order=True)
