"""
Capacity-matched residual MLP baseline for the wind tunnels: no recurrence, no attention.

The paper's v1 control (arXiv 2512.22471 v1) is a residual MLP with LayerNorm at the transformer's
parameter count. How it saw the context is not stated in any source, so both readings are here:
- default, the flattened prefix: at position t the MLP sees the embeddings of all inputs <= t laid side
  by side in one vector, zero-padded to block_size slots, plus the current token and position. It sees
  everything at once but has no sequence machinery: each slot s has its own first-layer weights W_s,
  nothing is shared across positions, and no order or recurrence is built in. Causal: slots after t are 0;
- `per_position=True`: only the current token and position (the authors' later control): no better than
  the position-averaged predictor.

Design decisions:
- blocks: x + Linear(GELU(Linear(LayerNorm(x)))), hidden width mlp_ratio * d_model (1: 2 layers of d_model);
- the flattened first layer: W [e_0, ..., e_t, 0, ..., 0] = sum_{s<=t} W_s e_s, one batched product per
  slot and a cumulative sum over positions: memory (B, T, d_model) instead of the padded (B, T, block_size
  * d_flat) inputs (tests check the two agree). Prefix tokens are embedded at a narrow width d_flat,
  since the first layer has block_size * d_flat * d_model weights; slots past the training length have
  untrained weights, like a learned position table;
- inputs: token embeddings or a linear read-in for real-valued features (whose bias marks a filled slot);
  outputs: C logits, tied to the answer tokens' embeddings where answers are tokens, or (mean,
  log-variance); init N(0, 0.02) (GPT-2), the residual output projections scaled by 1/sqrt(2 n_layer).

`forward(x, skip_layers=(), return_internals=False)`; internals: per block its input residual `x`, and `final`.
"""
from dataclasses import dataclass
import math

import torch
import torch.nn as nn
import torch.nn.functional as F


@dataclass
class MLPConfig:
    # I/O, filled in from the task
    vocab_size: int = 0  # input tokens; 0 means real-valued inputs through a linear read-in
    n_features: int = 0  # width of real-valued inputs
    n_classes: int = 2  # answer classes C (or 2 = mean, log-variance for the Gaussian head)
    answer_offset: int = None  # token id of answer class 0 when answers are tokens
    gaussian: bool = False  # real-valued prediction: Gaussian head
    block_size: int = 128  # longest sequence: the flattened prefix is zero-padded to this many slots
    # architecture
    n_layer: int = 4  # residual blocks, each LayerNorm -> Linear -> GELU -> Linear (two layers)
    d_model: int = 128  # residual width
    mlp_ratio: int = 1  # hidden width inside a block = mlp_ratio * d_model
    d_flat: int = 16  # embedding width of each token in the flattened prefix
    per_position: bool = False  # see only the current token and position, not the prefix
    tie_head: bool = True  # answer logits from the answer tokens' embeddings, where answers are tokens


class Block(nn.Module):

    def __init__(self, config):
        super().__init__()
        d = config.d_model
        self.ln = nn.LayerNorm(d)
        self.c_fc = nn.Linear(d, config.mlp_ratio * d)
        self.c_proj = nn.Linear(config.mlp_ratio * d, d)

    def forward(self, x):
        return x + self.c_proj(F.gelu(self.c_fc(self.ln(x))))


class MLP(nn.Module):

    def __init__(self, config):
        super().__init__()
        c = config
        if min(c.n_layer, c.d_model, c.mlp_ratio, c.d_flat, c.block_size) < 1:
            raise ValueError("mlp: n_layer, d_model, mlp_ratio, d_flat and block_size must be >= 1")
        if c.vocab_size < 1 and c.n_features < 1:
            raise ValueError("mlp: the input size must be >= 1 (vocab_size for tokens or n_features for reals)")
        self.config = c
        self.tied = bool(c.tie_head and c.vocab_size and c.answer_offset is not None and not c.gaussian)
        if self.tied and not 0 <= c.answer_offset <= c.vocab_size - c.n_classes:
            raise ValueError(f"mlp: answer tokens {c.answer_offset}..{c.answer_offset + c.n_classes - 1} "
                             f"lie outside the vocabulary of {c.vocab_size}")
        embed = lambda d: nn.Embedding(c.vocab_size, d) if c.vocab_size else nn.Linear(c.n_features, d)
        self.wte = embed(c.d_model)  # the current token
        self.wpe = nn.Embedding(c.block_size, c.d_model)  # the current position
        if not c.per_position:
            self.wte_flat = embed(c.d_flat)  # each prefix token, narrow
            self.w_flat = nn.Parameter(torch.empty(c.block_size, c.d_flat, c.d_model))  # W_s, one per slot s
        self.blocks = nn.ModuleList([Block(c) for _ in range(c.n_layer)])
        self.ln_f = nn.LayerNorm(c.d_model)
        self.head = None if self.tied else nn.Linear(c.d_model, 2 if c.gaussian else c.n_classes)
        for m in self.modules():
            if isinstance(m, (nn.Linear, nn.Embedding)):
                nn.init.normal_(m.weight, std=0.02)
                if getattr(m, "bias", None) is not None:
                    nn.init.zeros_(m.bias)
        for block in self.blocks:
            nn.init.normal_(block.c_proj.weight, std=0.02 / math.sqrt(2 * c.n_layer))
        if not c.per_position:
            # a full prefix then adds up to about the scale of one embedding
            nn.init.normal_(self.w_flat, std=(c.block_size * c.d_flat) ** -0.5)

    def num_params(self):
        return sum(p.numel() for p in self.parameters())

    def forward(self, x, skip_layers=(), return_internals=False):
        """x: (B, T) tokens or (B, T, F) reals -> (B, T, C) logits, or (B, T, 2) = (mean, log-variance)."""
        c = self.config
        B, T = x.shape[:2]
        if T > c.block_size:
            raise ValueError(f"sequence length {T} exceeds the model's block_size={c.block_size}")
        # on a GPU the embedding's own assert fires: a check there would make every step wait for the device
        if c.vocab_size and x.device.type == "cpu" and not torch.compiler.is_compiling() and x.numel():
            if not 0 <= x.min() <= x.max() < c.vocab_size:
                raise ValueError(f"token ids must lie in [0, {c.vocab_size}), got {x.min().item()}..{x.max().item()}")
        h = self.wte(x) + self.wpe(torch.arange(T, device=x.device))  # (B, T, d_model)
        if not c.per_position:
            # W [e_0 .. e_t, 0 .. 0] = sum_{s<=t} W_s e_s: every slot's product, then a running sum
            # (in float32: under bf16 autocast a long sum would lose the early slots)
            per_slot = torch.einsum("btf,tfd->btd", self.wte_flat(x), self.w_flat[:T])  # (B, T, d_model)
            h = h + per_slot.cumsum(1, dtype=torch.promote_types(per_slot.dtype, torch.float32))
        layers = []
        for i, block in enumerate(self.blocks):
            layers.append({"x": h} if return_internals else None)
            if i not in skip_layers:
                h = block(h)
        h = self.ln_f(h)
        # (B, T, C) logits (tied: against the C answer tokens' embeddings), or (B, T, 2) = (mean, log-variance)
        out = h @ self.wte.weight[c.answer_offset:c.answer_offset + c.n_classes].T if self.tied else self.head(h)
        return (out, dict(layers=layers, final=h)) if return_internals else out
