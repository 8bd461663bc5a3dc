"""A local, readable implementation of the released ByteDance Ouro looped LMs (no remote code).

Importing this module registers model_type "ouro" with `AutoConfig` and `AutoModelForCausalLM`,
so `AutoModelForCausalLM.from_pretrained(local_dir)` loads a released checkpoint (config.json +
safetensors with the released weight names) without `trust_remote_code`.

One loop step applies all decoder layers once. Two loop boundaries share the same parameters:

    norm  (as released):       state_t = Norm(Block(state_{t-1}))    readout Head(state_t)
    none  (boundary removed):  state_t = Block(state_{t-1})          readout Head(Norm(state_t))

Embeddings enter step 1 unscaled. At n = 1 both modes compute exactly the same ops. The exit gate
reads each step's normalised state (the readout input).
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import Tensor, nn
from transformers import (
    AutoConfig,
    AutoModel,
    AutoModelForCausalLM,
    PreTrainedConfig,
    PreTrainedModel,
)
from transformers.modeling_outputs import BaseModelOutput, CausalLMOutput

BOUNDARIES = ("norm", "none")


class OuroConfig(PreTrainedConfig):
    """Config with the released Ouro field names; unknown extra fields are kept as attributes."""

    model_type = "ouro"
    default_theta = 1_000_000.0  # used when a config gives no rope_theta

    vocab_size: int = 49152
    hidden_size: int = 2048
    intermediate_size: int = 5632
    num_hidden_layers: int = 24
    num_attention_heads: int = 16
    num_key_value_heads: int | None = None
    head_dim: int | None = None
    hidden_act: str = "silu"
    max_position_embeddings: int = 65536
    initializer_range: float = 0.02
    rms_norm_eps: float = 1e-6
    use_cache: bool = True
    pad_token_id: int | None = None
    bos_token_id: int | None = 0
    eos_token_id: int | list[int] | None = 0
    tie_word_embeddings: bool = False
    rope_parameters: dict | None = None  # transformers 5 stores `rope_theta` here
    attention_bias: bool = False
    attention_dropout: float = 0.0
    total_ut_steps: int = 4
    early_exit_threshold: float | None = 1.0  # the released early exit (released_exit_steps); None: the last step
    early_exit_step: int | None = None  # 0-based; when set (and within the steps run) it takes precedence

    def __post_init__(self, **kwargs):
        if self.num_key_value_heads is None:
            self.num_key_value_heads = self.num_attention_heads
        if self.head_dim is None:
            self.head_dim = self.hidden_size // self.num_attention_heads
        if self.num_attention_heads % self.num_key_value_heads:
            raise ValueError("num_attention_heads must be a multiple of num_key_value_heads")
        super().__post_init__(**kwargs)

    @property
    def rope_theta(self) -> float:
        return (self.rope_parameters or {}).get("rope_theta", self.default_theta)

    @rope_theta.setter
    def rope_theta(self, value: float) -> None:
        self.rope_parameters = {
            **(self.rope_parameters or {"rope_type": "default"}),
            "rope_theta": value,
        }


@dataclass
class OuroLoopOutput:
    """Per-step readout at the last real position of each row; step t is index t - 1."""

    logits: Tensor  # (n, B, V) float32
    norm_pre: Tensor  # (n, B) L2 norm of Block(state_{t-1}), before the boundary
    norm_post: Tensor  # (n, B) L2 norm of state_t, the state fed to the next step
    exit_probs: Tensor  # (n, B) float32, sums to 1 over steps
    gate_lambdas: Tensor  # (n, B) float32, sigmoid of the exit gate (does not depend on n)
    gate_lambdas_native: Tensor  # (n, B) the same in the model's dtype, as the released forward computes it
    released_steps: Tensor  # (n, B) long: row k - 1 is the step (1..k) the released forward run k steps reads


class OuroRMSNorm(nn.Module):
    def __init__(self, hidden_size: int, eps: float = 1e-6):
        super().__init__()
        self.weight = nn.Parameter(torch.ones(hidden_size))
        self.eps = eps

    def forward(self, x: Tensor) -> Tensor:
        x32 = x.float()
        x32 = x32 * torch.rsqrt(x32.pow(2).mean(-1, keepdim=True) + self.eps)
        return self.weight * x32.to(x.dtype)


def rope_cos_sin(position_ids: Tensor, head_dim: int, theta: float, dtype: torch.dtype):
    """Llama-style RoPE tables (B, T, head_dim), computed in fp32 then cast."""
    exps = torch.arange(0, head_dim, 2, device=position_ids.device, dtype=torch.float32) / head_dim
    inv_freq = 1.0 / (theta**exps)
    freqs = position_ids.float()[..., None] * inv_freq
    emb = torch.cat((freqs, freqs), dim=-1)
    return emb.cos().to(dtype), emb.sin().to(dtype)


def rotate_half(x: Tensor) -> Tensor:
    x1, x2 = x.chunk(2, dim=-1)
    return torch.cat((-x2, x1), dim=-1)


class OuroAttention(nn.Module):
    def __init__(self, config: OuroConfig):
        super().__init__()
        self.n_heads, self.n_kv = config.num_attention_heads, config.num_key_value_heads
        self.head_dim, bias = config.head_dim, config.attention_bias
        self.q_proj = nn.Linear(config.hidden_size, self.n_heads * self.head_dim, bias=bias)
        self.k_proj = nn.Linear(config.hidden_size, self.n_kv * self.head_dim, bias=bias)
        self.v_proj = nn.Linear(config.hidden_size, self.n_kv * self.head_dim, bias=bias)
        self.o_proj = nn.Linear(self.n_heads * self.head_dim, config.hidden_size, bias=bias)

    def forward(self, x: Tensor, cos: Tensor, sin: Tensor, mask: Tensor | None) -> Tensor:
        B, T, _ = x.shape
        q = self.q_proj(x).view(B, T, -1, self.head_dim).transpose(1, 2)
        k = self.k_proj(x).view(B, T, -1, self.head_dim).transpose(1, 2)
        v = self.v_proj(x).view(B, T, -1, self.head_dim).transpose(1, 2)
        cos, sin = cos[:, None], sin[:, None]
        q = q * cos + rotate_half(q) * sin
        k = k * cos + rotate_half(k) * sin
        if self.n_kv != self.n_heads:
            k = k.repeat_interleave(self.n_heads // self.n_kv, dim=1)
            v = v.repeat_interleave(self.n_heads // self.n_kv, dim=1)
        out = F.scaled_dot_product_attention(q, k, v, attn_mask=mask, is_causal=mask is None)
        return self.o_proj(out.transpose(1, 2).reshape(B, T, -1))


class OuroMLP(nn.Module):
    def __init__(self, config: OuroConfig):
        super().__init__()
        self.gate_proj = nn.Linear(config.hidden_size, config.intermediate_size, bias=False)
        self.up_proj = nn.Linear(config.hidden_size, config.intermediate_size, bias=False)
        self.down_proj = nn.Linear(config.intermediate_size, config.hidden_size, bias=False)
        if config.hidden_act != "silu":
            raise ValueError(f"only hidden_act='silu' is supported, got {config.hidden_act!r}")

    def forward(self, x: Tensor) -> Tensor:
        return self.down_proj(F.silu(self.gate_proj(x)) * self.up_proj(x))


class OuroDecoderLayer(nn.Module):
    """Sandwich norm: each sublayer's output is normalised again before the residual add."""

    def __init__(self, config: OuroConfig):
        super().__init__()
        self.self_attn = OuroAttention(config)
        self.mlp = OuroMLP(config)
        h, eps = config.hidden_size, config.rms_norm_eps
        self.input_layernorm = OuroRMSNorm(h, eps)
        self.input_layernorm_2 = OuroRMSNorm(h, eps)
        self.post_attention_layernorm = OuroRMSNorm(h, eps)
        self.post_attention_layernorm_2 = OuroRMSNorm(h, eps)

    def forward(self, x: Tensor, cos: Tensor, sin: Tensor, mask: Tensor | None) -> Tensor:
        h = x + self.input_layernorm_2(self.self_attn(self.input_layernorm(x), cos, sin, mask))
        return h + self.post_attention_layernorm_2(self.mlp(self.post_attention_layernorm(h)))


class OuroPreTrainedModel(PreTrainedModel):
    config_class = OuroConfig
    config: OuroConfig
    base_model_prefix = "model"
    _no_split_modules = ["OuroDecoderLayer"]
    _supports_sdpa = True


class OuroModel(OuroPreTrainedModel):
    def __init__(self, config: OuroConfig):
        super().__init__(config)
        self.embed_tokens = nn.Embedding(config.vocab_size, config.hidden_size)
        self.layers = nn.ModuleList(OuroDecoderLayer(config) for _ in range(config.num_hidden_layers))
        self.norm = OuroRMSNorm(config.hidden_size, config.rms_norm_eps)
        self.early_exit_gate = nn.Linear(config.hidden_size, 1)
        self.post_init()

    def iter_steps(
        self,
        input_ids: Tensor | None = None,
        attention_mask: Tensor | None = None,
        n_loops: int | None = None,
        boundary: str = "norm",
        inputs_embeds: Tensor | None = None,
    ) -> Iterator[tuple[Tensor, Tensor, Tensor]]:
        """Yield (pre, state, readout) per loop step, each (B, T, H).

        pre = Block(state_{t-1}); state = what feeds step t + 1; readout = Norm(pre), the input of
        the LM head and the exit gate. Left (or right) padding is handled by `attention_mask`.
        """
        if boundary not in BOUNDARIES:
            raise ValueError(f"boundary must be one of {BOUNDARIES}, got {boundary!r}")
        n_loops = self.config.total_ut_steps if n_loops is None else int(n_loops)
        if n_loops < 1:
            raise ValueError("n_loops must be >= 1")
        state = self.embed_tokens(input_ids) if inputs_embeds is None else inputs_embeds
        B, T, _ = state.shape
        if attention_mask is None:
            positions = torch.arange(T, device=state.device).expand(B, T)
            mask = None  # plain causal attention
        else:
            keep = attention_mask.to(state.device).bool()
            positions = (keep.long().cumsum(-1) - 1).clamp(min=0)
            causal = torch.ones(T, T, dtype=torch.bool, device=state.device).tril()
            eye = torch.eye(T, dtype=torch.bool, device=state.device)
            # Pad queries see themselves only, so no softmax row is empty (no NaNs anywhere).
            mask = ((causal & keep[:, None, :]) | eye)[:, None]
        cos, sin = rope_cos_sin(positions, self.config.head_dim, self.config.rope_theta, state.dtype)
        for _ in range(n_loops):
            pre = state
            for layer in self.layers:
                pre = layer(pre, cos, sin, mask)
            readout = self.norm(pre)
            state = readout if boundary == "norm" else pre
            yield pre, state, readout

    def forward(
        self,
        input_ids: Tensor | None = None,
        attention_mask: Tensor | None = None,
        n_loops: int | None = None,
        boundary: str = "norm",
        inputs_embeds: Tensor | None = None,
        output_hidden_states: bool = False,
        **kwargs,
    ) -> BaseModelOutput:
        readouts = [r for _, _, r in self.iter_steps(input_ids, attention_mask, n_loops, boundary, inputs_embeds)]
        return BaseModelOutput(
            last_hidden_state=readouts[-1],
            hidden_states=tuple(readouts) if output_hidden_states else None,
        )


class OuroForCausalLM(OuroPreTrainedModel):
    # Tied only when config.tie_word_embeddings is True (never in the released Ouro).
    _tied_weights_keys = {"lm_head.weight": "model.embed_tokens.weight"}

    def __init__(self, config: OuroConfig):
        super().__init__(config)
        self.model = OuroModel(config)
        self.lm_head = nn.Linear(config.hidden_size, config.vocab_size, bias=False)
        self.boundary = "norm"  # runtime choice used by forward(); not a parameter, not saved
        self.post_init()

    def get_output_embeddings(self) -> nn.Module:
        return self.lm_head

    def set_boundary(self, boundary: str) -> OuroForCausalLM:
        """The "surgery": choose the loop boundary forward() uses. Adds or removes no parameter."""
        if boundary not in BOUNDARIES:
            raise ValueError(f"boundary must be one of {BOUNDARIES}, got {boundary!r}")
        self.boundary = boundary
        return self

    def forward(
        self,
        input_ids: Tensor | None = None,
        attention_mask: Tensor | None = None,
        labels: Tensor | None = None,
        n_loops: int | None = None,
        boundary: str | None = None,
        inputs_embeds: Tensor | None = None,
        **kwargs,
    ) -> CausalLMOutput:
        """Logits (B, T, V) of the final step (n = total_ut_steps unless n_loops is given)."""
        out = self.model(input_ids, attention_mask, n_loops, boundary or self.boundary, inputs_embeds)
        logits = self.lm_head(out.last_hidden_state)
        loss = None
        if labels is not None:
            shift = logits[:, :-1].float().reshape(-1, logits.shape[-1])
            loss = F.cross_entropy(shift, labels[:, 1:].reshape(-1).to(logits.device), ignore_index=-100)
        return CausalLMOutput(loss=loss, logits=logits)

    def loop_forward(
        self,
        input_ids: Tensor | None = None,
        attention_mask: Tensor | None = None,
        n_loops: int | None = None,
        boundary: str = "norm",
        inputs_embeds: Tensor | None = None,
    ) -> OuroLoopOutput:
        """One forward of n loops; every step read out at each row's last real position. The released exit step
        is computed from every position's gate at once, on the model's device, as the released forward does."""
        ref = input_ids if input_ids is not None else inputs_embeds[..., 0]
        B, T = ref.shape
        if attention_mask is None:
            last = torch.full((B,), T - 1, device=ref.device)
        else:  # index of the last real token (T - 1 for left padding)
            last = T - 1 - attention_mask.long().flip(-1).argmax(-1).to(ref.device)
        rows = torch.arange(B, device=ref.device)
        gate = self.model.early_exit_gate
        logits, pre_n, post_n, lambdas, native = [], [], [], [], []
        steps = self.model.iter_steps(input_ids, attention_mask, n_loops, boundary, inputs_embeds)
        for pre, state, readout in steps:
            r = readout[rows, last]
            logits.append(self.lm_head(r).float())
            pre_n.append(pre[rows, last].float().norm(dim=-1))
            post_n.append(state[rows, last].float().norm(dim=-1))
            g = F.linear(r.float(), gate.weight.float(), gate.bias.float()).squeeze(-1)
            lambdas.append(torch.sigmoid(g))
            native.append(torch.sigmoid(gate(readout).squeeze(-1)))  # (B, T): every position, as released
        lam, native = torch.stack(lambdas), torch.stack(native)
        config = self.config
        released = released_exit_steps(native, config.early_exit_threshold, getattr(config, "early_exit_step", None))
        return OuroLoopOutput(
            logits=torch.stack(logits),
            norm_pre=torch.stack(pre_n),
            norm_post=torch.stack(post_n),
            exit_probs=exit_distribution(lam),
            gate_lambdas=lam,
            gate_lambdas_native=native[:, rows, last],
            released_steps=released[:, rows, last],
        )


def released_exit_steps(lam: Tensor, threshold: float | None, exit_at_step: int | None = None) -> Tensor:
    """The step (1-based) the released forward reads, for every loop count k = 1..n: lam (n, *P), the exit
    gate's probabilities in the model's dtype on its device (P: the positions, (B, T) in a forward) ->
    (n, *P) long, row k - 1 for a forward of k loop steps.

    The released rule, with the same tensor operations in lam's dtype on lam's device: the exit pdf of k
    steps is p_t = lam_t * R_{t-1} for t < k and p_k = R_{k-1}, with R_0 = 1 and R_t = R_{t-1} * (1 - lam_t),
    each rounded to lam's dtype; the step read is the first whose `torch.cumsum` reaches `threshold`
    (compared in lam's dtype: in bf16 a threshold 0.997 is 0.99609375), else step k. `exit_at_step` (config
    early_exit_step, 0-based) takes precedence when 0 <= exit_at_step < k; a threshold of None reads step k.
    How `cumsum` accumulates depends on the device (the CPU in float64 for float32 and in float32 for bf16,
    rounding only its outputs; CUDA by a parallel scan in the dtype itself, a lone row by another kernel), so the
    step read does too, as the released one does: pass lam with the released forward's shape and device.
    """
    n = lam.shape[0]
    out = torch.empty(lam.shape, dtype=torch.long, device=lam.device)
    for k in range(1, n + 1):
        if exit_at_step is not None and 0 <= exit_at_step < k:
            out[k - 1] = exit_at_step + 1
            continue
        if threshold is None:
            out[k - 1] = k
            continue
        terms, survive = [], torch.ones_like(lam[0])
        for t in range(k - 1):
            terms.append(lam[t] * survive)
            survive = survive * (1.0 - lam[t])
        terms.append(survive)  # the last step takes the remaining mass
        reached = torch.cumsum(torch.stack(terms, dim=-1), dim=-1) >= threshold  # (*P, k)
        first = torch.argmax(reached.float(), dim=-1)  # the first step reaching it
        first[~reached.any(dim=-1)] = k - 1
        out[k - 1] = first + 1
    return out


def exit_distribution(lam: Tensor) -> Tensor:
    """p_t = lam_t * prod_{j<t}(1 - lam_j) for t < n; the last step takes the remaining mass."""
    lam = lam.float()
    survive = torch.cumprod(1.0 - lam, dim=0)  # survive[t] = prod_{j<=t}(1 - lam_j)
    before = torch.cat([torch.ones_like(lam[:1]), survive[:-1]])
    probs = lam * before
    probs[-1] = before[-1]
    return probs


AutoConfig.register("ouro", OuroConfig, exist_ok=True)
AutoModel.register(OuroConfig, OuroModel, exist_ok=True)
AutoModelForCausalLM.register(OuroConfig, OuroForCausalLM, exist_ok=True)
