"""The decoder the agent trains, built from a core ModelSpec.

It is deliberately plain PyTorch so that what autograd saves and what
FlopCounterMode counts are what the core's accounting must match:

- ``gpt`` blocks: LayerNorm, GELU (tanh) MLP, learned positions, biases per
  ``spec.bias``, dropout on the embedding sum, the attention probabilities and
  both residual branches (GPT-2's placement).
- ``llama`` blocks: RMSNorm, SwiGLU MLP, rotary positions, no dropout.
- mixture-of-experts blocks (``spec.is_moe``, past ``dense_layers``): a
  router, top-k over fp32 softmax probabilities, and each expert a SwiGLU MLP
  over the tokens routed to it, dropless, as transformers' eager Mixtral and
  Qwen-MoE blocks run (``Experts``).
- attention ``flash``: ``F.scaled_dot_product_attention`` (causal, grouped
  key/value heads passed as they are); ``standard``: an explicit
  softmax(QK^T / sqrt(d)) V that materialises the s x s scores, key/value heads
  repeated to the query heads first.
- q, k and v from three linears, or under the torchtitan stack from one
  (``FusedQKV``, torchtitan's ``wqkv``), initialised to the same weights.
- loss: cross-entropy over the vocabulary on fp32 logits.
"""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F
from torch import nn

from headroom.agent.recompute import apply_blocks, checkpointed
from headroom.core.specs.model import ModelSpec
from headroom.core.specs.recompute import RecomputePolicy, parse_policy
from headroom.core.specs.stack import get_stack

ATTENTION_KINDS = ("flash", "standard")


def rotary_tables(seq_len: int, head_dim: int, device: torch.device, base: float = 10000.0) -> tuple[torch.Tensor, torch.Tensor]:
    """cos and sin of shape (s, head_dim) for rotate-half RoPE."""
    inv_freq = 1.0 / base ** (torch.arange(0, head_dim, 2, device=device, dtype=torch.float32) / head_dim)
    angles = torch.outer(torch.arange(seq_len, device=device, dtype=torch.float32), inv_freq)
    angles = torch.cat((angles, angles), dim=-1)
    return angles.cos(), angles.sin()


def apply_rotary(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """Rotate-half RoPE over the first ``cos.shape[-1]`` dimensions of each head; the rest pass (GPT-NeoX)."""
    width = cos.shape[-1]
    if width < x.shape[-1]:
        return torch.cat((apply_rotary(x[..., :width], cos, sin), x[..., width:]), dim=-1)
    half = x.shape[-1] // 2
    rotated = torch.cat((-x[..., half:], x[..., :half]), dim=-1)
    return x * cos.to(x.dtype) + rotated * sin.to(x.dtype)


def split_qkv(y: torch.Tensor, per_group: int, head_dim: int) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """q, k and v of a fused projection's output ``y`` (b, s, kv groups x (per_group + 2) x head_dim), each
    (b, s, heads, head_dim) and contiguous: a function of the output, so a float8 linear swapped in for the
    projection (headroom.agent.float8) splits the same way."""
    b, s, _ = y.shape
    groups = y.view(b, s, -1, per_group + 2, head_dim)
    q, k, v = (t.reshape(b, s, -1, head_dim).contiguous() for t in groups.split([per_group, 1, 1], dim=-2))
    return q, k, v


class FusedQKV(nn.Linear):
    """torchtitan's ``wqkv`` (``FusedQKVLinear``, torchtitan/models/common/attention.py): q, k and v as one
    linear whose rows run kv group by kv group (the group's query heads, then its key head and its value head),
    so a column-parallel shard holds whole groups; its output is split and each part copied contiguous."""

    def __init__(self, hidden: int, n_heads: int, n_kv_heads: int, head_dim: int, bias: bool) -> None:
        super().__init__(hidden, (n_heads + 2 * n_kv_heads) * head_dim, bias=bias)
        self.per_group, self.head_dim = n_heads // n_kv_heads, head_dim

    def normal_as_three(self, std: float) -> None:
        """Draw q's, k's and v's weights one after the other, as three separate projections draw theirs."""
        kv = self.out_features // (self.per_group + 2)
        self.load(*(torch.empty(n, self.in_features).normal_(std=std) for n in (kv * self.per_group, kv, kv)))

    @torch.no_grad()
    def load(self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, part: str = "weight") -> None:
        """Take the ``part`` (weight or bias) of three separate q, k and v projections, rows in head order."""
        groups = k.shape[0] // self.head_dim
        getattr(self, part).copy_(torch.cat([t.reshape(groups, -1, *t.shape[1:]) for t in (q, k, v)], dim=1)
                                  .reshape(-1, *q.shape[1:]))


class Attention(nn.Module):
    def __init__(self, spec: ModelSpec, attention: str, dropout: float, checkpoint_core: bool = False,
                 fused_qkv: bool = False) -> None:
        super().__init__()
        if attention not in ATTENTION_KINDS:
            raise ValueError(f"attention {attention!r} is not one of {ATTENTION_KINDS}")
        h, q, kv = spec.hidden, spec.q_dim, spec.kv_dim
        qkv_bias = spec.bias in ("qkv", "all")
        if fused_qkv:
            self.qkv_proj = FusedQKV(h, spec.n_heads, spec.n_kv_heads, spec.head_dim, qkv_bias)
        else:
            self.q_proj = nn.Linear(h, q, bias=qkv_bias)
            self.k_proj = nn.Linear(h, kv, bias=qkv_bias)
            self.v_proj = nn.Linear(h, kv, bias=qkv_bias)
        self.o_proj = nn.Linear(q, h, bias=spec.bias == "all")
        # Qwen3 and Gemma 3 normalise each head of q and k (HF's Qwen3Attention: q_norm, k_norm).
        self.q_norm = nn.RMSNorm(spec.head_dim, eps=1e-6) if spec.qk_norm else None
        self.k_norm = nn.RMSNorm(spec.head_dim, eps=1e-6) if spec.qk_norm else None
        self.n_heads, self.n_kv_heads, self.head_dim = spec.n_heads, spec.n_kv_heads, spec.head_dim
        self.rotary_dim = spec.rotary_dim if spec.rotary else 0
        self.attention = attention
        self.dropout = dropout
        self.checkpoint_core = checkpoint_core

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        b, s, _ = x.shape
        if hasattr(self, "qkv_proj"):
            q, k, v = split_qkv(self.qkv_proj(x), self.n_heads // self.n_kv_heads, self.head_dim)
        else:
            q = self.q_proj(x).view(b, s, self.n_heads, self.head_dim)
            k = self.k_proj(x).view(b, s, self.n_kv_heads, self.head_dim)
            v = self.v_proj(x).view(b, s, self.n_kv_heads, self.head_dim)
        if self.q_norm is not None:
            q, k = self.q_norm(q), self.k_norm(k)
        q, k, v = q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2)
        if self.rotary_dim:
            cos, sin = rotary_tables(s, self.rotary_dim, x.device)
            q, k = apply_rotary(q, cos, sin), apply_rotary(k, cos, sin)
        if self.checkpoint_core and torch.is_grad_enabled():
            y = checkpointed(self.core, q, k, v)
        else:
            y = self.core(q, k, v)
        return self.o_proj(y.transpose(1, 2).reshape(b, s, -1))

    def core(self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
        """softmax(QK^T / sqrt(d)) V, causal, with attention dropout in training."""
        p = self.dropout if self.training else 0.0
        if self.attention == "flash":
            return F.scaled_dot_product_attention(q, k, v, dropout_p=p, is_causal=True, enable_gqa=self.n_kv_heads != self.n_heads)
        return self.standard_attention(q, k, v, p)

    def standard_attention(self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, p: float) -> torch.Tensor:
        groups = self.n_heads // self.n_kv_heads
        if groups > 1:
            k, v = k.repeat_interleave(groups, dim=1), v.repeat_interleave(groups, dim=1)
        s = q.shape[-2]
        scores = (q @ k.transpose(-2, -1)) * (1.0 / math.sqrt(self.head_dim))
        causal = torch.ones(s, s, dtype=torch.bool, device=q.device).tril()
        scores = scores.masked_fill(~causal, float("-inf"))
        probs = F.dropout(F.softmax(scores, dim=-1), p=p)
        return probs @ v


class LatentAttention(Attention):
    """Multi-head latent attention, as transformers' DeepseekV3Attention runs it (rotate-half RoPE).

    q comes up from its latent (q_a, an RMSNorm, q_b) or straight from x; kv_a projects x to the key/value
    latent and one rotary key shared by every head, split apart; the normalised latent's kv_b gives each
    head's positionless key and its value, split apart. Rotary turns the last rope_head_size dimensions of
    q and of the shared key; q and k are those parts concatenated back, head_size wide, and v is
    v_head_size wide.
    """

    def __init__(self, spec: ModelSpec, attention: str, dropout: float, checkpoint_core: bool = False) -> None:
        nn.Module.__init__(self)
        if attention not in ATTENTION_KINDS:
            raise ValueError(f"attention {attention!r} is not one of {ATTENTION_KINDS}")
        h, a, rq, rkv = spec.hidden, spec.n_heads, spec.q_lora_rank, spec.kv_lora_rank
        self.dqk, self.dr, self.dv = spec.head_dim, spec.rope_head_size, spec.v_head_size
        if rq:
            self.q_a_proj = nn.Linear(h, rq, bias=False)
            self.q_a_norm = nn.RMSNorm(rq, eps=1e-6)
            self.q_b_proj = nn.Linear(rq, a * self.dqk, bias=False)
        else:
            self.q_proj = nn.Linear(h, a * self.dqk, bias=False)
        self.kv_a_proj = nn.Linear(h, rkv + self.dr, bias=False)
        self.kv_a_norm = nn.RMSNorm(rkv, eps=1e-6)
        self.kv_b_proj = nn.Linear(rkv, a * (self.dqk - self.dr + self.dv), bias=False)
        self.o_proj = nn.Linear(a * self.dv, h, bias=False)
        self.rank = rkv
        self.n_heads = self.n_kv_heads = a
        self.head_dim = self.dqk
        self.attention, self.dropout, self.checkpoint_core = attention, dropout, checkpoint_core

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        b, s, _ = x.shape
        a, dn, dr = self.n_heads, self.dqk - self.dr, self.dr
        q = self.q_b_proj(self.q_a_norm(self.q_a_proj(x))) if hasattr(self, "q_a_proj") else self.q_proj(x)
        q_pass, q_rot = q.view(b, s, a, self.dqk).transpose(1, 2).split([dn, dr], dim=-1)
        latent, k_rot = self.kv_a_proj(x).split([self.rank, dr], dim=-1)
        kv = self.kv_b_proj(self.kv_a_norm(latent)).view(b, s, a, dn + self.dv).transpose(1, 2)
        k_pass, v = kv.split([dn, self.dv], dim=-1)
        cos, sin = rotary_tables(s, dr, x.device)
        q_rot, k_rot = apply_rotary(q_rot, cos, sin), apply_rotary(k_rot.view(b, 1, s, dr), cos, sin)
        q = torch.cat((q_pass, q_rot), dim=-1)
        k = torch.cat((k_pass, k_rot.expand(b, a, s, dr)), dim=-1)
        if self.checkpoint_core and torch.is_grad_enabled():
            y = checkpointed(self.core, q, k, v)
        else:
            y = self.core(q, k, v)
        return self.o_proj(y.transpose(1, 2).reshape(b, s, -1))


class MLP(nn.Module):
    def __init__(self, spec: ModelSpec, width: int | None = None) -> None:
        """GELU or SwiGLU per the block; ``width``: the inner width where it is not ffn_hidden (an expert)."""
        super().__init__()
        h, f, bias = spec.hidden, width or spec.ffn_hidden, spec.bias == "all"
        self.swiglu = spec.block == "llama"
        if self.swiglu:
            self.gate_proj = nn.Linear(h, f, bias=bias)
        self.up_proj = nn.Linear(h, f, bias=bias)
        self.down_proj = nn.Linear(f, h, bias=bias)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if self.swiglu:
            return self.down_proj(F.silu(self.gate_proj(x)) * self.up_proj(x))
        return self.down_proj(F.gelu(self.up_proj(x), approximate="tanh"))


class Experts(nn.Module):
    """A mixture-of-experts MLP, dropless as transformers' eager Mixtral and Qwen-MoE blocks run it, or at a
    capacity factor as Megatron-LM pads it.

    The router's logits give fp32 softmax probabilities; each token takes its top k (their weights
    renormalised to sum to one with ``normalize_expert_weights``). Each expert, a SwiGLU MLP, runs on the
    tokens routed to it, gathered by index, its output scaled by their routing weights and added back at
    their rows. Every expert runs, on no rows if none chose it, so what autograd keeps depends on the
    t x k routed rows and not on how the router spread them. At a capacity factor (``spec.capacity_factor``)
    each expert keeps the first ``spec.expert_capacity(t)`` tokens routed to it and drops the rest, and its
    rows are padded to that many with a spare zero token of weight zero, whose output lands on a spare row:
    every expert runs on exactly its capacity. A shared expert (and its sigmoid gate) runs on every token
    after the routed ones.
    """

    def __init__(self, spec: ModelSpec) -> None:
        super().__init__()
        h = spec.hidden
        self.router = nn.Linear(h, spec.n_experts, bias=False)
        self.experts = nn.ModuleList(MLP(spec, spec.expert_ffn) for _ in range(spec.n_experts))
        fs = spec.shared_expert_ffn_hidden
        self.shared = MLP(spec, fs) if fs else None
        self.shared_gate = nn.Linear(h, 1, bias=False) if spec.shared_expert_gate else None
        self.top_k, self.normalize = spec.experts_per_token, spec.normalize_expert_weights
        self.sigmoid = spec.expert_scoring == "sigmoid"
        self.spec = spec

    def route(self, flat: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """Each of the (t, h) tokens' top-k experts: their fp32 weights and their indices, (t, k) each."""
        logits = self.router(flat)
        if self.sigmoid:
            # DeepSeek-V3: sigmoid scores; the choice (there, of groups first, with a bias) keeps nothing for
            # backward, and the weights are the chosen scores, gathered.
            scores = torch.sigmoid(logits.float())
            with torch.no_grad():
                chosen = scores.topk(self.top_k, dim=-1).indices
            weights = scores.gather(1, chosen)
        else:
            weights, chosen = F.softmax(logits, dim=-1, dtype=torch.float32).topk(self.top_k, dim=-1)
        if self.normalize:
            weights = weights / weights.sum(dim=-1, keepdim=True)
        return weights, chosen

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        flat = x.reshape(-1, x.shape[-1])
        weights, chosen = self.route(flat)
        t, rows = flat.shape[0], flat
        capacity = self.spec.expert_capacity(t) if self.spec.capacity_factor else None
        if capacity is not None:  # a spare token t: zeros in, weight zero, its row dropped at the end
            rows = torch.cat([flat, flat.new_zeros(1, flat.shape[1])])
            weights = torch.cat([weights, weights.new_zeros(1, self.top_k)])
        out = torch.zeros_like(rows)
        for e, expert in enumerate(self.experts):
            token, slot = torch.where(chosen == e)
            if capacity is not None:
                token, slot = token[:capacity], slot[:capacity]
                token = F.pad(token, (0, capacity - token.numel()), value=t)
                slot = F.pad(slot, (0, capacity - slot.numel()))
            y = expert(rows[token]) * weights[token, slot].unsqueeze(-1)
            out = out.index_add(0, token, y.to(out.dtype))
        return self.with_shared(out[:t], flat).view(x.shape)

    def with_shared(self, routed: torch.Tensor, flat: torch.Tensor) -> torch.Tensor:
        """The routed experts' output plus the shared expert's on every token (behind its sigmoid gate), if any."""
        if self.shared is None:
            return routed
        shared = self.shared(flat)
        if self.shared_gate is not None:
            shared = shared * torch.sigmoid(self.shared_gate(flat))
        return routed + shared


def _norm(spec: ModelSpec) -> nn.Module:
    return nn.LayerNorm(spec.hidden) if spec.block == "gpt" else nn.RMSNorm(spec.hidden, eps=1e-5)


class Block(nn.Module):
    """Pre-norm residual block: x + drop(attn(norm(x))), then x + drop(mlp(norm(x))).

    With ``post_norms`` (Gemma 2 and 3) the attention's and the MLP's outputs are normalised again before
    dropout and the residual add: x + drop(norm(attn(norm(x)))). With ``parallel_residual`` (GPT-NeoX)
    both read the block's input: x + drop(attn(norm(x))) + drop(mlp(norm(x))).
    """

    def __init__(self, spec: ModelSpec, attention: str, dropout: float, checkpoint_core: bool = False,
                 experts: bool = False, fused_qkv: bool = False) -> None:
        super().__init__()
        self.attn_norm = _norm(spec)
        self.attn = LatentAttention(spec, attention, dropout, checkpoint_core) if spec.is_mla else \
            Attention(spec, attention, dropout, checkpoint_core, fused_qkv)
        self.attn_post_norm = _norm(spec) if spec.post_norms else nn.Identity()
        self.mlp_norm = _norm(spec)
        self.mlp = Experts(spec) if experts else MLP(spec)
        self.mlp_post_norm = _norm(spec) if spec.post_norms else nn.Identity()
        self.dropout = dropout
        self.parallel_residual = spec.parallel_residual

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        attn = F.dropout(self.attn_post_norm(self.attn(self.attn_norm(x))), self.dropout, self.training)
        if self.parallel_residual:
            return x + attn + F.dropout(self.mlp_post_norm(self.mlp(self.mlp_norm(x))), self.dropout, self.training)
        x = x + attn
        return x + F.dropout(self.mlp_post_norm(self.mlp(self.mlp_norm(x))), self.dropout, self.training)


class Decoder(nn.Module):
    """Token ids (b, s) in; logits (b, s, V) out, or the mean cross-entropy given targets."""

    def __init__(
        self, spec: ModelSpec, attention: str = "flash", dropout: float = 0.0,
        recompute: RecomputePolicy | str = "none", stack: str = "reference",
    ) -> None:
        super().__init__()
        if dropout and spec.block == "llama":
            raise ValueError(f"{spec.name}: llama blocks have no dropout")
        self.spec = spec
        self.recompute = parse_policy(recompute) if isinstance(recompute, str) else recompute
        self.stack = stack  # whose checkpointing applies the policy (headroom.agent.recompute)
        selective = self.recompute.recomputes_attention
        self.embed = nn.Embedding(spec.vocab_size, spec.hidden)
        self.positions = None if spec.rotary else nn.Embedding(spec.max_seq_len, spec.hidden)
        fused_qkv = get_stack(stack).fused_qkv
        self.blocks = nn.ModuleList(Block(spec, attention, dropout, selective, spec.is_moe_layer(i), fused_qkv)
                                    for i in range(spec.n_layers))
        self.final_norm = _norm(spec)
        self.lm_head = nn.Linear(spec.hidden, spec.vocab_size, bias=False)
        if spec.tied_embeddings:
            self.lm_head.weight = self.embed.weight
        self.dropout = dropout
        self.apply(self._init)

    @staticmethod
    def _init(module: nn.Module) -> None:
        if isinstance(module, FusedQKV):  # the reference decoder's q, k and v weights: the same model
            module.normal_as_three(std=0.02)
        elif isinstance(module, (nn.Linear, nn.Embedding)):
            nn.init.normal_(module.weight, std=0.02)
        if isinstance(module, nn.Linear) and module.bias is not None:
            nn.init.zeros_(module.bias)

    def embed_tokens(self, idx: torch.Tensor) -> torch.Tensor:
        return embed_tokens(self.embed, self.positions, idx, self.dropout, self.training)

    def forward(self, idx: torch.Tensor, targets: torch.Tensor | None = None) -> torch.Tensor:
        x = apply_blocks(self.blocks, self.embed_tokens(idx), self.recompute, self.stack)
        logits = self.lm_head(self.final_norm(x))
        if targets is None:
            return logits
        return token_loss(logits, targets)


def embed_tokens(embed: nn.Embedding, positions: nn.Embedding | None, idx: torch.Tensor, dropout: float,
                 training: bool) -> torch.Tensor:
    """Token embeddings, plus learned positions (gpt), then dropout in training."""
    x = embed(idx)
    if positions is not None:
        x = x + positions(torch.arange(idx.shape[1], device=idx.device))
    return F.dropout(x, dropout, training)


def token_loss(logits: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
    """The decoder's loss: mean cross-entropy over the vocabulary on fp32 logits."""
    return F.cross_entropy(logits.float().view(-1, logits.shape[-1]), targets.view(-1))
