"""ctypes binding of ``libdsa_kernels.so`` for torch CUDA tensors (tests, benchmarks, a torch GPU path).

Independent of TensorRT: it passes ``tensor.data_ptr()`` and the current torch CUDA stream to the C
ABI in ``plugins/api/dsa_kernels.h``. torch is imported only when a function is called.
"""

from __future__ import annotations

import ctypes
import os
from pathlib import Path
from typing import TYPE_CHECKING, Any

from dsa_export.errors import DSAUserError
from dsa_export.plugins.library import require_library

if TYPE_CHECKING:  # pragma: no cover
    import torch

ABI_VERSION = 6  # 3: dsa_sparse_attention takes a NULL v as values from keys; 4: dsa_block_sparse_attention;
#                  5: the serving kernels (paged caches, FP8 caches, split-KV decode, sampling);
#                  6: dsa_paged_cache_write

#: Kernel families of ``dsa_moe_experts`` (``dsa_moe_experts_path``'s codes).
MOE_PATHS = {0: "generic", 1: "tensor-core-16", 2: "tensor-core-64", 3: "tensor-core-128"}

_c_i64 = ctypes.c_int64
_c_i32 = ctypes.c_int32
_c_ptr = ctypes.c_void_p
_c_size = ctypes.c_size_t


class KernelError(RuntimeError):
    """A kernel launch failed; the message is the library's ``dsa_last_error()``."""


class KernelLibrary:
    """The C ABI of ``libdsa_kernels.so``, loaded once per path."""

    def __init__(self, path: str | os.PathLike[str] | None = None):
        self.path = Path(path) if path is not None else require_library("kernels")
        try:
            self._lib = ctypes.CDLL(str(self.path))
        except OSError as exc:
            raise DSAUserError(f"Could not load {self.path}: {exc}.") from exc
        lib = self._lib
        lib.dsa_kernels_abi_version.restype = _c_i32
        lib.dsa_status_string.restype = ctypes.c_char_p
        lib.dsa_status_string.argtypes = [_c_i32]
        lib.dsa_last_error.restype = ctypes.c_char_p
        lib.dsa_indexer_topk_workspace_size.restype = _c_size
        lib.dsa_indexer_topk_workspace_size.argtypes = [_c_i64] * 6
        lib.dsa_indexer_topk_min_workspace_size.restype = _c_size
        lib.dsa_indexer_topk_min_workspace_size.argtypes = [_c_i64]
        lib.dsa_indexer_topk.restype = _c_i32
        lib.dsa_indexer_topk.argtypes = [_c_ptr] * 5 + [_c_i64] * 6 + [ctypes.c_float, _c_i32, _c_i32, _c_i32,
                                                                        _c_ptr, _c_size, _c_ptr]
        lib.dsa_sparse_attention.restype = _c_i32
        lib.dsa_sparse_attention.argtypes = [_c_ptr] * 5 + [_c_i64] * 8 + [ctypes.c_float, _c_i32, _c_ptr]
        lib.dsa_sparse_attention_path.restype = _c_i32
        lib.dsa_sparse_attention_path.argtypes = [_c_i64] * 4 + [_c_i32]
        lib.dsa_indexer_topk_path.restype = _c_i32
        lib.dsa_indexer_topk_path.argtypes = [_c_i64, _c_i64, _c_i32]
        version = lib.dsa_kernels_abi_version()
        if version != ABI_VERSION:
            raise DSAUserError(
                f"{self.path} has C ABI version {version}, this dsa-export expects {ABI_VERSION}; rebuild it with "
                "`dsa-export plugins build`."
            )
        lib.dsa_moe_experts_workspace_size.restype = _c_size
        lib.dsa_moe_experts_workspace_size.argtypes = [_c_i64] * 5 + [_c_i32]
        lib.dsa_moe_experts_min_workspace_size.restype = _c_size
        lib.dsa_moe_experts_min_workspace_size.argtypes = [_c_i64] * 4 + [_c_i32]
        lib.dsa_moe_experts.restype = _c_i32
        lib.dsa_moe_experts.argtypes = [_c_ptr] * 8 + [_c_i64] * 5 + [_c_i32] * 3 + [_c_i64, _c_i32, _c_i32,
                                                                                   _c_ptr, _c_size, _c_ptr]
        lib.dsa_moe_experts_path.restype = _c_i32
        lib.dsa_moe_experts_path.argtypes = [_c_i64] * 5 + [_c_i32, _c_i32, _c_i64]
        lib.dsa_sample_tokens.restype = _c_i32
        lib.dsa_sample_tokens.argtypes = [_c_ptr, _c_i64, _c_ptr, _c_ptr, _c_ptr, _c_ptr, _c_ptr, _c_i64, _c_i64,
                                          _c_i32, _c_ptr]
        lib.dsa_block_sparse_attention.restype = _c_i32
        lib.dsa_block_sparse_attention.argtypes = [_c_ptr] * 5 + [_c_i64] * 9 + [ctypes.c_float, _c_i32, _c_i32,
                                                                                 _c_ptr]
        lib.dsa_block_sparse_attention_path.restype = _c_i32
        lib.dsa_block_sparse_attention_path.argtypes = [_c_i64] * 3 + [_c_i32]
        # ABI 5: paged sparse attention (float pools, FP8 latent), split-KV decode
        lib.dsa_sparse_attention_paged_num_splits.restype = _c_i32
        lib.dsa_sparse_attention_paged_num_splits.argtypes = [_c_i64] * 5 + [_c_i32]
        lib.dsa_sparse_attention_paged_workspace_size.restype = _c_size
        lib.dsa_sparse_attention_paged_workspace_size.argtypes = [_c_i64] * 6 + [_c_i32]
        lib.dsa_sparse_attention_paged.restype = _c_i32
        lib.dsa_sparse_attention_paged.argtypes = [_c_ptr] * 6 + [_c_i64] * 10 + [ctypes.c_float, _c_i32, _c_i32,
                                                                                  _c_ptr, _c_size, _c_ptr]
        lib.dsa_sparse_attention_paged_fp8.restype = _c_i32
        lib.dsa_sparse_attention_paged_fp8.argtypes = [_c_ptr] * 7 + [_c_i64] * 11 + [ctypes.c_float, _c_i32, _c_i32,
                                                                                      _c_i32, _c_ptr, _c_size, _c_ptr]
        # ABI 5: paged indexer + top-k (float pools, FP8 keys)
        lib.dsa_indexer_topk_paged_workspace_size.restype = _c_size
        lib.dsa_indexer_topk_paged_workspace_size.argtypes = [_c_i64] * 7
        lib.dsa_indexer_topk_paged_min_workspace_size.restype = _c_size
        lib.dsa_indexer_topk_paged_min_workspace_size.argtypes = [_c_i64] * 2
        lib.dsa_indexer_topk_paged.restype = _c_i32
        lib.dsa_indexer_topk_paged.argtypes = [_c_ptr] * 7 + [_c_i64] * 8 + [ctypes.c_float, _c_i32, _c_i32, _c_i32,
                                                                             _c_ptr, _c_size, _c_ptr]
        lib.dsa_indexer_topk_paged_fp8.restype = _c_i32
        lib.dsa_indexer_topk_paged_fp8.argtypes = [_c_ptr] * 8 + [_c_i64] * 8 + [ctypes.c_float, _c_i32, _c_i32,
                                                                                 _c_i32, _c_ptr, _c_size, _c_ptr]
        lib.dsa_indexer_topk_set_select_mode.restype = _c_i32
        lib.dsa_indexer_topk_set_select_mode.argtypes = [_c_i32]
        lib.dsa_indexer_topk_set_fp8_mma.restype = _c_i32
        lib.dsa_indexer_topk_set_fp8_mma.argtypes = [_c_i32]
        lib.dsa_paged_cache_write.restype = _c_i32  # ABI 6
        lib.dsa_paged_cache_write.argtypes = [_c_ptr] * 3 + [_c_i64] * 5 + [_c_i32, _c_ptr]

    # -- helpers -------------------------------------------------------------------------------
    @staticmethod
    def dtype_code(dtype: Any) -> int:
        import torch

        codes = {torch.float32: 0, torch.float16: 1, torch.bfloat16: 2}
        if dtype not in codes:
            raise ValueError(f"unsupported dtype {dtype}; expected float32, float16 or bfloat16")
        return codes[dtype]

    @staticmethod
    def expert_dtype_code(dtype: Any) -> int:
        """Code of an expert-weight dtype: an activation dtype or ``torch.float8_e4m3fn`` (3)."""
        import torch

        if dtype == torch.float8_e4m3fn:
            return 3
        return KernelLibrary.dtype_code(dtype)

    def _check(self, status: int, what: str) -> None:
        if status != 0:
            message = (self._lib.dsa_last_error() or b"").decode(errors="replace")
            name = self._lib.dsa_status_string(status).decode()
            raise KernelError(f"{what} failed ({name}): {message}")

    @staticmethod
    def _stream(device: Any) -> int:
        import torch

        return torch.cuda.current_stream(device).cuda_stream

    # Where tensors live: the GPU library takes torch CUDA tensors as they are; a library running the
    # kernels elsewhere (the CPU emulation harness of tests/emulation) overrides these two.
    def _staged(self, t: torch.Tensor) -> torch.Tensor:
        """``t`` as a dense tensor the library can read."""
        return t.contiguous()

    def _empty(self, shape: tuple[int, ...], dtype: Any, like: torch.Tensor) -> torch.Tensor:
        """An uninitialized tensor on ``like``'s device for the library to write."""
        import torch

        return torch.empty(shape, dtype=dtype, device=like.device)

    # -- ops -----------------------------------------------------------------------------------
    def indexer_topk_workspace_size(self, B: int, S: int, T: int, H: int, D: int, topk: int) -> int:
        return int(self._lib.dsa_indexer_topk_workspace_size(B, S, T, H, D, topk))

    def indexer_topk(
        self,
        q: torch.Tensor,
        k: torch.Tensor,
        w: torch.Tensor,
        lengths: torch.Tensor | None = None,
        *,
        topk: int,
        scale: float,
        causal: bool = True,
        workspace: torch.Tensor | None = None,
    ) -> torch.Tensor:
        """Indices [B,S,topk] int32 of the DSAIndexerTopK op (order within a row unspecified)."""
        import torch

        B, S, H, D = q.shape
        T = k.shape[1]
        if k.shape != (B, T, D) or w.shape != (B, S, H):
            raise ValueError(f"shape mismatch: q {tuple(q.shape)}, k {tuple(k.shape)}, w {tuple(w.shape)}")
        if k.dtype != q.dtype or w.dtype not in (q.dtype, torch.float32):
            raise ValueError("k must have q's dtype and w q's dtype or float32")
        q, k, w = self._staged(q), self._staged(k), self._staged(w)
        if lengths is not None:
            lengths = self._staged(lengths.to(device=q.device, dtype=torch.int32))
        out = self._empty((B, S, topk), torch.int32, q)
        if workspace is None:
            ws_bytes = self.indexer_topk_workspace_size(B, S, T, H, D, topk)
            workspace = self._empty((max(ws_bytes, 1),), torch.uint8, q)
        ws_bytes = workspace.numel() * workspace.element_size()
        status = self._lib.dsa_indexer_topk(
            q.data_ptr(), k.data_ptr(), w.data_ptr(), lengths.data_ptr() if lengths is not None else None,
            out.data_ptr(), B, S, T, H, D, topk, float(scale), int(bool(causal)), self.dtype_code(q.dtype),
            self.dtype_code(w.dtype), workspace.data_ptr(), ws_bytes, self._stream(q.device),
        )
        self._check(status, "dsa_indexer_topk")
        return out

    def sparse_attention(
        self,
        q: torch.Tensor,
        k: torch.Tensor,
        v: torch.Tensor | None,
        indices: torch.Tensor,
        *,
        scale: float,
        v_head_dim: int | None = None,
    ) -> torch.Tensor:
        """Output [B,S,H,Dv] in q's dtype of the DSASparseAttention op.

        Values from keys, as in ``dsa_export.ops.dsa_sparse_attention``: the contract's empty v
        ``[B,0,Hkv,Dv]``, or ``v=None`` with ``v_head_dim=Dv``, takes the values from the first Dv
        channels of k's rows (Dv <= Dk); the kernel then reads each selected row once. A v with
        0 < Tv < T rows (the function body's mixed form) has no kernel and is refused.
        """
        import torch

        B, S, H, Dk = q.shape
        T, Hkv = k.shape[1], k.shape[2]
        K = indices.shape[2]
        if v is None:
            if v_head_dim is None or not 0 < int(v_head_dim) <= Dk:
                raise ValueError(f"values from keys (v=None) need 0 < v_head_dim <= Dk = {Dk}, got {v_head_dim}")
            Dv = int(v_head_dim)
            v_shape = (B, 0, Hkv, Dv)
        else:
            Dv = v.shape[3]
            v_shape = tuple(v.shape)
            if v_head_dim is not None and int(v_head_dim) != Dv:
                raise ValueError(f"v_head_dim {v_head_dim} != v's head dim {Dv}")
            if v.dtype != q.dtype:
                raise ValueError("q, k and v must share a dtype")
        from_keys = v_shape[1] == 0 and T > 0
        if k.shape != (B, T, Hkv, Dk) or v_shape not in ((B, T, Hkv, Dv), (B, 0, Hkv, Dv)) \
                or indices.shape[:2] != (B, S):
            raise ValueError(
                f"shape mismatch: q {tuple(q.shape)}, k {tuple(k.shape)}, v {v_shape} (T or 0 rows), "
                f"indices {tuple(indices.shape)}"
            )
        if from_keys and Dv > Dk:
            raise ValueError(f"values from keys (an empty v) need Dv <= Dk, got Dv {Dv} and Dk {Dk}")
        if k.dtype != q.dtype:
            raise ValueError("q, k and v must share a dtype")
        q, k = self._staged(q), self._staged(k)
        # An empty tensor's data_ptr() may be 0 or k's address: the kernel is told by a NULL v.
        v_rows = None if v is None or v_shape[1] == 0 else self._staged(v)
        indices = self._staged(indices.to(dtype=torch.int32))
        out = self._empty((B, S, H, Dv), q.dtype, q)
        status = self._lib.dsa_sparse_attention(
            q.data_ptr(), k.data_ptr(), v_rows.data_ptr() if v_rows is not None else None, indices.data_ptr(),
            out.data_ptr(), B, S, T, H, Hkv, Dk, Dv, K, float(scale), self.dtype_code(q.dtype),
            self._stream(q.device),
        )
        self._check(status, "dsa_sparse_attention")
        return out

    def sparse_attention_path(self, H: int, Hkv: int, Dk: int, Dv: int, dtype: Any) -> str:
        code = self._lib.dsa_sparse_attention_path(H, Hkv, Dk, Dv, self.dtype_code(dtype))
        return {1: "tensor-core", 0: "generic"}.get(code, "invalid")

    def block_sparse_attention(
        self,
        q: torch.Tensor,
        k: torch.Tensor,
        v: torch.Tensor,
        block_index: torch.Tensor,
        *,
        block_size: int,
        scale: float,
        causal: bool = True,
    ) -> torch.Tensor:
        """Output [B,S,H,Dv] in q's dtype of the DSABlockSparseAttention op (arguments as in
        ``dsa_export.ops.dsa_block_sparse_attention``)."""
        import torch

        B, S, H, Dk = q.shape
        T, Hkv, Dv = k.shape[1], k.shape[2], v.shape[3]
        bs = int(block_size)
        n_qb = -(-S // bs) if bs > 0 else -1
        if bs < 1 or k.shape != (B, T, Hkv, Dk) or v.shape != (B, T, Hkv, Dv) or block_index.dim() != 4 \
                or block_index.shape[:3] != (B, H, n_qb):
            raise ValueError(
                f"shape mismatch: q {tuple(q.shape)}, k {tuple(k.shape)}, v {tuple(v.shape)}, block_index "
                f"{tuple(block_index.shape)} (expected [B,H,ceil(S/{bs}),Kb]), block_size {bs}"
            )
        if k.dtype != q.dtype or v.dtype != q.dtype:
            raise ValueError("q, k and v must share a dtype")
        q, k, v = self._staged(q), self._staged(k), self._staged(v)
        block_index = self._staged(block_index.to(device=q.device, dtype=torch.int32))
        out = self._empty((B, S, H, Dv), q.dtype, q)
        status = self._lib.dsa_block_sparse_attention(
            q.data_ptr(), k.data_ptr(), v.data_ptr(), block_index.data_ptr(), out.data_ptr(), B, S, T, H, Hkv, Dk,
            Dv, block_index.shape[3], bs, float(scale), int(bool(causal)), self.dtype_code(q.dtype),
            self._stream(q.device),
        )
        self._check(status, "dsa_block_sparse_attention")
        return out

    def block_sparse_attention_path(self, Dk: int, Dv: int, block_size: int, dtype: Any) -> str:
        code = self._lib.dsa_block_sparse_attention_path(Dk, Dv, block_size, self.dtype_code(dtype))
        return {1: "tensor-core", 0: "generic"}.get(code, "invalid")

    # -- paged sparse attention (float pools, FP8 latent), split-KV decode (ABI 5) -------------------
    def sparse_attention_paged_num_splits(self, B: int, S: int, H: int, Hkv: int, K: int, num_splits: int = 0) -> int:
        """Splits a paged attention call makes on the current device (1: not split; ``num_splits`` as in the call)."""
        return int(self._lib.dsa_sparse_attention_paged_num_splits(B, S, H, Hkv, K, int(num_splits)))

    def sparse_attention_paged_workspace_size(self, B: int, S: int, H: int, Hkv: int, Dv: int, K: int,
                                              num_splits: int = 0) -> int:
        return int(self._lib.dsa_sparse_attention_paged_workspace_size(B, S, H, Hkv, Dv, K, int(num_splits)))

    def _paged_workspace(self, workspace, like, B, S, H, Hkv, Dv, K, num_splits):
        import torch

        if workspace is None:
            ws_bytes = self.sparse_attention_paged_workspace_size(B, S, H, Hkv, Dv, K, num_splits)
            workspace = self._empty((max(ws_bytes, 16),), torch.uint8, like)
        return workspace, workspace.numel() * workspace.element_size()

    def sparse_attention_paged(
        self,
        q: torch.Tensor,
        k_pool: torch.Tensor,
        v_pool: torch.Tensor | None,
        indices: torch.Tensor,
        block_table: torch.Tensor,
        *,
        scale: float,
        v_head_dim: int | None = None,
        num_splits: int = 0,
        workspace: torch.Tensor | None = None,
    ) -> torch.Tensor:
        """Output [B,S,H,Dv] in q's dtype of DSASparseAttentionPaged (arguments as in
        ``dsa_export.ops.dsa_sparse_attention_paged``: a ``v_pool`` without pages, or ``None`` with
        ``v_head_dim``, takes the values from the keys). ``num_splits``: 0 lets the library choose the
        split-KV schedule, > 0 forces it (tests)."""
        import torch

        B, S, H, Dk = q.shape
        P, page, Hkv = k_pool.shape[0], k_pool.shape[1], k_pool.shape[2]
        M, K = block_table.shape[1], indices.shape[2]
        if v_pool is None or v_pool.shape[0] == 0:
            Dv = int(v_head_dim if v_pool is None else v_pool.shape[3])
            if not 0 < Dv <= Dk:
                raise ValueError(f"values from keys need 0 < Dv <= Dk = {Dk}, got {Dv}")
            v_rows = None
        else:
            Dv = v_pool.shape[3]
            if v_pool.shape != (P, page, Hkv, Dv) or v_pool.dtype != q.dtype:
                raise ValueError(f"v_pool {tuple(v_pool.shape)} {v_pool.dtype} does not match k_pool / q")
            v_rows = self._staged(v_pool)
        if k_pool.shape != (P, page, Hkv, Dk) or k_pool.dtype != q.dtype or indices.shape[:2] != (B, S) \
                or block_table.shape[0] != B:
            raise ValueError(f"shape mismatch: q {tuple(q.shape)}, k_pool {tuple(k_pool.shape)}, indices "
                             f"{tuple(indices.shape)}, block_table {tuple(block_table.shape)}")
        q, k_pool = self._staged(q), self._staged(k_pool)
        indices = self._staged(indices.to(dtype=torch.int32))
        block_table = self._staged(block_table.to(dtype=torch.int32))
        out = self._empty((B, S, H, Dv), q.dtype, q)
        workspace, ws_bytes = self._paged_workspace(workspace, q, B, S, H, Hkv, Dv, K, num_splits)
        status = self._lib.dsa_sparse_attention_paged(
            q.data_ptr(), k_pool.data_ptr(), v_rows.data_ptr() if v_rows is not None else None, indices.data_ptr(),
            block_table.data_ptr() if block_table.numel() else None, out.data_ptr(), B, S, H, Hkv, Dk, Dv, K, P,
            page, M, float(scale), self.dtype_code(q.dtype), int(num_splits), workspace.data_ptr(), ws_bytes,
            self._stream(q.device),
        )
        self._check(status, "dsa_sparse_attention_paged")
        return out

    def sparse_attention_paged_fp8(
        self,
        q: torch.Tensor,
        k_pool: torch.Tensor,
        k_scale_pool: torch.Tensor,
        k_rope_pool: torch.Tensor,
        indices: torch.Tensor,
        block_table: torch.Tensor,
        *,
        scale: float,
        block_size: int = 128,
        num_splits: int = 0,
        workspace: torch.Tensor | None = None,
    ) -> torch.Tensor:
        """Output [B,S,H,C] in q's dtype of DSASparseAttentionPagedFP8 over FlashMLA's FP8 latent cache
        (uint8 e4m3fn codes [P,page,Hkv,C], float32 scales [P,page,Hkv,C/block_size], RoPE [P,page,Hkv,R])."""
        import torch

        B, S, H, D = q.shape
        P, page, Hkv, C = k_pool.shape
        R = k_rope_pool.shape[3]
        M, K = block_table.shape[1], indices.shape[2]
        bs = int(block_size)
        if k_pool.dtype != torch.uint8 or bs < 1 or C % bs or D != C + R \
                or k_scale_pool.shape != (P, page, Hkv, C // bs) or k_rope_pool.shape[:3] != (P, page, Hkv) \
                or indices.shape[:2] != (B, S) or block_table.shape[0] != B:
            raise ValueError(
                f"shape mismatch: q {tuple(q.shape)}, k_pool {tuple(k_pool.shape)} {k_pool.dtype}, k_scale_pool "
                f"{tuple(k_scale_pool.shape)}, k_rope_pool {tuple(k_rope_pool.shape)}, block_size {bs}")
        q, k_pool = self._staged(q), self._staged(k_pool)
        k_scale_pool = self._staged(k_scale_pool.to(dtype=torch.float32))
        k_rope_pool = self._staged(k_rope_pool)
        indices = self._staged(indices.to(dtype=torch.int32))
        block_table = self._staged(block_table.to(dtype=torch.int32))
        out = self._empty((B, S, H, C), q.dtype, q)
        workspace, ws_bytes = self._paged_workspace(workspace, q, B, S, H, Hkv, C, K, num_splits)
        status = self._lib.dsa_sparse_attention_paged_fp8(
            q.data_ptr(), k_pool.data_ptr(), k_scale_pool.data_ptr(),
            k_rope_pool.data_ptr() if k_rope_pool.numel() else None, indices.data_ptr(),
            block_table.data_ptr() if block_table.numel() else None, out.data_ptr(), B, S, H, Hkv, C, R, K, P,
            page, M, bs, float(scale), self.dtype_code(q.dtype), self.dtype_code(k_rope_pool.dtype),
            int(num_splits), workspace.data_ptr(), ws_bytes, self._stream(q.device),
        )
        self._check(status, "dsa_sparse_attention_paged_fp8")
        return out

    def indexer_topk_path(self, H: int, D: int, dtype: Any) -> str:
        code = self._lib.dsa_indexer_topk_path(H, D, self.dtype_code(dtype))
        return {1: "tensor-core", 0: "generic"}.get(code, "invalid")


    def moe_experts_workspace_size(self, N: int, K: int, E: int, H: int, I: int, dtype: Any) -> int:
        """Bytes of workspace for one pass over all N tokens (capped at 1 GiB; never below one token)."""
        return int(self._lib.dsa_moe_experts_workspace_size(N, K, E, H, I, self.dtype_code(dtype)))

    def moe_experts_min_workspace_size(self, K: int, E: int, H: int, I: int, dtype: Any) -> int:
        return int(self._lib.dsa_moe_experts_min_workspace_size(K, E, H, I, self.dtype_code(dtype)))

    def moe_experts(
        self,
        x: torch.Tensor,
        topk_ids: torch.Tensor,
        topk_weights: torch.Tensor,
        gate_up: torch.Tensor,
        down: torch.Tensor,
        gate_up_scale: torch.Tensor | None = None,
        down_scale: torch.Tensor | None = None,
        *,
        activation: str = "silu",
        block_size: int = 128,
        workspace: torch.Tensor | None = None,
        path: str | int | None = None,
    ) -> torch.Tensor:
        """Output [N,H] in x's dtype of DSAMoEExperts, or of DSAMoEExpertsFP8 when the experts are float8_e4m3fn.

        ``path`` forces a kernel family (a :data:`MOE_PATHS` name or code) for tests and benchmarks;
        ``None`` lets the library choose.
        """
        import torch

        if activation != "silu":
            raise ValueError(f"activation {activation!r} is not supported; only 'silu'")
        N, H = x.shape
        K = topk_ids.shape[1]
        E, two_i = gate_up.shape[0], gate_up.shape[1]
        I = down.shape[2]
        if topk_ids.shape != (N, K) or topk_weights.shape != (N, K) or gate_up.shape != (E, 2 * I, H) \
                or down.shape != (E, H, I):
            raise ValueError(
                f"shape mismatch: x {tuple(x.shape)}, topk_ids {tuple(topk_ids.shape)}, topk_weights "
                f"{tuple(topk_weights.shape)}, gate_up {tuple(gate_up.shape)}, down {tuple(down.shape)}"
            )
        fp8 = gate_up.dtype == torch.float8_e4m3fn
        if down.dtype != gate_up.dtype or (not fp8 and gate_up.dtype != x.dtype):
            raise ValueError("gate_up and down must both have x's dtype or both be float8_e4m3fn")
        if topk_weights.dtype not in (torch.float32, x.dtype):
            raise ValueError("topk_weights must be float32 or x's dtype")
        if fp8:
            if gate_up_scale is None or down_scale is None:
                raise ValueError("FP8 experts need gate_up_scale and down_scale")
            nb = lambda n: -(-n // block_size)  # noqa: E731
            if gate_up_scale.shape != (E, nb(two_i), nb(H)) or down_scale.shape != (E, nb(H), nb(I)):
                raise ValueError(
                    f"block scales {tuple(gate_up_scale.shape)} / {tuple(down_scale.shape)} do not match "
                    f"[E, ceil(2I/bs), ceil(H/bs)] / [E, ceil(H/bs), ceil(I/bs)] with block_size {block_size}"
                )
            gate_up_scale = self._staged(gate_up_scale.to(device=x.device, dtype=torch.float32))
            down_scale = self._staged(down_scale.to(device=x.device, dtype=torch.float32))
        else:
            gate_up_scale = down_scale = None
        x, topk_weights = self._staged(x), self._staged(topk_weights)
        gate_up, down = self._staged(gate_up), self._staged(down)
        topk_ids = self._staged(topk_ids.to(dtype=torch.int32))
        out = self._empty((N, H), x.dtype, x)
        if workspace is None:
            ws_bytes = self.moe_experts_workspace_size(N, K, E, H, I, x.dtype)
            workspace = self._empty((max(ws_bytes, 1),), torch.uint8, x)
        ws_bytes = workspace.numel() * workspace.element_size()
        if path is None:
            code = -1
        elif isinstance(path, str):
            names = {v: k for k, v in MOE_PATHS.items()}
            if path not in names:
                raise ValueError(f"unknown path {path!r}; expected one of {sorted(names)}")
            code = names[path]
        else:
            code = int(path)
        status = self._lib.dsa_moe_experts(
            x.data_ptr(), topk_ids.data_ptr(), topk_weights.data_ptr(), gate_up.data_ptr(), down.data_ptr(),
            gate_up_scale.data_ptr() if gate_up_scale is not None else None,
            down_scale.data_ptr() if down_scale is not None else None, out.data_ptr(),
            N, K, E, H, I, self.dtype_code(x.dtype), self.dtype_code(topk_weights.dtype),
            self.expert_dtype_code(gate_up.dtype), int(block_size), 0, code, workspace.data_ptr(), ws_bytes,
            self._stream(x.device),
        )
        self._check(status, "dsa_moe_experts")
        return out

    def moe_experts_path(self, N: int, K: int, E: int, H: int, I: int, dtype: Any, expert_dtype: Any = None,
                         block_size: int = 128) -> str:
        """The :data:`MOE_PATHS` name an automatic call would use on the current device."""
        expert = self.expert_dtype_code(dtype if expert_dtype is None else expert_dtype)
        code = self._lib.dsa_moe_experts_path(N, K, E, H, I, self.dtype_code(dtype), expert, block_size)
        return MOE_PATHS.get(code, "invalid")

    # -- sampling (ABI 5) ------------------------------------------------------------------------
    def sample_tokens(
        self,
        logits: torch.Tensor,
        temperature: torch.Tensor | float | None = None,
        top_p: torch.Tensor | float | None = None,
        seeds: torch.Tensor | int | None = None,
        offsets: torch.Tensor | int | None = None,
    ) -> torch.Tensor:
        """Next token ids [B] int32 chosen on the device (``dsa_sample_tokens``).

        ``logits``: [B,V], or [B,S,V] (the last position is used, read in place through the row
        stride), or any [B,V] view whose rows are evenly spaced. Per-row settings are [B] tensors or
        scalars (broadcast): temperature (None or <= 0: greedy), top_p (None: 1), seeds and offsets
        (Philox4x32-10 key and counter; None: 0). The rule is
        ``dsa_export.runtime.generate.sample_rows`` with the draws of
        ``dsa_export.runtime.philox.philox_uniform(seeds, offsets)``.
        """
        import torch

        if logits.dim() == 3:
            logits = logits[:, -1, :]
        if logits.dim() != 2:
            raise ValueError(f"logits must be [B,V] or [B,S,V]; got {tuple(logits.shape)}")
        B, V = logits.shape
        if logits.stride(1) != 1 or (B > 1 and logits.stride(0) < V):
            logits = logits.contiguous()
        stride = int(logits.stride(0)) if B > 1 else V
        # The rows as one dense span (the row stride's gaps included) for a library that stages tensors.
        span = logits.as_strided(((B - 1) * stride + V,), (1,)) if B > 0 else logits.reshape(-1)
        span = self._staged(span)

        def per_row(value, dtype):
            t = torch.as_tensor(value, dtype=dtype).to(device=logits.device)
            if t.dim() == 0:
                t = t.expand(B)
            if tuple(t.shape) != (B,):
                raise ValueError(f"a per-row setting must be a scalar or [{B}]; got {tuple(t.shape)}")
            return self._staged(t.contiguous())

        temps = per_row(temperature, torch.float32) if temperature is not None else None
        tops = per_row(top_p, torch.float32) if top_p is not None else None
        if seeds is not None and not isinstance(seeds, torch.Tensor):
            import numpy as np

            seeds = torch.from_numpy(np.asarray(seeds, dtype=np.uint64).view(np.int64).copy())  # uint64 bits
        elif seeds is not None and seeds.dtype == getattr(torch, "uint64", None):
            seeds = seeds.view(torch.int64)
        seed_t = per_row(seeds, torch.int64) if seeds is not None else None
        off_t = per_row(offsets, torch.int64) if offsets is not None else None
        out = self._empty((B,), torch.int32, span)

        def ptr(t):
            return t.data_ptr() if t is not None else None

        status = self._lib.dsa_sample_tokens(
            ptr(span) if B > 0 else None, stride, out.data_ptr() if B > 0 else None, ptr(temps), ptr(tops),
            ptr(seed_t), ptr(off_t), B, V, self.dtype_code(logits.dtype), self._stream(logits.device))
        self._check(status, "dsa_sample_tokens")
        return out

    # -- paged indexer + top-k (float pools, FP8 keys) (ABI 5) ---------------------------------------
    #: dsa_indexer_topk_set_select_mode's modes, by code
    SELECT_MODES = ("auto", "one-block", "multi-block", "multi-block-small-buffer")

    def indexer_topk_paged_workspace_size(self, B: int, S: int, M: int, page: int, H: int, D: int, topk: int) -> int:
        return int(self._lib.dsa_indexer_topk_paged_workspace_size(B, S, M, page, H, D, topk))

    def indexer_topk_set_select_mode(self, mode: str) -> str:
        """Force the top-k of every indexer call ("auto", "one-block", "multi-block",
        "multi-block-small-buffer"); returns the previous mode."""
        previous = int(self._lib.dsa_indexer_topk_set_select_mode(self.SELECT_MODES.index(mode)))
        return self.SELECT_MODES[previous]

    def indexer_topk_set_fp8_mma(self, enable: bool) -> bool:
        """FP8 keys: use the e4m3 MMA with q quantized (sm_89+, D <= 128); returns the previous setting."""
        return bool(self._lib.dsa_indexer_topk_set_fp8_mma(int(bool(enable))))

    def indexer_topk_paged(
        self,
        q: torch.Tensor,
        k_pool: torch.Tensor,
        w: torch.Tensor,
        block_table: torch.Tensor,
        query_start: torch.Tensor,
        lengths: torch.Tensor,
        *,
        topk: int,
        scale: float,
        causal: bool = True,
        k_scale_pool: torch.Tensor | None = None,
        workspace: torch.Tensor | None = None,
    ) -> torch.Tensor:
        """Indices [B,S,topk] int32 of DSAIndexerTopKPaged, or of DSAIndexerTopKPagedFP8 when ``k_scale_pool``
        ([P,page] or [P,page,1] float32) is given with ``k_pool`` the uint8 e4m3fn codes [P,page,D]."""
        import torch

        B, S, H, D = q.shape
        P, page = k_pool.shape[0], k_pool.shape[1]
        M = block_table.shape[1]
        fp8 = k_scale_pool is not None
        if k_pool.shape != (P, page, D) or w.shape != (B, S, H) or block_table.shape[0] != B \
                or query_start.shape != (B,) or lengths.shape != (B,):
            raise ValueError(f"shape mismatch: q {tuple(q.shape)}, k_pool {tuple(k_pool.shape)}, w {tuple(w.shape)}, "
                             f"block_table {tuple(block_table.shape)}")
        if (k_pool.dtype != torch.uint8 if fp8 else k_pool.dtype != q.dtype) or w.dtype not in (q.dtype, torch.float32):
            raise ValueError("k_pool must have q's dtype (uint8 codes with k_scale_pool) and w q's dtype or float32")
        q, k_pool, w = self._staged(q), self._staged(k_pool), self._staged(w)
        table = self._staged(block_table.to(device=q.device, dtype=torch.int32))
        start = self._staged(query_start.to(device=q.device, dtype=torch.int32))
        lens = self._staged(lengths.to(device=q.device, dtype=torch.int32))
        out = self._empty((B, S, topk), torch.int32, q)
        if workspace is None:
            ws_bytes = self.indexer_topk_paged_workspace_size(B, S, M, page, H, D, topk)
            workspace = self._empty((max(ws_bytes, 1),), torch.uint8, q)
        ws_bytes = workspace.numel() * workspace.element_size()
        tail = (B, S, P, page, M, H, D, topk, float(scale), int(bool(causal)), self.dtype_code(q.dtype),
                self.dtype_code(w.dtype), workspace.data_ptr(), ws_bytes, self._stream(q.device))
        if fp8:
            scales = self._staged(k_scale_pool.reshape(P, page).to(device=q.device, dtype=torch.float32))
            status = self._lib.dsa_indexer_topk_paged_fp8(
                q.data_ptr(), k_pool.data_ptr(), scales.data_ptr(), w.data_ptr(), table.data_ptr(), start.data_ptr(),
                lens.data_ptr(), out.data_ptr(), *tail)
            self._check(status, "dsa_indexer_topk_paged_fp8")
        else:
            status = self._lib.dsa_indexer_topk_paged(
                q.data_ptr(), k_pool.data_ptr(), w.data_ptr(), table.data_ptr(), start.data_ptr(), lens.data_ptr(),
                out.data_ptr(), *tail)
            self._check(status, "dsa_indexer_topk_paged")
        return out

    # -- paged cache write (ABI 6) ---------------------------------------------------------------------
    def paged_cache_write(self, pool: torch.Tensor, indices: torch.Tensor, updates: torch.Tensor) -> torch.Tensor:
        """DSAPagedCacheWrite: ``pool [P,page,W]`` with ``updates [B,S,W]`` written at ``indices [B,S,2]``
        (page, offset; rows out of range skipped), in place; returns the pool written (a pool the
        library cannot write where it lies, e.g. a non-contiguous one, is written through a copy)."""
        import torch

        P, page, W = pool.shape
        B, S = indices.shape[:2]
        if indices.shape != (B, S, 2) or updates.shape != (B, S, W) or updates.dtype != pool.dtype:
            raise ValueError(f"expected pool [P,page,W], indices [B,S,2] and updates [B,S,W] of pool's dtype; got "
                             f"pool {tuple(pool.shape)}, indices {tuple(indices.shape)}, updates "
                             f"{tuple(updates.shape)} {updates.dtype}")
        pool, updates = self._staged(pool), self._staged(updates)
        idx = self._staged(indices.to(device=pool.device, dtype=torch.int64))
        status = self._lib.dsa_paged_cache_write(pool.data_ptr(), idx.data_ptr(), updates.data_ptr(), B, S, P, page, W,
                                                 self.dtype_code(pool.dtype), self._stream(pool.device))
        self._check(status, "dsa_paged_cache_write")
        return pool


_loaded: dict[Path, KernelLibrary] = {}


def moe_experts(
    x: torch.Tensor,
    topk_ids: torch.Tensor,
    topk_weights: torch.Tensor,
    gate_up: torch.Tensor,
    down: torch.Tensor,
    gate_up_scale: torch.Tensor | None = None,
    down_scale: torch.Tensor | None = None,
    *,
    activation: str = "silu",
    block_size: int = 128,
    library: str | os.PathLike[str] | None = None,
) -> torch.Tensor:
    """DSAMoEExperts (or DSAMoEExpertsFP8 for float8_e4m3fn experts) of CUDA tensors through the kernel library.

    The GPU counterpart of ``dsa_export.ops.dsa_moe_experts`` / ``dsa_moe_experts_fp8``: same
    arguments, output [N,H] in x's dtype on x's device and current stream.
    """
    return load_kernels(library).moe_experts(x, topk_ids, topk_weights, gate_up, down, gate_up_scale, down_scale,
                                             activation=activation, block_size=block_size)


def load_kernels(path: str | os.PathLike[str] | None = None) -> KernelLibrary:
    """The kernel library at ``path`` (default: :func:`find_library("kernels")`), loaded once."""
    resolved = Path(path).resolve() if path is not None else require_library("kernels")
    if resolved not in _loaded:
        _loaded[resolved] = KernelLibrary(resolved)
    return _loaded[resolved]
