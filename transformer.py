"""
GPT-style causal transformer for the wind tunnels (nanoGPT shape).

Design decisions:
- pre-norm residual blocks, GELU MLP, no dropout by default, N(0, 0.02) init with the
  residual projections scaled by 1/sqrt(2 n_layer) (GPT-2); `init torch` keeps PyTorch's own (the authors'
  production model, with `mlp_bias`: biases in the MLP alone);
- positions: learned absolute embeddings by default (the paper's models); `rotary`, `alibi`,
  `learned_alibi` (both) or `none` as options, since the HMM length-generalisation result
  (K = 30, 50 beyond the trained 20) depends on them, as do three options for longer sequences:
  `n_pos` (later positions share one learned row: Transformer), `log_scale` (Scalable-Softmax:
  CausalSelfAttention) and `window` (a Λ-shaped mask that keeps the header in view: attn_bias);
- inputs: token embeddings, or a linear read-in for real-valued features (regression);
- outputs: C answer logits. Where the answers are tokens (bijection values, recall values),
  `tie_head` reads them off the embedding rows of those tokens (the paper's tied head), `head_vocab` off every
  token's (the authors' 40-way head: the loss spans the vocabulary, the metrics read the answers' slice);
  otherwise a separate linear head (HMM states); a Gaussian head gives (mean, log-variance);
- the fast path is `scaled_dot_product_attention`; when internals are requested or a head mask
  is given, attention is computed explicitly so its weights can be returned and masked.

Diagnostics (silencing heads, skipping layers, the internals a probe reads): Transformer.forward.
"""
from dataclasses import dataclass
import math

import torch
import torch.nn as nn
import torch.nn.functional as F
from einops import rearrange


@dataclass
class TransformerConfig:
    # I/O, filled in from the task
    vocab_size: int = 0  # input tokens; 0 means real-valued inputs through a linear read-in
    n_features: int = 0  # width of real-valued inputs
    n_classes: int = 2  # answer classes C (or 2 = mean, log-variance for the Gaussian head)
    answer_offset: int = None  # token id of answer class 0 when answers are tokens
    gaussian: bool = False  # real-valued prediction: Gaussian head
    block_size: int = 128  # longest sequence the learned position table covers
    # architecture
    n_layer: int = 4  # transformer blocks
    n_head: int = 4  # attention heads per block
    d_model: int = 128  # residual width
    mlp_ratio: int = 4  # MLP hidden width = mlp_ratio * d_model
    pos: str = "learned"  # position encoding: learned | rotary | alibi | learned_alibi (both) | none
    n_pos: int = 0  # learned rows: positions >= n_pos share the last row (0 = block_size, every position its own)
    log_scale: bool = False  # each head's logits times s_h log n, n the keys in view, s_h learned (Scalable-Softmax)
    window: int = 0  # > 0: keys within the last `window` positions, and the header (< n_pos - 1) with no ALiBi penalty
    tie_head: bool = True  # answer logits from the answer tokens' embeddings, where answers are tokens
    head_vocab: bool = False  # logits over the whole input vocabulary (the authors' 40-way head), not the C answers
    norm: str = "layernorm"  # layernorm | rmsnorm
    bias: bool = True  # biases in linear layers and norms
    mlp_bias: bool = False  # biases in the MLP's two linear maps even with bias off (the authors' production model)
    init: str = "gpt2"  # gpt2: N(0, 0.02), residual projections / sqrt(2 n_layer) | torch: PyTorch's own defaults
    dropout: float = 0.0  # the paper's models use none


POS = ("learned", "rotary", "alibi", "learned_alibi", "none")
NORMS = ("layernorm", "rmsnorm")
INITS = ("gpt2", "torch")


def make_norm(config):
    if config.norm == "rmsnorm":
        return nn.RMSNorm(config.d_model, eps=1e-6)
    return nn.LayerNorm(config.d_model, bias=config.bias)


def attn_bias(config, T, device):
    """(H, T, T) additive attention bias with -inf on the future, or None for plain causal attention.
    ALiBi: -m_h * (i - j) with slopes m_h = 2^(-8h/H), so each head starts out attending to the recent
    past, at its own range (Press et al. 2022). `window`: keys `window` or more positions back are
    masked, except the header's (positions < n_pos - 1: with `n_pos`, those with learned rows of their own),
    which every query sees with no distance penalty, in training as in evaluation (the Λ-shaped mask of
    LM-Infinite, Han et al. 2024, arXiv 2308.16137). With shared rows and ALiBi a query's output then depends on
    the header and the last n_layer * (window - 1) positions only, at the same distances wherever it stands: no
    head spreads thinner, and the header comes no further away, as the sequence grows. The HMM filter forgets
    its start within ~8 observations (16 tokens), so the window costs it nothing."""
    c = config
    alibi = c.pos.endswith("alibi")
    if not alibi and not c.window:
        return None
    slopes = 2.0 ** (-8.0 * torch.arange(1, c.n_head + 1, device=device) / c.n_head)
    slopes = slopes if alibi else torch.zeros_like(slopes)
    dist = (torch.arange(T, device=device)[:, None] - torch.arange(T, device=device)[None, :]).float()
    bias = -slopes[:, None, None] * dist
    if c.window:
        header = (torch.arange(T, device=device) < c.n_pos - 1)[None, :]
        bias = bias.masked_fill(header, 0.0).masked_fill(~header & (dist >= c.window), float("-inf"))
    return bias.masked_fill(dist < 0, float("-inf"))


def rotary(x, pos_cos, pos_sin):
    """Rotate pairs (x1, x2) of the head dimension by position-dependent angles (RoPE)."""
    x1, x2 = x.chunk(2, dim=-1)
    return torch.cat([x1 * pos_cos - x2 * pos_sin, x2 * pos_cos + x1 * pos_sin], -1)


class CausalSelfAttention(nn.Module):
    """Multi-head causal attention. `log_scale` (Scalable-Softmax, Nakanishi 2025, arXiv 2501.19399) multiplies
    each head's logits by s_h log n, n the keys in view, s_h learned: with plain softmax a head's weight on a few
    keys (the HMM's header) dilutes as the keys after them grow in number, and a model trained at one length
    loses its focus at a longer one."""

    def __init__(self, config):
        super().__init__()
        self.n_head = config.n_head
        self.c_attn = nn.Linear(config.d_model, 3 * config.d_model, bias=config.bias)
        self.c_proj = nn.Linear(config.d_model, config.d_model, bias=config.bias)
        self.dropout = config.dropout
        # s_h: log n is 4 to 4.5 at the HMM's trained lengths, so 1/4 starts every head near plain softmax
        self.log_scale = nn.Parameter(torch.full((config.n_head,), 0.25)) if config.log_scale else None

    def forward(self, x, rope=None, head_mask=None, record=None, bias=None):
        B, T, C = x.shape
        q, k, v = [rearrange(t, "b t (h d) -> b h t d", h=self.n_head) for t in self.c_attn(x).split(C, 2)]
        if rope is not None:
            q, k = rotary(q, *rope), rotary(k, *rope)
        if self.log_scale is not None:  # n keys in view: i + 1 for query i, fewer under a window
            n = torch.arange(1, T + 1, device=x.device) if bias is None else bias[0].isfinite().sum(-1)
            q = q * (self.log_scale[:, None, None] * n.float().log()[:, None]).to(q.dtype)
        drop = self.dropout if self.training else 0.0
        if head_mask is None and record is None:
            if bias is None:
                y = F.scaled_dot_product_attention(q, k, v, dropout_p=drop, is_causal=True)  # (B, H, T, d)
            else:  # the bias carries the causal mask; 4-D (1, H, T, T), the shape cuDNN's attention takes
                y = F.scaled_dot_product_attention(q, k, v, attn_mask=bias[None].to(q.dtype), dropout_p=drop)
        else:
            att = (q @ k.transpose(-2, -1)) / math.sqrt(k.shape[-1])  # (B, H, T, T)
            if bias is None:
                bias = torch.zeros(T, T, device=x.device).masked_fill(
                    ~torch.ones(T, T, dtype=torch.bool, device=x.device).tril(), float("-inf"))
            att = F.softmax(att + bias.to(att.dtype), dim=-1)
            if record is not None:
                record.update(q=q, k=k, v=v, att=att)
            if head_mask is not None:
                att = att * head_mask.view(1, -1, 1, 1).to(att.dtype)
            y = F.dropout(att, drop, self.training) @ v
        y = rearrange(y, "b h t d -> b t (h d)")
        return F.dropout(self.c_proj(y), drop, self.training)


class FeedForward(nn.Module):

    def __init__(self, config):
        super().__init__()
        bias = config.bias or config.mlp_bias
        self.c_fc = nn.Linear(config.d_model, config.mlp_ratio * config.d_model, bias=bias)
        self.c_proj = nn.Linear(config.mlp_ratio * config.d_model, config.d_model, bias=bias)
        self.dropout = nn.Dropout(config.dropout)

    def forward(self, x):
        return self.dropout(self.c_proj(F.gelu(self.c_fc(x))))


class Block(nn.Module):

    def __init__(self, config):
        super().__init__()
        self.ln_1, self.attn = make_norm(config), CausalSelfAttention(config)
        self.ln_2, self.mlp = make_norm(config), FeedForward(config)

    def forward(self, x, rope=None, head_mask=None, record=None, bias=None, skip_mlp=False):
        x = x + self.attn(self.ln_1(x), rope, head_mask, record, bias)
        return x if skip_mlp else x + self.mlp(self.ln_2(x))


class Transformer(nn.Module):
    """Token (or feature) embedding, position embedding, n_layer blocks, final norm, answer head. With `n_pos`
    the learned table has n_pos rows and every position from n_pos - 1 on shares the last one, so that a longer
    sequence than any trained meets no untrained row."""

    def __init__(self, config):
        super().__init__()
        c = config
        if c.pos not in POS or c.norm not in NORMS or c.init not in INITS:
            raise ValueError(f"transformer: pos must be one of {POS}, norm one of {NORMS} and init one of {INITS}, "
                             f"got {c.pos!r}, {c.norm!r}, {c.init!r}")
        if min(c.n_layer, c.n_head, c.d_model, c.block_size) < 1 or c.mlp_ratio < 0:  # before dividing by n_head
            raise ValueError("transformer: n_layer, n_head, d_model and block_size must be >= 1, mlp_ratio >= 0")
        if c.d_model % c.n_head or (c.pos == "rotary" and (c.d_model // c.n_head) % 2):
            raise ValueError(f"transformer: d_model={c.d_model} must split into n_head={c.n_head} heads"
                             f"{' of even size (rotary)' if c.pos == 'rotary' else ''}")
        if not 0 <= c.dropout < 1:  # NaN too
            raise ValueError(f"transformer: dropout must be in [0, 1), got {c.dropout}")
        for name in ("n_pos", "window"):
            if getattr(c, name) < 0:
                raise ValueError(f"transformer: {name} must be >= 0, got {getattr(c, name)}")
        if c.vocab_size < 1 and c.n_features < 1:
            raise ValueError("transformer: the input size must be >= 1 "
                             "(vocab_size for tokens or n_features for reals)")
        self.config = c
        self.tied = bool(c.tie_head and c.vocab_size and c.answer_offset is not None and not c.gaussian)
        if c.head_vocab and not (c.vocab_size and c.answer_offset is not None and not c.gaussian):
            raise ValueError("transformer: head_vocab needs a task whose answers are tokens (bijection, recall, hop)")
        if (self.tied or c.head_vocab) and not 0 <= c.answer_offset <= c.vocab_size - c.n_classes:
            raise ValueError(f"transformer: answer tokens {c.answer_offset}..{c.answer_offset + c.n_classes - 1} "
                             f"lie outside the vocabulary of {c.vocab_size}")
        # real-valued inputs enter through a linear read-in instead of a token table
        self.wte = nn.Embedding(c.vocab_size, c.d_model) if c.vocab_size else nn.Linear(c.n_features, c.d_model)
        self.wpe = nn.Embedding(c.n_pos or c.block_size, c.d_model) if c.pos.startswith("learned") else None
        self.blocks = nn.ModuleList([Block(c) for _ in range(c.n_layer)])
        self.ln_f = make_norm(c)
        n_out = 2 if c.gaussian else c.vocab_size if c.head_vocab else c.n_classes
        self.head = None if self.tied else nn.Linear(c.d_model, n_out, bias=c.bias)
        if c.init == "gpt2":  # else the layers keep PyTorch's: U(+-1/sqrt(fan_in)) for linear maps, N(0, 1) tables
            self.apply(self._init_weights)
            for name, p in self.named_parameters():
                if name.endswith("c_proj.weight"):
                    nn.init.normal_(p, mean=0.0, std=0.02 / math.sqrt(2 * c.n_layer))

    def _init_weights(self, module):
        if isinstance(module, (nn.Linear, nn.Embedding)):
            nn.init.normal_(module.weight, mean=0.0, std=0.02)
            if getattr(module, "bias", None) is not None:
                nn.init.zeros_(module.bias)

    def num_params(self):
        return sum(p.numel() for p in self.parameters())

    def rope(self, T, device):
        d = self.config.d_model // self.config.n_head
        inv_freq = 1.0 / (10000 ** (torch.arange(0, d, 2, device=device).float() / d))
        angles = torch.outer(torch.arange(T, device=device).float(), inv_freq)  # (T, d/2)
        return angles.cos(), angles.sin()

    def forward(self, x, head_mask=None, skip_layers=(), return_internals=False, skip_mlps=()):
        """x (B, T) tokens or (B, T, n_features) -> (B, T, C) logits, or (B, T, 2) = (mean, log-variance).
        Diagnostics: `head_mask` (n_layer, n_head) multiplies each head's attention weights (0 silences a head);
        `skip_layers` bypasses whole blocks (output = input), `skip_mlps` their MLPs alone (the attention kept);
        with return_internals, also a dict whose `layers`
        hold, per layer, the block's input residual `x`, and `q, k, v` (B, H, T, d_head; q as it enters the
        logits, after rotary and log_scale) and `att` (B, H, T, T), and whose `final` is the normed output."""
        c = self.config
        B, T = x.shape[:2]
        if self.wpe is not None and not c.n_pos and T > c.block_size:
            raise ValueError(f"sequence length {T} exceeds the model's context block_size={c.block_size}")
        # on a GPU the embedding's own assert fires: a check there would make every step wait for the device
        if c.vocab_size and x.device.type == "cpu" and not torch.compiler.is_compiling() and x.numel():
            if not 0 <= x.min() <= x.max() < c.vocab_size:
                raise ValueError(f"token ids must lie in [0, {c.vocab_size}), got {x.min().item()}..{x.max().item()}")
        h = self.wte(x)  # (B, T, d_model)
        if self.wpe is not None:  # with n_pos, every position from n_pos - 1 on reads the same (trained) row
            h = h + self.wpe(torch.arange(T, device=h.device).clamp(max=self.wpe.num_embeddings - 1))
        rope = self.rope(T, h.device) if c.pos == "rotary" else None
        bias = attn_bias(c, T, h.device)
        layers = []
        for i, block in enumerate(self.blocks):
            record = {"x": h} if return_internals else None
            if i not in skip_layers:
                h = block(h, rope, None if head_mask is None else head_mask[i], record, bias, i in skip_mlps)
            layers.append(record)
        h = self.ln_f(h)
        # (B, T, C) logits (tied: against the C answer tokens' embeddings; head_vocab: (B, T, vocab_size), against
        # every token's), or (B, T, 2) = (mean, log-variance)
        if not self.tied:
            out = self.head(h)
        else:
            W = self.wte.weight if c.head_vocab else self.wte.weight[c.answer_offset:c.answer_offset + c.n_classes]
            out = h @ W.T
        return (out, dict(layers=layers, final=h)) if return_internals else out
