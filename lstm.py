"""
LSTM baseline for the wind tunnels: embeddings, a stack of LSTM layers, a norm and a head.

The paper's v3 architecture comparison (arXiv 2512.22471 v3; the authors' code) uses an LSTM to show
what recurrence with a fixed-size state can and cannot do: belief *accumulation*, but not *transport*
(HMM filtering) nor random-access *binding* (recall).

Design decisions:
- the authors' model (their released code): token embeddings (+ learned absolute positions on the
  bijection, none on the HMM), `nn.LSTM(d, d, num_layers)` with dropout between layers, LayerNorm, and a
  head tied to the answer tokens' embeddings where answers are tokens (else a linear head);
- the stack is one single-layer `nn.LSTM` per layer rather than one multi-layer module: the same function
  and parameters (tests/test_baselines.py checks this), but each layer's input can be recorded and a layer
  bypassed (output = input), as for the other models' diagnostics;
- `residual=True` adds each layer's output to its input (not the authors' model; for deep stacks);
- inputs: token embeddings, or a linear read-in for real-valued features (regression); a Gaussian head
  gives (mean, log-variance);
- the LSTM layers run in float32 under bf16 autocast, as the Mamba scan does: the entropies are compared
  to 1e-3 bits;
- init: embeddings and heads N(0, 0.02) like the transformer (the tied head then starts near uniform);
  the LSTM weights and biases keep PyTorch's U(+-1/sqrt(d)), as in the authors' code.

Causal by construction: the recurrence runs forward in time. `forward(x, skip_layers=(),
return_internals=False)`; internals: per layer its input `x` (B, T, d_model), and `final`.
"""
from dataclasses import dataclass

import torch
import torch.nn as nn


@dataclass
class LSTMConfig:
    # I/O, filled in from the task
    vocab_size: int = 0  # input tokens; 0 means real-valued inputs through a linear read-in
    n_features: int = 0  # width of real-valued inputs
    n_classes: int = 2  # answer classes C (or 2 = mean, log-variance for the Gaussian head)
    answer_offset: int = None  # token id of answer class 0 when answers are tokens
    gaussian: bool = False  # real-valued prediction: Gaussian head
    block_size: int = 128  # longest sequence the learned position table covers (pos=learned only)
    # architecture
    n_layer: int = 2  # stacked LSTM layers
    d_model: int = 128  # embedding width = LSTM hidden size
    pos: str = "learned"  # position encoding: learned (authors' bijection LSTM) | none (authors' HMM LSTM)
    tie_head: bool = True  # answer logits from the answer tokens' embeddings, where answers are tokens
    residual: bool = False  # add each layer's output to its input (the authors' stack has none)
    dropout: float = 0.0  # dropout between LSTM layers (the authors' LSTMs use 0.1)


POS = ("learned", "none")


class LSTM(nn.Module):

    def __init__(self, config):
        super().__init__()
        c = config
        if c.pos not in POS:
            raise ValueError(f"lstm: pos must be one of {POS}, got {c.pos!r}")
        if min(c.n_layer, c.d_model, c.block_size) < 1 or not 0 <= c.dropout < 1:
            raise ValueError("lstm: n_layer, d_model and block_size must be >= 1 and dropout in [0, 1)")
        if c.vocab_size < 1 and c.n_features < 1:
            raise ValueError("lstm: the input size must be >= 1 (vocab_size for tokens or n_features for reals)")
        self.config = c
        self.tied = bool(c.tie_head and c.vocab_size and c.answer_offset is not None and not c.gaussian)
        if self.tied and not 0 <= c.answer_offset <= c.vocab_size - c.n_classes:
            raise ValueError(f"lstm: answer tokens {c.answer_offset}..{c.answer_offset + c.n_classes - 1} "
                             f"lie outside the vocabulary of {c.vocab_size}")
        # real-valued inputs enter through a linear read-in instead of a token table
        self.wte = nn.Embedding(c.vocab_size, c.d_model) if c.vocab_size else nn.Linear(c.n_features, c.d_model)
        self.wpe = nn.Embedding(c.block_size, c.d_model) if c.pos == "learned" else None
        self.layers = nn.ModuleList([nn.LSTM(c.d_model, c.d_model, batch_first=True) for _ in range(c.n_layer)])
        self.drop = nn.Dropout(c.dropout)
        self.ln_f = nn.LayerNorm(c.d_model)
        self.head = None if self.tied else nn.Linear(c.d_model, 2 if c.gaussian else c.n_classes)
        with torch.no_grad():
            for m in (self.wte, self.wpe, self.head):
                if m is not None:
                    nn.init.normal_(m.weight, std=0.02)
                    if getattr(m, "bias", None) is not None:
                        nn.init.zeros_(m.bias)

    def num_params(self):
        return sum(p.numel() for p in self.parameters())

    def forward(self, x, skip_layers=(), return_internals=False):
        """x: (B, T) tokens or (B, T, F) reals -> (B, T, C) logits, or (B, T, 2) = (mean, log-variance)."""
        c = self.config
        B, T = x.shape[:2]
        if c.pos == "learned" and T > c.block_size:
            raise ValueError(f"sequence length {T} exceeds the model's position table block_size={c.block_size}")
        # on a GPU the embedding's own assert fires: a check there would make every step wait for the device
        if c.vocab_size and x.device.type == "cpu" and not torch.compiler.is_compiling() and x.numel():
            if not 0 <= x.min() <= x.max() < c.vocab_size:
                raise ValueError(f"token ids must lie in [0, {c.vocab_size}), got {x.min().item()}..{x.max().item()}")
        h = self.wte(x)  # (B, T, d_model)
        if self.wpe is not None:
            h = h + self.wpe(torch.arange(T, device=h.device))
        layers = []
        # the recurrence in float32 even under bf16 autocast: rounding would build up in the cell state over
        # T steps (and cuDNN runs a bf16 LSTM only from version 9.13 on)
        with torch.autocast(h.device.type, enabled=False):
            h = h.float() if h.dtype in (torch.bfloat16, torch.float16) else h
            for i, lstm in enumerate(self.layers):
                layers.append({"x": h} if return_internals else None)
                if i in skip_layers:
                    continue
                y, _ = lstm(self.drop(h) if i > 0 else h)  # dropout between layers, as nn.LSTM(dropout=p) does
                h = h + y if c.residual else y
        h = self.ln_f(h)
        # (B, T, C) logits (tied: against the C answer tokens' embeddings), or (B, T, 2) = (mean, log-variance)
        out = h @ self.wte.weight[c.answer_offset:c.answer_offset + c.n_classes].T if self.tied else self.head(h)
        return (out, dict(layers=layers, final=h)) if return_internals else out
