"""
Linear attention as an associative memory (Qiao, arXiv 2508.08289): Hebbian, Delta and Oja rules, each in
a recurrent reference form and a chunked parallel form, and a model for the wind tunnels.

Column vectors q_t, k_t (d_k), v_t (d_v), memory S_t (d_v x d_k), read-out o_t = S_t q_t after step t's
write (the paper stores the transpose, q S). q is not scaled by d_k^-1/2: the model's Norm(S q) ignores it.
    hebbian  S_t = decay * S_{t-1} + beta_t v_t k_t^T                      Eqs. 7, 12; decay: Eqs. 16-17
    delta    S_t = S_{t-1} + beta_t (v_t - S_{t-1} k_t) k_t^T              Eqs. 22-23 (Def. 10)
    oja      S_t = S_{t-1} + beta_t (v_t k_t^T - diag(v_t * v_t) S_{t-1})  Eqs. 24-25 (Def. 11)
beta_t is the paper's association strength alpha (§5.3). hebbian with decay = beta = 1 is causal linear
attention (Theorem 5); decay < 1 (RetNet) is for hebbian only. delta's factor I - beta_t k_t k_t^T keeps S
bounded for |k_t| = 1 and beta in (0, 1]; beyond 1 it overshoots, beyond 2 it diverges. oja's post-synaptic
activity is the imposed v_t (the paper's form, not the textbook S k_t): row i decays by 1 - beta_t v_{t,i}^2,
bounded for |v_t| = 1 and beta in (0, 1] (proof in tests/test_linear_attn.py).

`memory` has two forms, equal to float tolerance: recurrent, a loop over T; chunked, matrix products inside
chunks of C steps and a loop of T/C steps carrying S. hebbian and oja are linear attention with a per-row
gate a (decay; 1 - beta v_i^2): write j reaches read t with weight exp(g_t - g_j), g the running sum of
log a, masked to j <= t before exp so every exponent is <= 0. delta in WY form: (I + tril(diag(beta) K K^T,
-1)) U = diag(beta)(V - K S_0^T) gives the writes u_t, U = U0 - W S_0^T from one triangular solve each.

Model (Def. 8, Eqs. 18-20): hebbian, beta = 1, no decay, per-head Norm(S q) (RMSNorm), as in the paper; ours:
phi = elu+1 (identity, the proofs' choice, an option), L2-normalised keys for delta and values for oja,
pre-norm blocks with an MLP (use_mlp=False: attention-only), learned positions; learn_beta: beta_t = sigmoid(w . x_t).
"""
from dataclasses import dataclass
import math
import numbers

import torch
import torch.nn as nn
import torch.nn.functional as F
from einops import rearrange

RULES = ("hebbian", "delta", "oja")
MODES = ("recurrent", "chunked")
# per rule: delta's triangular solves grow as C^2, and oja's gates are (C, C, d_v) per chunk
DEFAULT_CHUNK = {"hebbian": 64, "delta": 32, "oja": 16}


def memory(q, k, v, rule, beta=None, decay=None, mode="chunked", initial_state=None, chunk_size=None,
           check_values=True):
    """o (B, H, T, d_v), S_T (B, H, d_v, d_k): write each (k_t, v_t) by `rule`, then read o_t = S_t q_t.

    q, k (B, H, T, d_k), v (B, H, T, d_v); beta: None (= 1), a number, or (B, H, T); decay: None (= 1) or a
    number in (0, 1], hebbian only. initial_state: S_0 (B, H, d_v, d_k), zeros if None. chunk_size: None =
    DEFAULT_CHUNK[rule]. The maths runs in float32, or float64 if any input is float64, with autocast off
    (bf16 would wreck the chunked forms' solves and exponentials); o and S come back in q's dtype.
    check_values=False skips the checks that read tensor values (a beta tensor's range, the chunked oja
    rule's beta v_i^2 <= 1), each of which makes the host wait for a GPU: for callers whose inputs meet them.
    """
    beta = 1.0 if beta is None else beta
    B, H, T, d_k = q.shape if q.dim() == 4 else (0,) * 4
    want = dict(q=(B, H, T, d_k), k=(B, H, T, d_k), v=(B, H, T, v.shape[-1]), beta=(B, H, T),
                initial_state=(B, H, v.shape[-1], d_k))
    for name, t in dict(q=q, k=k, v=v, beta=beta, initial_state=initial_state).items():
        if torch.is_tensor(t) and (t.shape != want[name] or min(want[name]) < 1 or not t.is_floating_point()
                                   or t.device != q.device):
            raise ValueError(f"memory: got {name} {t.dtype} {tuple(t.shape)} on {t.device}; expected floating-point "
                             f"q, k (B, H, T, d_k), v (B, H, T, d_v), beta (B, H, T), initial_state (B, H, d_v, d_k) "
                             f"on one device")
    if rule not in RULES or mode not in MODES:
        raise ValueError(f"memory: rule {rule!r}, mode {mode!r}; valid: {', '.join(RULES)} (rules), "
                         f"{', '.join(MODES)} (modes)")
    if decay not in (None, 1) and not (rule == "hebbian" and isinstance(decay, numbers.Real) and 0 < decay < 1):
        raise ValueError(f"memory: decay must be a number in (0, 1], for the hebbian rule only; got {decay!r}, {rule}")
    if chunk_size is not None and not (isinstance(chunk_size, int) and chunk_size >= 1):
        raise ValueError(f"memory: chunk_size must be an int >= 1 or None, got {chunk_size!r}")
    if rule != "hebbian" and (check_values or not torch.is_tensor(beta)):
        lo, hi = (beta.min().item(), beta.max().item()) if torch.is_tensor(beta) else (beta, beta)
        if not (lo > 0 or lo == 0 and torch.is_tensor(beta)) or not hi <= 1:  # a 0 entry of a tensor: no write
            got, unit = f"{lo:.4g}" if lo == hi else f"[{lo:.4g}, {hi:.4g}]", "keys" if rule == "delta" else "values"
            raise ValueError(f"memory: beta must lie in (0, 1] for the {rule} rule, got {got}: with unit-norm {unit}, "
                             f"1 - beta < 0 for beta > 1 (the memory overshoots) and < -1 for beta > 2 (it diverges)")
    dtype_in, dtype = q.dtype, torch.float32
    for t in (q, k, v, beta, initial_state):
        dtype = torch.promote_types(dtype, t.dtype) if torch.is_tensor(t) else dtype
    with torch.autocast(q.device.type, enabled=False):
        q, k, v = (t.to(dtype) for t in (q, k, v))
        # a number is filled in on the device: a tensor made from it on the host would be copied over, and wait
        beta = beta.to(dtype).expand(B, H, T) if torch.is_tensor(beta) else q.new_full((B, H, T), float(beta))
        S = q.new_zeros(B, H, v.shape[-1], d_k) if initial_state is None else initial_state.to(dtype)
        decay = 1.0 if decay is None else float(decay)
        if mode == "recurrent":
            o, S = memory_recurrent(q, k, v, rule, beta, decay, S)
        elif rule == "delta":
            o, S = chunked_delta(q, k, v, beta, S, chunk_size or DEFAULT_CHUNK[rule])
        else:
            if check_values and rule == "oja" and (beta[..., None] * v * v).max() > 1 + 1e-5:  # log a needs a >= 0
                raise ValueError("memory: the chunked oja rule needs beta * v_i^2 <= 1 (unit-norm values, beta <= 1); "
                                 "use mode='recurrent' for unnormalised values")
            o, S = chunked_gated(q, k, v, rule, beta, math.log(decay), S, chunk_size or DEFAULT_CHUNK[rule])
    return o.to(dtype_in), S.to(dtype_in)


def memory_recurrent(q, k, v, rule, beta, decay, S):
    """The reference: one write and one read per step, on unbind() slices (indexing a full tensor per
    step would make the backward quadratic in T)."""
    outs = []
    for q_t, k_t, v_t, b_t in zip(q.unbind(2), k.unbind(2), v.unbind(2), beta.unbind(2)):  # (B, H, d), (B, H)
        b_t = b_t[..., None]
        if rule == "hebbian":
            S = decay * S + (b_t * v_t)[..., None] * k_t[..., None, :]
        elif rule == "delta":
            error = v_t - (S * k_t[..., None, :]).sum(-1)  # v_t - S_{t-1} k_t: what k_t should retrieve but does not
            S = S + (b_t * error)[..., None] * k_t[..., None, :]
        else:  # oja: row i decays by 1 - beta v_i^2, then the Hebbian write
            S = (1 - b_t * v_t * v_t)[..., None] * S + (b_t * v_t)[..., None] * k_t[..., None, :]
        outs.append((S * q_t[..., None, :]).sum(-1))  # o_t = S_t q_t   (B, H, d_v)
    return torch.stack(outs, 2), S


def _chunks(x, C):
    """(B, H, T, ...) -> (B, H, n, C, ...), zero-padding T up to n*C at the end."""
    pad = [0, 0] * (x.dim() - 3) + [0, -x.shape[2] % C]
    return rearrange(F.pad(x, pad), "b h (n c) ... -> b h n c ...", c=C)


def chunked_gated(q, k, v, rule, beta, log_decay, S, C):
    """hebbian (+ decay) and oja as row-gated linear attention (module docstring). Same returns as memory."""
    T = q.shape[2]
    if rule == "oja":
        a = 1 - beta[..., None] * v * v  # (B, H, T, d_v) each row's decay factor
        log_a = torch.log(a.clamp_min(torch.finfo(a.dtype).tiny))  # a = 0 (beta = 1, v = +-e_i) stays finite
    else:
        log_a = torch.full_like(beta, log_decay)[..., None]  # (B, H, T, 1): one gate for every row
    # padded steps: k = v = beta = 0 and log a = 0, so they neither write nor decay
    q, k, bv, log_a = (_chunks(t, C) for t in (q, k, beta[..., None] * v, log_a))  # (B, H, n, C, .)
    g = log_a.cumsum(3)  # g_t = log of the decay from the chunk start through step t
    causal = torch.ones(C, C, dtype=torch.bool, device=q.device).tril()
    diff = (g[..., :, None, :] - g[..., None, :, :]).masked_fill(~causal[..., None], -math.inf)  # g_t - g_j, t >= j
    decay_tj = torch.exp(diff)  # (B, H, n, C, C, r), r = d_v (oja) or 1 (hebbian); 0 above the diagonal
    qk = q @ k.transpose(-1, -2)  # (B, H, n, C, C): k_j . q_t
    if decay_tj.shape[-1] == 1:
        o = (qk * decay_tj[..., 0]) @ bv  # (B, H, n, C, d_v)
    else:
        o = torch.einsum("...tjr,...tj,...jr->...tr", decay_tj, qk, bv)
    # each chunk's own writes, decayed to its end, from S = 0; exponents g_C - g_j <= 0
    writes = torch.einsum("...jr,...jd->...rd", torch.exp(g[..., -1:, :] - g) * bv, k)  # (B, H, n, d_v, d_k)
    chunk_decay = torch.exp(g[..., -1, :])[..., None]  # (B, H, n, r, 1)
    starts = []
    for decay_c, writes_c in zip(chunk_decay.unbind(2), writes.unbind(2)):
        starts.append(S)
        S = decay_c * S + writes_c
    o = o + torch.exp(g) * torch.einsum("bhnvd,bhncd->bhncv", torch.stack(starts, 2), q)  # + decayed S_0 q_t
    return rearrange(o, "b h n c v -> b h (n c) v")[:, :, :T], S


def chunked_delta(q, k, v, beta, S, C):
    """The delta rule in WY form (module docstring). Same returns as memory."""
    T = q.shape[2]
    bk, bv = beta[..., None] * k, beta[..., None] * v
    q, k, bk, bv = (_chunks(t, C) for t in (q, k, bk, bv))  # padded steps have beta = 0: u = 0, no write
    L = (bk @ k.transpose(-1, -2)).tril(-1)  # (B, H, n, C, C): beta_t k_t . k_j for j < t
    solve = lambda rhs: torch.linalg.solve_triangular(L, rhs, upper=False, unitriangular=True)  # (I + L)^-1 rhs
    W, U0 = solve(bk), solve(bv)  # U = U0 - W S_0^T
    starts, U = [], []
    for W_c, U0_c, k_c in zip(W.unbind(2), U0.unbind(2), k.unbind(2)):
        starts.append(S)
        U_c = U0_c - W_c @ S.transpose(-1, -2)  # (B, H, C, d_v): u_t, the corrections written at each step
        S = S + U_c.transpose(-1, -2) @ k_c
        U.append(U_c)
    starts, U = torch.stack(starts, 2), torch.stack(U, 2)
    o = q @ starts.transpose(-1, -2) + (q @ k.transpose(-1, -2)).tril() @ U  # S_0 q_t + sum_{j<=t} u_j (k_j . q_t)
    return rearrange(o, "b h n c v -> b h (n c) v")[:, :, :T], S

# -----------------------------------------------------------------------------
# the model


@dataclass
class LinearAttentionConfig:
    # I/O, filled in from the task
    vocab_size: int = 0  # input tokens; 0 means real-valued inputs through a linear read-in
    n_features: int = 0  # width of real-valued inputs
    n_classes: int = 2  # answer classes C (or 2 = mean, log-variance for the Gaussian head)
    answer_offset: int = None  # token id of answer class 0 when answers are tokens
    gaussian: bool = False  # real-valued prediction: Gaussian head
    block_size: int = 128  # longest sequence the learned position table covers (pos=learned only)
    # architecture
    n_layer: int = 2  # blocks
    n_head: int = 4  # memory heads per block, each d_k = d_v = d_model / n_head
    d_model: int = 128  # residual width
    rule: str = "hebbian"  # memory write rule: hebbian (the paper's base model) | delta | oja
    feature_map: str = "elu+1"  # phi on queries and keys: elu+1 (Katharopoulos) | identity (the paper's proofs)
    norm_k: str = "auto"  # L2-normalise keys: auto (delta only, its stability needs |k| = 1) | l2 | none
    norm_v: str = "auto"  # L2-normalise values: auto (oja only, its bound and chunked form need |v| <= 1) | l2 | none
    norm: str = "rmsnorm"  # the output Norm(S q) per head (paper Eq. 4) and the pre-norms: rmsnorm | layernorm
    learn_beta: bool = False  # beta_t = sigmoid(w . x_t) per token and head; False: the fixed value --beta
    beta: float = 1.0  # fixed write strength (the paper's alpha = 1); delta and oja need (0, 1]
    decay: float = 1.0  # hebbian forgetting factor in (0, 1] (paper Def. 7); 1 = none
    use_mlp: bool = True  # MLP after each memory; False gives the paper's attention-only stacked circuits (Def. 8)
    mlp_ratio: int = 4  # MLP hidden width = mlp_ratio * d_model
    pos: str = "learned"  # position encoding: learned | none (a Hebbian sum alone cannot tell order)
    tie_head: bool = True  # answer logits from the answer tokens' embeddings, where answers are tokens
    mode: str = "auto"  # memory form: auto (per device) | recurrent | chunked
    chunk_size: int = 0  # chunk length of the chunked form; 0 = per rule (DEFAULT_CHUNK)


FEATURE_MAPS = ("elu+1", "identity")
NORMS = ("rmsnorm", "layernorm")
POS = ("learned", "none")
L2_CHOICES = ("auto", "l2", "none")
# mode=auto: the faster form per (device, rule). On a CPU oja's chunked form, which moves (C, C, d_v) gates
# through memory, is slower than the loop; elsewhere chunked, as a loop over T is bound by kernel launches
DEFAULT_MODE = {("cpu", "hebbian"): "chunked", ("cpu", "delta"): "chunked", ("cpu", "oja"): "recurrent"}


def make_norm(config, width):
    return nn.RMSNorm(width, eps=1e-6) if config.norm == "rmsnorm" else nn.LayerNorm(width)


class MemoryLayer(nn.Module):
    """Multi-head associative memory: q, k, v = x W_Q, x W_K, x W_V; o = Norm(S q) per head; then W_O (Eqs. 18-20)."""

    def __init__(self, config):
        super().__init__()
        c = config
        self.config, self.n_head, d = c, c.n_head, c.d_model // c.n_head
        self.norm_k = c.norm_k == "l2" or c.norm_k == "auto" and c.rule == "delta"
        self.norm_v = c.norm_v == "l2" or c.norm_v == "auto" and c.rule == "oja"
        self.c_attn = nn.Linear(c.d_model, 3 * c.d_model, bias=False)  # the paper's pathways W_Q, W_K, W_V
        self.c_beta = nn.Linear(c.d_model, c.n_head) if c.learn_beta else None
        self.out_norm = make_norm(c, d)
        self.c_proj = nn.Linear(c.d_model, c.d_model, bias=False)  # W_O

    def forward(self, x, head_mask=None, record=None):
        c = self.config
        q, k, v = [rearrange(t, "b t (h d) -> b h t d", h=self.n_head) for t in self.c_attn(x).chunk(3, -1)]
        if c.feature_map == "elu+1":  # positive features, as in Katharopoulos et al.
            q, k = F.elu(q) + 1, F.elu(k) + 1
        if self.norm_k:
            k = F.normalize(k, dim=-1)
        if self.norm_v:
            v = F.normalize(v, dim=-1)
        beta = torch.sigmoid(self.c_beta(x)).transpose(1, 2) if self.c_beta is not None else c.beta  # (B, H, T)
        mode = c.mode if c.mode != "auto" else DEFAULT_MODE.get((x.device.type, c.rule), "chunked")
        # a sigmoid beta lies in [0, 1], and unit-norm values keep oja's gate 1 - beta v_i^2 >= 0: no check
        # then needs to wait for the GPU
        o, S = memory(q, k, v, c.rule, beta, c.decay, mode, chunk_size=c.chunk_size or None,
                      check_values=c.rule == "oja" and not self.norm_v)
        o = self.out_norm(o)  # Norm(S_t q_t): divisive normalisation over each head's d_v features
        if record is not None:
            record.update(q=q, k=k, v=v, S=S, beta=beta)
        if head_mask is not None:
            o = o * head_mask.view(1, -1, 1, 1).to(o.dtype)
        return self.c_proj(rearrange(o, "b h t d -> b t (h d)"))


class FeedForward(nn.Module):

    def __init__(self, config):
        super().__init__()
        self.c_fc = nn.Linear(config.d_model, config.mlp_ratio * config.d_model)
        self.c_proj = nn.Linear(config.mlp_ratio * config.d_model, config.d_model)

    def forward(self, x):
        return self.c_proj(F.gelu(self.c_fc(x)))


class Block(nn.Module):

    def __init__(self, config):
        super().__init__()
        self.ln_1, self.attn = make_norm(config, config.d_model), MemoryLayer(config)
        self.mlp = nn.Sequential(make_norm(config, config.d_model), FeedForward(config)) if config.use_mlp else None

    def forward(self, x, head_mask=None, record=None):
        # pre-norm residual. Def. 8 adds Norm(S q) W_O to an un-normed stream; the pre-norm keeps the
        # pathways' inputs at unit scale as the stream grows with depth
        x = x + self.attn(self.ln_1(x), head_mask, record)
        return x + self.mlp(x) if self.mlp is not None else x


class LinearAttention(nn.Module):

    def __init__(self, config):
        super().__init__()
        c = config
        for name, valid in dict(rule=RULES, feature_map=FEATURE_MAPS, norm_k=L2_CHOICES, norm_v=L2_CHOICES, norm=NORMS,
                                pos=POS, mode=("auto", *MODES)).items():
            if getattr(c, name) not in valid:
                raise ValueError(f"linear_attn: {name} must be one of {', '.join(valid)}; got {getattr(c, name)!r}")
        if min(c.n_layer, c.n_head, c.d_model, c.mlp_ratio, c.block_size) < 1 or c.chunk_size < 0:
            raise ValueError("linear_attn: n_layer, n_head, d_model, mlp_ratio, block_size must be >= 1, "
                             "chunk_size >= 0")
        if c.d_model % c.n_head:
            raise ValueError(f"linear_attn: d_model={c.d_model} must split into n_head={c.n_head} heads")
        if not 0 < c.decay <= 1 or c.decay != 1 and c.rule != "hebbian":
            raise ValueError(f"linear_attn: decay must be in (0, 1], for the hebbian rule only; "
                             f"got {c.decay}, {c.rule}")
        if not c.learn_beta and c.rule == "hebbian" and not 0 < c.beta < math.inf:  # NaN too
            raise ValueError(f"linear_attn: beta must be a finite number > 0, got {c.beta}")
        if not c.learn_beta and c.rule != "hebbian" and not 0 < c.beta <= 1:
            raise ValueError(f"linear_attn: the {c.rule} rule needs beta in (0, 1] (beyond 1 it overshoots), "
                             f"got {c.beta}")
        if c.rule == "oja" and c.mode != "recurrent" and c.norm_v == "none":
            raise ValueError("linear_attn: oja's chunked form needs unit-norm values (norm_v auto or l2); "
                             "use mode=recurrent for unnormalised values")
        if c.vocab_size < 1 and c.n_features < 1:
            raise ValueError("linear_attn: the input size must be >= 1 (vocab_size for tokens or n_features for reals)")
        self.config = c
        self.tied = bool(c.tie_head and c.vocab_size and c.answer_offset is not None and not c.gaussian)
        if self.tied and not 0 <= c.answer_offset <= c.vocab_size - c.n_classes:
            raise ValueError(f"linear_attn: answer tokens {c.answer_offset}..{c.answer_offset + c.n_classes - 1} "
                             f"lie outside the vocabulary of {c.vocab_size}")
        # real-valued inputs enter through a linear read-in instead of a token table
        self.wte = nn.Embedding(c.vocab_size, c.d_model) if c.vocab_size else nn.Linear(c.n_features, c.d_model)
        self.wpe = nn.Embedding(c.block_size, c.d_model) if c.pos == "learned" else None
        self.blocks = nn.ModuleList([Block(c) for _ in range(c.n_layer)])
        self.ln_f = make_norm(c, c.d_model)
        self.head = None if self.tied else nn.Linear(c.d_model, 2 if c.gaussian else c.n_classes)
        # GPT-2 init: N(0, 0.02), residual projections scaled by 1/sqrt(number of residual branches)
        for m in self.modules():
            if isinstance(m, (nn.Linear, nn.Embedding)):
                nn.init.normal_(m.weight, std=0.02)
                if getattr(m, "bias", None) is not None:
                    nn.init.zeros_(m.bias)
        for name, p in self.named_parameters():
            if name.endswith("c_proj.weight"):
                nn.init.normal_(p, std=0.02 / math.sqrt((2 if c.use_mlp else 1) * c.n_layer))

    def num_params(self):
        return sum(p.numel() for p in self.parameters())

    def forward(self, x, head_mask=None, skip_layers=(), return_internals=False):
        """x: (B, T) tokens or (B, T, F) reals -> (B, T, C) logits, or (B, T, 2) = (mean, log-variance).

        Causal by construction: S_t holds writes up to t only. `head_mask` (n_layer, n_head) scales each
        head's normed output (0 silences it); `skip_layers` bypasses blocks. Internals: per layer the
        block's input residual `x` (B, T, d_model), `q`, `k` (B, H, T, d_k) and `v` (B, H, T, d_v) as
        written (after phi and any L2 norm), and `S` (B, H, d_v, d_k), the memory after the last token.
        """
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
        for i, block in enumerate(self.blocks):
            record = {"x": h} if return_internals else None
            if i not in skip_layers:
                h = block(h, None if head_mask is None else head_mask[i], record)
            layers.append(record)
        h = self.ln_f(h)
        # (B, T, C) logits (tied: against the C answer tokens' embeddings), or (B, T, 2) = (mean, log-variance)
        out = h @ self.wte.weight[c.answer_offset:c.answer_offset + c.n_classes].T if self.tied else self.head(h)
        return (out, dict(layers=layers, final=h)) if return_internals else out
