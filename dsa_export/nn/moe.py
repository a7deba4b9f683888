"""The mixture-of-experts block of DeepSeek-V3.2 and GLM-5, exportable through the ``dsa`` op.

:class:`RoutedMoE` computes what transformers' ``DeepseekV32MoE`` (and ``GlmMoeDsaMoE``, the same
classes with ``n_group = 1``) computes: a sigmoid router with ``e_score_correction_bias``,
group-limited top-k, optional renormalization and ``routed_scaling_factor``, the routed experts and
the shared experts. The router stays in standard ops (TopK, ScatterElements, Where) and the shared
experts in MatMuls; only the routed experts become one ``DSAMoEExperts`` node (``DSAMoEExpertsFP8``
for FP8 block-scaled expert weights), instead of transformers' exportable ``batched_mm`` path,
which gathers every routed token's weight matrices (~700 MB per token at real width).

The submodules keep transformers' attribute names (``gate``, ``experts``, ``shared_experts``), so
parameter names stay those of the checkpoint whether the block wraps transformers' modules
(:meth:`RoutedMoE.from_hf`) or our own (:meth:`RoutedMoE.build`).
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from dsa_export.errors import DSAUserError
from dsa_export.ops import dsa_moe_experts, dsa_moe_experts_fp8
from dsa_export.ops.contract import MOE_ACTIVATIONS

#: transformers' MoE block classes that :func:`replace_moe_blocks` swaps.
HF_MOE_CLASSES = ("DeepseekV32MoE", "GlmMoeDsaMoE")


class TopkRouter(nn.Module):
    """The router's parameters under transformers' names (``weight``, ``e_score_correction_bias``)."""

    def __init__(self, hidden_size: int, n_experts: int):
        super().__init__()
        self.weight = nn.Parameter(torch.zeros(n_experts, hidden_size, dtype=torch.float32))
        self.register_buffer("e_score_correction_bias", torch.zeros(n_experts, dtype=torch.float32))


class Experts(nn.Module):
    """The routed experts' weights stacked as transformers stores them (gate and up rows packed)."""

    def __init__(self, hidden_size: int, intermediate_size: int, n_experts: int):
        super().__init__()
        self.gate_up_proj = nn.Parameter(torch.empty(n_experts, 2 * intermediate_size, hidden_size))
        self.down_proj = nn.Parameter(torch.empty(n_experts, hidden_size, intermediate_size))


class SharedExperts(nn.Module):
    """Always-active SwiGLU experts (transformers' ``DeepseekV32MLP`` names)."""

    def __init__(self, hidden_size: int, intermediate_size: int):
        super().__init__()
        self.gate_proj = nn.Linear(hidden_size, intermediate_size, bias=False)
        self.up_proj = nn.Linear(hidden_size, intermediate_size, bias=False)
        self.down_proj = nn.Linear(intermediate_size, hidden_size, bias=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.down_proj(F.silu(self.gate_proj(x)) * self.up_proj(x))


class RoutedMoE(nn.Module):
    """Router + routed experts (one ``dsa`` node) + shared experts, as transformers' MoE forward.

    Args:
        gate: module with ``weight [E, H]`` and the ``e_score_correction_bias [E]`` buffer.
        experts: module with ``gate_up_proj [E, 2I, H]`` and ``down_proj [E, H, I]``; FP8 when
            ``gate_up_proj`` is float8_e4m3fn and the module carries ``gate_up_proj_scale_inv`` /
            ``down_proj_scale_inv`` (float32 block scales) and optionally an int ``block_size``.
        shared_experts: module applied to every token, or None.
        top_k, n_group, topk_group, norm_topk_prob, routed_scaling_factor: the routing of
            transformers' ``DeepseekV32TopkRouter``.
        activation: the experts' activation; the op supports ``silu``.
    """

    def __init__(self, gate: nn.Module, experts: nn.Module, shared_experts: nn.Module | None, *, top_k: int,
                 n_group: int = 1, topk_group: int = 1, norm_topk_prob: bool = True,
                 routed_scaling_factor: float = 1.0, activation: str = "silu"):
        super().__init__()
        n_experts = gate.weight.shape[0]
        if activation not in MOE_ACTIVATIONS:
            raise DSAUserError(f"the routed experts use activation {activation!r}, which the MoE op does not "
                               f"support ({', '.join(MOE_ACTIVATIONS)}); keep the transformers block instead.")
        if n_group < 1 or n_experts % n_group or not 1 <= topk_group <= n_group:
            raise DSAUserError(f"n_group {n_group} / topk_group {topk_group} do not divide {n_experts} experts "
                               "into groups; fix the config.")
        if n_group > 1 and n_experts // n_group < 2:
            raise DSAUserError("group-limited routing scores each group by its two best experts, so every group "
                               "needs at least two experts; lower n_group.")
        if not 1 <= top_k <= topk_group * (n_experts // n_group):
            raise DSAUserError(f"top_k {top_k} exceeds the {topk_group * (n_experts // n_group)} experts of the "
                               f"{topk_group} selected groups; fix the config.")
        self.gate = gate
        self.experts = experts
        self.shared_experts = shared_experts
        self.top_k, self.n_group, self.topk_group = int(top_k), int(n_group), int(topk_group)
        self.norm_topk_prob = bool(norm_topk_prob)
        self.routed_scaling_factor = float(routed_scaling_factor)
        self.activation = activation

    @classmethod
    def build(cls, hidden_size: int, intermediate_size: int, n_experts: int, *, top_k: int, n_shared: int = 1,
              **routing) -> RoutedMoE:
        """A block with fresh modules (our built-in models)."""
        shared = SharedExperts(hidden_size, intermediate_size * n_shared) if n_shared else None
        return cls(TopkRouter(hidden_size, n_experts), Experts(hidden_size, intermediate_size, n_experts), shared,
                   top_k=top_k, **routing)

    @classmethod
    def from_hf(cls, moe: nn.Module) -> RoutedMoE:
        """Wrap a transformers ``DeepseekV32MoE`` / ``GlmMoeDsaMoE``, reusing its submodules."""
        gate = moe.gate
        config = getattr(moe, "config", None)
        activation = getattr(config, "hidden_act", "silu")
        block = cls(gate, moe.experts, moe.shared_experts, top_k=gate.top_k, n_group=gate.num_group,
                    topk_group=gate.topk_group, norm_topk_prob=gate.norm_topk_prob,
                    routed_scaling_factor=gate.routed_scaling_factor, activation=activation)
        return block.train(moe.training)

    @property
    def is_fp8(self) -> bool:
        return self.experts.gate_up_proj.dtype == torch.float8_e4m3fn

    def route(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """``(topk_ids int32 [N, top_k], topk_weights float32 [N, top_k])`` of tokens ``x [N, H]``.

        Step for step transformers' router, so torch.topk (ONNX TopK) sees the same scores.
        """
        logits = F.linear(x.float(), self.gate.weight.float())
        scores = logits.sigmoid()
        choice = scores + self.gate.e_score_correction_bias.float()
        n_experts = choice.shape[-1]
        if self.n_group > 1:
            per_group = n_experts // self.n_group
            group_scores = choice.view(-1, self.n_group, per_group).topk(2, dim=-1)[0].sum(dim=-1)
            group_idx = torch.topk(group_scores, k=self.topk_group, dim=-1, sorted=False)[1]
            group_mask = torch.zeros_like(group_scores).scatter_(1, group_idx, 1.0)
            score_mask = group_mask.unsqueeze(-1).expand(-1, self.n_group, per_group).reshape(-1, n_experts)
            choice = choice.masked_fill(~score_mask.bool(), float("-inf"))
        # With one group every expert is eligible: transformers' mask is all ones then.
        topk_ids = torch.topk(choice, k=self.top_k, dim=-1, sorted=False)[1]
        topk_weights = scores.gather(1, topk_ids)
        if self.norm_topk_prob:
            topk_weights = topk_weights / (topk_weights.sum(dim=-1, keepdim=True) + 1e-20)
        return topk_ids.to(torch.int32), topk_weights * self.routed_scaling_factor

    def routed(self, x: torch.Tensor, topk_ids: torch.Tensor, topk_weights: torch.Tensor) -> torch.Tensor:
        experts = self.experts
        if not self.is_fp8:
            return dsa_moe_experts(x, topk_ids, topk_weights, experts.gate_up_proj, experts.down_proj,
                                   activation=self.activation)
        missing = [n for n in ("gate_up_proj_scale_inv", "down_proj_scale_inv") if not hasattr(experts, n)]
        if missing:
            raise DSAUserError(f"the FP8 experts have no {' / '.join(missing)}; load the checkpoint's "
                               "weight_scale_inv tensors or dequantize the experts.")
        return dsa_moe_experts_fp8(x, topk_ids, topk_weights, experts.gate_up_proj, experts.down_proj,
                                   experts.gate_up_proj_scale_inv, experts.down_proj_scale_inv,
                                   block_size=int(getattr(experts, "block_size", 128)), activation=self.activation)

    def forward(self, hidden_states: torch.Tensor) -> torch.Tensor:
        shape = hidden_states.shape
        x = hidden_states.reshape(-1, shape[-1])
        topk_ids, topk_weights = self.route(x)
        out = self.routed(x, topk_ids, topk_weights).view(shape)
        if self.shared_experts is not None:
            out = out + self.shared_experts(hidden_states)
        return out


def replace_moe_blocks(model: nn.Module) -> int:
    """Swap every transformers MoE block of ``model`` (DeepSeek-V3.2, GLM-5) for a :class:`RoutedMoE`
    in place, reusing its submodules (parameter names do not change); returns how many."""
    swaps = [(name, module) for name, module in model.named_modules()
             if name and type(module).__name__ in HF_MOE_CLASSES]
    for name, module in swaps:
        parent_name, _, attr = name.rpartition(".")
        parent = model.get_submodule(parent_name) if parent_name else model
        setattr(parent, attr, RoutedMoE.from_hf(module))
    return len(swaps)
