"""Looped (and stacked) transformers with Ouro's sandwich decoder layer and two loop boundaries.

A model embeds tokens, applies one block of `layers_per_block` decoder layers `n` times, and
reads out through the final RMSNorm and the LM head. The boundary mode decides what the next
loop step sees:

    norm  (as released Ouro does):   h_t = Norm(Block(h_{t-1}))    readout Head(h_t)
    none  (boundary norm removed):   h_t = Block(h_{t-1})          readout Head(Norm(h_t))

Both modes use the same parameters, so running a model in the mode it was not trained with
(the "surgery") adds nothing. At n = 1 the two compute exactly the same ops.

A third run mode, `rescale` (E5), is a surgery on norm-trained models: the boundary norm is replaced by a
fixed per-step scalar, h_t = g * Block(h_{t-1}) / s_t with g the norm's own gain and s_t given by the
caller (the norm-trained model's mean state RMS at step t); the readout stays Head(Norm(x)). It adds no
parameter and, like `none`, reads out exactly as `norm` at n = 1.

Every module carries a leading ensemble dimension S: one set of weights per seed, so that
many seeds train in one process with batched matmuls. Each member is initialised from its own
seed only, so what a seed gets never depends on which seeds share its group.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch
import torch.nn.functional as F
import torch.utils.checkpoint
from torch import Tensor, nn
from torch.nn.attention import SDPBackend, sdpa_kernel

BOUNDARIES = ("norm", "none")  # the modes a model is trained with
RUN_MODES = (*BOUNDARIES, "rescale")  # the modes it can be run in


@dataclass(frozen=True)
class ModelConfig:
    vocab_size: int
    d_model: int = 64
    n_heads: int = 4
    d_ff: int = 176
    layers_per_block: int = 1
    trained_loops: int = 4  # the trained budget T
    tied: bool = True  # True: one block looped; False: a stack of distinct layers run once
    boundary: str = "norm"  # the mode the model is trained with
    rope_theta: float = 10_000.0
    norm_eps: float = 1e-6

    def __post_init__(self):
        from engine.core.limits import check_fields

        check_fields(self, "model")  # types and ranges: engine.core.limits.RANGES
        if self.d_model % self.n_heads or (self.d_model // self.n_heads) % 2:
            raise ValueError(
                f"d_model ({self.d_model}) must split into n_heads ({self.n_heads}) heads of an "
                "even size (RoPE rotates pairs); change one of them."
            )
        if self.boundary not in BOUNDARIES:
            raise ValueError(f"boundary must be one of {BOUNDARIES}, got {self.boundary!r}.")
        if not self.tied and self.trained_loops != 1:
            raise ValueError(
                "A stacked model (tied=False) runs its layers once: set trained_loops=1 and "
                "layers_per_block to the total depth (L*T of the looped model it matches)."
            )

    @property
    def arch(self) -> str:
        return "looped" if self.tied else "stacked"

    @property
    def head_dim(self) -> int:
        return self.d_model // self.n_heads

    @property
    def n_params(self) -> int:
        """Parameters of one model (one ensemble member); independent of the loop count."""
        d, f, v, L = self.d_model, self.d_ff, self.vocab_size, self.layers_per_block
        layer = 4 * d * d + 3 * d * f + 4 * d
        return v * d + L * layer + d + d * v


# ---------------------------------------------------------------- ensemble building blocks


class Linear(nn.Module):
    """A bias-free linear layer with one weight per ensemble member."""

    def __init__(self, members: int, d_in: int, d_out: int):
        super().__init__()
        self.weight = nn.Parameter(torch.empty(members, d_in, d_out))

    def forward(self, x: Tensor) -> Tensor:  # (S, ..., d_in) -> (S, ..., d_out)
        S, *mid, d = x.shape
        return torch.bmm(x.reshape(S, -1, d), self.weight).view(S, *mid, -1)


class RMSNorm(nn.Module):
    def __init__(self, members: int, d: int, eps: float):
        super().__init__()
        self.weight = nn.Parameter(torch.ones(members, d))
        self.eps = eps

    def forward(self, x: Tensor) -> Tensor:  # (S, B, T, C)
        dtype = x.dtype
        x = x.float()
        x = x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + self.eps)
        return self.weight[:, None, None, :] * x.to(dtype)


def rope_tables(T: int, head_dim: int, theta: float, device) -> tuple[Tensor, Tensor]:
    """cos and sin tables (T, D) for rotary position embeddings, computed once per forward."""
    inv_freq = 1.0 / theta ** (torch.arange(0, head_dim, 2, device=device, dtype=torch.float32) / head_dim)
    angles = torch.outer(torch.arange(T, device=device, dtype=torch.float32), inv_freq)
    angles = torch.cat([angles, angles], -1)
    return angles.cos(), angles.sin()


def rope(x: Tensor, cos: Tensor, sin: Tensor) -> Tensor:
    """Rotate (N, H, T, D) by position, Llama's rotate-half layout (as Ouro)."""
    x1, x2 = x.chunk(2, dim=-1)
    return x * cos.to(x.dtype) + torch.cat([-x2, x1], -1) * sin.to(x.dtype)


CPU_BF16_MATH_ATTENTION = True  # causal_attention's lever (the bench turns it off to measure it)


def causal_attention(q: Tensor, k: Tensor, v: Tensor) -> Tensor:
    """Causal scaled dot-product attention. In bf16 on the CPU through SDPA's math backend: for the tasks' short
    sequences (about 13 tokens) the flash kernel's backward took 47% of a bf16 step at the paper size, and the math
    backend ran forward + backward there at 594 GFLOP/s against 384 (issue 44, 2-core AMX Xeon); a whole bf16 step of
    the `cpu` preset's model 1.20x faster with it (16 seeds, 2 threads), 0.98x (4 seeds, 1 thread; 2026-12-05, loaded
    machine; `loopscope bench --only precision`, attn_math_ratio). fp32 and the GPU keep PyTorch's own choice (so the
    shipped fp32 runs are unchanged)."""
    if CPU_BF16_MATH_ATTENTION and q.dtype == torch.bfloat16 and q.device.type == "cpu":
        with sdpa_kernel(SDPBackend.MATH):
            return F.scaled_dot_product_attention(q, k, v, is_causal=True)
    return F.scaled_dot_product_attention(q, k, v, is_causal=True)


class Attention(nn.Module):
    def __init__(self, members: int, cfg: ModelConfig):
        super().__init__()
        d = cfg.d_model
        self.q_proj, self.k_proj, self.v_proj, self.o_proj = (Linear(members, d, d) for _ in range(4))
        self.n_heads = cfg.n_heads

    def forward(self, x: Tensor, rope_cs: tuple[Tensor, Tensor]) -> Tensor:  # (S, B, T, C)
        S, B, T, C = x.shape
        q, k, v = (
            p(x).view(S * B, T, self.n_heads, -1).transpose(1, 2)  # (S*B, H, T, D)
            for p in (self.q_proj, self.k_proj, self.v_proj)
        )
        q, k = rope(q, *rope_cs), rope(k, *rope_cs)
        y = causal_attention(q, k, v)
        return self.o_proj(y.transpose(1, 2).reshape(S, B, T, C))


class SwiGLU(nn.Module):
    def __init__(self, members: int, cfg: ModelConfig):
        super().__init__()
        self.gate_proj = Linear(members, cfg.d_model, cfg.d_ff)
        self.up_proj = Linear(members, cfg.d_model, cfg.d_ff)
        self.down_proj = Linear(members, cfg.d_ff, cfg.d_model)

    def forward(self, x: Tensor) -> Tensor:
        return self.down_proj(F.silu(self.gate_proj(x)) * self.up_proj(x))


class SandwichLayer(nn.Module):
    """Ouro's decoder layer: each sublayer normalised on the way in and on the way out."""

    def __init__(self, members: int, cfg: ModelConfig):
        super().__init__()
        norm = lambda: RMSNorm(members, cfg.d_model, cfg.norm_eps)  # noqa: E731
        self.input_layernorm, self.input_layernorm_2 = norm(), norm()
        self.post_attention_layernorm, self.post_attention_layernorm_2 = norm(), norm()
        self.self_attn = Attention(members, cfg)
        self.mlp = SwiGLU(members, cfg)

    def forward(self, x: Tensor, rope_cs: tuple[Tensor, Tensor]) -> Tensor:
        h = x + self.input_layernorm_2(self.self_attn(self.input_layernorm(x), rope_cs))
        return h + self.post_attention_layernorm_2(self.mlp(self.post_attention_layernorm(h)))


# ---------------------------------------------------------------- the looped model


@dataclass
class LoopOutput:
    """The readout of every loop step from one forward pass."""

    logits: Tensor  # (steps, S, B, P, V): P = 1 (answer position) or every position
    norm_pre: Tensor  # (n, S, B) ||Block(h_{t-1})|| at the answer position, before the boundary
    norm_post: Tensor  # (n, S, B) ||h_t||, the state the next step receives


class LoopedLM(nn.Module):
    def __init__(self, cfg: ModelConfig, members: int = 1):
        super().__init__()
        self.cfg, self.members = cfg, members
        self.embed_tokens = nn.Parameter(torch.empty(members, cfg.vocab_size, cfg.d_model))
        self.layers = nn.ModuleList(SandwichLayer(members, cfg) for _ in range(cfg.layers_per_block))
        self.norm = RMSNorm(members, cfg.d_model, cfg.norm_eps)
        self.lm_head = Linear(members, cfg.d_model, cfg.vocab_size)

    # -- initialisation: member i depends on seeds[i] alone
    def init_members(self, seeds: list[int]) -> None:
        assert len(seeds) == self.members, "one seed per ensemble member"
        depth = self.cfg.layers_per_block * self.cfg.trained_loops
        for i, seed in enumerate(seeds):
            g = torch.Generator().manual_seed(seed)
            with torch.no_grad():
                for name, p in self.named_parameters():  # a fixed order, so a fixed stream
                    if p.dim() == 2:  # an RMSNorm gain (members, C)
                        p[i].fill_(1.0)
                        continue
                    residual_out = name.endswith(("o_proj.weight", "down_proj.weight"))
                    std = 0.02 / math.sqrt(2 * depth) if residual_out else 0.02
                    p[i].copy_(torch.randn(p.shape[1:], generator=g) * std)

    # -- the loop, in three stages
    def forward(
        self,
        tokens: Tensor,  # (S, B, T) token ids, one batch per member
        n_loops: int | None = None,
        boundary: str | None = None,
        all_positions: bool = False,
        readout_steps: str = "all",  # "all": read out every step; "last": only the final one
        scales: Tensor | None = None,  # (>= n, S) the fixed per-step scalars s_t of mode `rescale`
        recompute: bool = False,  # keep only each layer's input for the backward, recompute the rest (train.checkpoint)
    ) -> LoopOutput:
        n = self.cfg.trained_loops if n_loops is None else n_loops  # 0 is not "the default": it is refused
        if n < 1:
            raise ValueError(f"n_loops must be at least 1, got {n}.")
        mode = boundary or self.cfg.boundary
        if mode not in RUN_MODES:
            raise ValueError(f"boundary must be one of {RUN_MODES}, got {mode!r}.")
        if mode == "rescale" and (scales is None or scales.shape[0] < n or scales.shape[1] != self.members):
            raise ValueError(f"mode rescale needs scales of shape (>= {n}, {self.members}): one per step and member.")
        # 1. embed: member i looks up its own table; embeddings enter step 1 unscaled
        S, V, C = self.embed_tokens.shape
        offsets = torch.arange(S, device=tokens.device).view(S, 1, 1) * V
        h = self.embed_tokens.view(S * V, C)[tokens + offsets]  # (S, B, T, C)
        rope_cs = rope_tables(tokens.shape[-1], self.cfg.head_dim, self.cfg.rope_theta, tokens.device)
        # 2. loop n times, reading out each step
        logits, norm_pre, norm_post = [], [], []
        for step in range(1, n + 1):
            x = self.block(h, rope_cs, recompute and torch.is_grad_enabled())
            h, readout_in = self.boundary_transfer(x, mode, None if scales is None else scales[step - 1])
            norm_pre.append(x[:, :, -1].float().norm(dim=-1))
            norm_post.append(h[:, :, -1].float().norm(dim=-1))
            if readout_steps == "all" or step == n:
                # 3. read out (the answer position, or every position for dense losses)
                logits.append(self.lm_head(readout_in if all_positions else readout_in[:, :, -1:]))
        return LoopOutput(torch.stack(logits), torch.stack(norm_pre), torch.stack(norm_post))

    def block(self, h: Tensor, rope_cs: tuple[Tensor, Tensor], recompute: bool = False) -> Tensor:
        """The block's layers in order; with recompute, activation checkpointing per layer (only each layer's input is
        kept for the backward; the same ops run again there, so the result is unchanged)."""
        for layer in self.layers:
            if recompute:
                h = torch.utils.checkpoint.checkpoint(layer, h, rope_cs, use_reentrant=False)
            else:
                h = layer(h, rope_cs)
        return h

    def boundary_transfer(self, x: Tensor, mode: str, scale: Tensor | None = None) -> tuple[Tensor, Tensor]:
        """Split a block output into (state for the next step, input to the readout).

        `norm` normalises the state itself; `none` passes the raw state on and normalises only
        the copy that the head reads; `rescale` passes on g * x / scale (scale: (S,), one per member).
        Every way the head sees Norm(x) at this step.
        """
        normed = self.norm(x)
        if mode == "rescale":
            return self.norm.weight[:, None, None, :] * (x / scale.to(x.dtype)[:, None, None, None]), normed
        return (normed, normed) if mode == "norm" else (x, normed)

    # -- one member's weights as a flat state dict (for safetensors) and back
    def member_state(self, i: int) -> dict[str, Tensor]:
        return {k: v[i].detach().clone().contiguous() for k, v in self.state_dict().items()}

    def member(self, i: int) -> LoopedLM:
        """Member i alone, as a one-member model (its own copy of the weights, on the same device)."""
        one = LoopedLM(self.cfg, members=1).to(self.embed_tokens.device)
        one.load_member(0, self.member_state(i))
        return one

    def load_member(self, i: int, state: dict[str, Tensor]) -> None:
        own = self.state_dict()
        if set(state) != set(own):
            missing, extra = sorted(set(own) - set(state)), sorted(set(state) - set(own))
            raise ValueError(f"checkpoint does not match the model: missing {missing}, unexpected {extra}")
        with torch.no_grad():
            for k, v in own.items():
                v[i].copy_(state[k])


def build(cfg: ModelConfig, seeds: list[int]) -> LoopedLM:
    model = LoopedLM(cfg, members=len(seeds))
    model.init_members(seeds)
    return model
