"""
Mamba (a selective state space model) for the wind tunnels, with a pure-PyTorch selective scan.

Gu & Dao 2023, "Mamba: Linear-Time Sequence Modeling with Selective State Spaces". Implemented here:
- the discrete SSM recurrence, eq. (2a, 2b): h_t = Ā_t h_{t-1} + B̄_t x_t, y_t = C_t h_t, run per channel
  with a diagonal A;
- discretisation, eq. (4): zero-order hold for A, Ā = exp(ΔA); for B the simpler B̄ ≈ ΔB that the
  official reference `selective_scan_ref` uses (per the authors, performance barely changes);
- selection, Algorithm 2 (S6): B = s_B(x), C = s_C(x), Δ = softplus(bias + s_Δ(x)), with s_Δ a rank-R
  projection (dt_rank);
- the block of Figure 3: in_proj to (x, z), causal depthwise conv + SiLU, the SSM, + D·x, × SiLU(z),
  out_proj; blocks in a pre-norm residual stack, then a final norm and the head;
- the official initialisation: A = -(1..N) in every channel (S4D-real, stored as A_log), Δ log-uniform
  in [1e-3, 1e-1] through an inverse-softplus bias on dt_proj, D = 1. There are no clamps. The authors'
  wind-tunnel Mamba (their released code) clamps Δ, ΔA, ΔBx and h and adds a LayerNorm on y; we keep
  the paper's model.

Glossary (mamba-minimal's names; the paper's notation in brackets):
    b        batch size                               [B]
    l        sequence length                          [L]
    d_model  residual width                           [D]
    d_in     channels the SSM runs on, expand*d_model [ED]
    n        state size per channel, d_state          [N]
    dt_rank  rank of the Δ projection                 [R]
    delta    step sizes Δ, (b, d_in, l), > 0
    A        (d_in, n) diagonal state matrix, < 0
    B, C     (b, n, l) input and output matrices, chosen per token
    D        (d_in,) skip connection
    h        hidden state (b, d_in, n)
    deltaA   Ā = exp(ΔA);  deltaB_u = B̄x = ΔBx

Selective scan: `selective_scan` has the arguments and semantics of the official `selective_scan_ref`,
with two modes.
- "sequential": one step at a time, the reference. Its forward + backward time grows linearly in l.
- "chunked": parallel and CUDA-friendly. Split l into c chunks of T = ceil(sqrt(l)) steps. (1) Every
  chunk's end state from h = 0, in closed form from cumulative sums of Δ·A. (2) A loop of c steps
  carries states across chunks. (3) A loop of T steps runs the recurrence inside all chunks at once.
  In all, about 2*sqrt(l) sequential steps instead of l. With Δ ≥ 0 and A ≤ 0 (always so in the
  model), every exponent is ≤ 0 and nothing is ever divided by a decay, so it is finite at any
  length. Memory is O(b*d_in*l*n). A full closed form inside the chunks (a masked TxT decay matrix
  per (b, d, n)) costs T times the work and memory. At L=256 (B=16, D=384, N=16, one CPU thread)
  we measured it at 10 s for T=4 and 45 s for T=32, against about 1 s for (1)-(3), so it is not used.
"""
from dataclasses import dataclass
import math

import torch
import torch.nn as nn
import torch.nn.functional as F
from einops import rearrange

SCAN_MODES = ("sequential", "chunked")
# mode=None picks per device. CPU, measured with bench_scan.py (B=16, D=384, N=16, forward + backward,
# best of 3), seconds at L = 64 / 256 / 1024: 1 thread, sequential 0.10 / 0.27 / 1.44, chunked
# 0.18 / 0.78 / 3.86; 2 threads, sequential 0.04 / 0.17 / 1.07, chunked 0.08 / 0.33 / 2.44.
# Sequential is faster at every length, so it is the CPU default.
# CUDA: no GPU was available, so this default is not a GPU timing. Chunked dispatches 13x fewer
# kernels at L=256 and 28x fewer at L=1024 (bench_scan.py counts them), and a Python loop of small
# kernels is bound by launch latency on a GPU. Check with `python bench_scan.py --device cuda`.
DEFAULT_SCAN = {"cpu": "sequential"}  # any other device: chunked


def _check_scan_inputs(u, delta, A, B, C, D, z, delta_bias, mode):
    def fail(msg):
        raise ValueError(f"selective_scan: {msg}")
    named = dict(u=u, delta=delta, A=A, B=B, C=C, D=D, z=z, delta_bias=delta_bias)
    for name, t in named.items():
        if t is not None and not (torch.is_tensor(t) and t.is_floating_point()):
            fail(f"{name} must be a real floating-point tensor, got {getattr(t, 'dtype', type(t).__name__)}")
    if u.dim() != 3 or A.dim() != 2 or B.dim() != 3 or C.dim() != 3:
        fail(f"expected u (b, d, l), A (d, n), B and C (b, n, l), got u {tuple(u.shape)}, A {tuple(A.shape)}, "
             f"B {tuple(B.shape)}, C {tuple(C.shape)} (grouped B/C and complex A are not supported)")
    (b, d, l), n = u.shape, A.shape[1]
    if n < 1 or min(b, d, l) < 1:
        fail(f"sizes must be >= 1, got b={b}, d={d}, l={l}, n={n}")
    want = dict(delta=(b, d, l), A=(d, n), B=(b, n, l), C=(b, n, l), D=(d,), z=(b, d, l), delta_bias=(d,))
    for name, shape in want.items():
        t = named[name]
        if t is not None and tuple(t.shape) != shape:
            fail(f"{name} must have shape {shape} for u {tuple(u.shape)} and A {tuple(A.shape)}, got {tuple(t.shape)}")
    # sequence inputs share a dtype; A, D and delta_bias are parameters and may stay float32 under autocast
    for name in ("delta", "B", "C", "z"):
        if named[name] is not None and named[name].dtype != u.dtype:
            fail(f"{name} has dtype {named[name].dtype} but u has {u.dtype}")
    for name, t in named.items():
        if t is not None and t.device != u.device:
            fail(f"{name} is on {t.device} but u is on {u.device}")
    if mode is not None and mode not in SCAN_MODES:
        fail(f"unknown mode {mode!r}; valid: None (per device), {', '.join(SCAN_MODES)}")


def selective_scan(u, delta, A, B, C, D=None, z=None, delta_bias=None, delta_softplus=False,
                   return_last_state=False, mode=None):
    """y (b, d, l) = SSM(u) with h_t = exp(Δ_t A) h_{t-1} + Δ_t B_t u_t, y_t = C_t h_t (+ D u_t) (* SiLU(z_t)).

    Shapes: u, delta, z (b, d, l); A (d, n); B, C (b, n, l); D, delta_bias (d,). delta, B, C and z must
    have u's dtype. A, D and delta_bias may have any floating dtype: they are parameters and stay
    float32 under autocast. The maths runs in float32, or in float64 for float64 inputs (the reference
    would round those to float32). y comes back in u's dtype. With return_last_state it also returns
    h at the last step, (b, d, n), in the compute dtype, as the reference does.
    """
    _check_scan_inputs(u, delta, A, B, C, D, z, delta_bias, mode)
    mode = mode or DEFAULT_SCAN.get(u.device.type, "chunked")
    dtype_in, dtype = u.dtype, torch.promote_types(u.dtype, torch.float32)
    with torch.autocast(u.device.type, enabled=False):  # bf16 autocast must not reach the recurrence
        u, delta, A, B, C = (t.to(dtype) for t in (u, delta, A, B, C))
        if delta_bias is not None:
            delta = delta + delta_bias.to(dtype)[:, None]
        if delta_softplus:
            delta = F.softplus(delta)
        y, last_state = (scan_sequential if mode == "sequential" else scan_chunked)(u, delta, A, B, C)
        if D is not None:
            y = y + u * D.to(dtype)[:, None]
        if z is not None:
            y = y * F.silu(z.to(dtype))
    y = y.to(dtype_in)
    return (y, last_state) if return_last_state else y


def scan_sequential(u, delta, A, B, C):
    """The reference loop over l. Returns y (b, d, l) without D and z, and the last state (b, d, n)."""
    h = u.new_zeros(*u.shape[:2], A.shape[1])  # (b, d, n)
    ys = []
    # Step through unbind() slices and build Ā_t and B̄_t u_t from the small (b, d) slices. Indexing a
    # full-size tensor inside the loop (deltaA[:, :, t]) would make backward quadratic in l: each step's
    # gradient is scattered into a fresh full-size zero tensor, 26 s at L=256 for a naive loop on a 2-core CPU.
    # Small per-step tensors also stay in cache, which made this loop 3.5x faster on CPU than
    # materialising deltaA and deltaB_u (b, d, l, n) up front (0.3 s against 1.1 s at L=256).
    for delta_t, u_t, B_t, C_t in zip(delta.unbind(-1), u.unbind(-1), B.unbind(-1), C.unbind(-1)):
        deltaA = torch.exp(delta_t[..., None] * A)  # Ā_t = exp(Δ_t A), eq. (4)   (b, d, n)
        deltaB_u = (delta_t * u_t)[..., None] * B_t[:, None]  # B̄_t x_t = Δ_t B_t x_t   (b, d, n)
        h = deltaA * h + deltaB_u  # eq. (2a)
        ys.append((h * C_t[:, None]).sum(-1))  # y_t = C_t h_t, eq. (2b)   (b, d); 2.5x faster than a bmm matvec
    return torch.stack(ys, -1), h


class ChunkEndStates(torch.autograd.Function):
    """H[b,c,d,n] = sum_s exp(A[d,n] * suffix[s,b,c,d]) * du[s,b,c,d] * B[s,b,c,n]: every chunk's end state from h = 0.

    suffix[s] = Δ_{s+1} + ... + Δ_T is the time from step s to the chunk end, so A*suffix <= 0 is the log
    of the decay from s to the end. Written by hand so that the (T, b, c, d, n) weights are recomputed in
    backward rather than stored: besides the small inputs, nothing is saved. Its backward also needs
    two full-size temporaries instead of about ten; on CPU, every fresh full-size tensor costs more
    in page faults than the arithmetic done in it.
    """

    @staticmethod
    def forward(ctx, suffix, du, B, A):  # (T, b, c, d), (T, b, c, d), (T, b, c, n), (d, n)
        ctx.save_for_backward(suffix, du, B, A)
        E = torch.exp_(suffix[..., None] * A)  # (T, b, c, d, n), every exponent <= 0
        return E.mul_(du[..., None]).mul_(B[..., None, :]).sum(0)

    @staticmethod
    @torch.autograd.function.once_differentiable
    def backward(ctx, g):  # g: (b, c, d, n)
        suffix, du, B, A = ctx.saved_tensors
        (T, b, c, d), n = suffix.shape, A.shape[1]
        P = torch.exp_(suffix[..., None] * A).mul_(g)  # dL/d(du*B) at each step: (T, b, c, d, n)
        Pk = P.view(-1, d, n)
        g_du = torch.bmm(Pk, B.reshape(-1, n, 1)).view(T, b, c, d)  # sum over n
        g_B = torch.bmm(du.reshape(-1, 1, d), Pk).view(T, b, c, n)  # sum over d
        P.mul_(B[..., None, :]).mul_(du[..., None])  # dL/d(A*suffix)
        g_A = (P * suffix[..., None]).sum((0, 1, 2))
        g_suffix = P.mul_(A).sum(-1)
        return g_suffix, g_du, g_B, g_A


def scan_chunked(u, delta, A, B, C):
    """The chunked parallel scan (module docstring). Same returns as scan_sequential."""
    (b, d, l), n = u.shape, A.shape[1]
    T = math.isqrt(l - 1) + 1  # chunk length ceil(sqrt(l)): about T + l/T = 2 sqrt(l) sequential steps
    pad = -l % T

    def chunks(x, pattern):  # zero padding at the end: Δ = 0 there, decay 1 and no input, h passes unchanged
        return rearrange(F.pad(x, (0, pad)), pattern, t=T)

    dt, du = chunks(delta, "b d (c t) -> t b c d"), chunks(delta * u, "b d (c t) -> t b c d")
    Bc, Cc = chunks(B, "b n (c t) -> t b c n"), chunks(C, "b n (c t) -> t b c n")
    # (1) suffix[s] = Δ_{s+1} + ... + Δ_T inside each chunk, as a reverse cumulative sum of positive terms:
    # a difference of two forward cumsums would lose precision when the chunk's total is large
    later = torch.cat([dt[1:], torch.zeros_like(dt[:1])])
    suffix = later.flip(0).cumsum(0).flip(0)  # (T, b, c, d)
    H = ChunkEndStates.apply(suffix, du, Bc, A)  # (b, c, d, n)
    chunk_decay = torch.exp((suffix[0] + dt[0])[..., None] * A)  # exp(A * the chunk's total Δ)   (b, c, d, n)
    # (2) carry states across chunks: the state entering chunk k+1 is decay_k * (state entering k) + H_k
    h, starts = u.new_zeros(b, d, n), []
    for decay_k, H_k in zip(chunk_decay.unbind(1), H.unbind(1)):
        starts.append(h)
        h = decay_k * h + H_k
    last_state = h
    # (3) the recurrence inside every chunk at once, from the right starting state: T steps on (b, c, d, n)
    h, ys = torch.stack(starts, 1), []
    for dt_t, du_t, B_t, C_t in zip(dt, du, Bc, Cc):
        h = torch.exp(dt_t[..., None] * A) * h + du_t[..., None] * B_t[..., None, :]
        ys.append((h * C_t[..., None, :]).sum(-1))  # (b, c, d)
    return rearrange(torch.stack(ys), "t b c d -> b d (c t)")[..., :l], last_state

# -----------------------------------------------------------------------------
# the model


@dataclass
class MambaConfig:
    # I/O, filled in from the task
    vocab_size: int = 0  # input tokens; 0 means real-valued inputs through a linear read-in
    n_features: int = 0  # width of real-valued inputs
    n_classes: int = 2  # answer classes C (or 2 = mean, log-variance for the Gaussian head)
    answer_offset: int = None  # token id of answer class 0 when answers are tokens
    gaussian: bool = False  # real-valued prediction: Gaussian head
    block_size: int = 128  # longest sequence the learned position table covers (pos=learned only)
    # architecture
    n_layer: int = 4  # Mamba blocks
    d_model: int = 128  # residual width D
    d_state: int = 16  # N, state size per channel
    d_conv: int = 4  # kernel width of the causal depthwise convolution
    expand: int = 2  # d_inner = expand * d_model channels in the SSM
    dt_rank: int = 0  # rank R of the delta projection; 0 = ceil(d_model / 16)
    pos: str = "none"  # position encoding: none (the recurrence knows the order) | learned
    tie_head: bool = True  # answer logits from the answer tokens' embeddings, where answers are tokens
    norm: str = "rmsnorm"  # rmsnorm (official Mamba) | layernorm
    scan: str = "auto"  # selective scan: auto (per device) | sequential | chunked


POS = ("none", "learned")
NORMS = ("rmsnorm", "layernorm")


def make_norm(config):
    return nn.RMSNorm(config.d_model, eps=1e-5) if config.norm == "rmsnorm" else nn.LayerNorm(config.d_model)


class MambaMixer(nn.Module):
    """Figure 3: in_proj -> (x, z); x -> causal conv -> SiLU -> selective SSM (+ D x); * SiLU(z); out_proj."""

    def __init__(self, config):
        super().__init__()
        c = config
        d_in, N, self.dt_rank = c.expand * c.d_model, c.d_state, c.dt_rank or math.ceil(c.d_model / 16)
        self.d_state = N
        self.scan = None if c.scan == "auto" else c.scan
        self.in_proj = nn.Linear(c.d_model, 2 * d_in, bias=False)
        # depthwise (groups = channels); padded by d_conv - 1 on both sides, we keep the first l outputs,
        # so output t sees inputs t - d_conv + 1 .. t only
        self.conv1d = nn.Conv1d(d_in, d_in, c.d_conv, groups=d_in, padding=c.d_conv - 1, bias=True)
        self.x_proj = nn.Linear(d_in, self.dt_rank + 2 * N, bias=False)  # s_Δ (rank R), s_B, s_C
        self.dt_proj = nn.Linear(self.dt_rank, d_in, bias=True)
        self.out_proj = nn.Linear(d_in, c.d_model, bias=False)
        # official init: dt_proj weight U(±R^-1/2); bias = softplus^-1(dt) with dt log-uniform in [1e-3, 1e-1],
        # so Δ starts at time scales between 10 and 1000 steps
        nn.init.uniform_(self.dt_proj.weight, -self.dt_rank ** -0.5, self.dt_rank ** -0.5)
        dt = torch.exp(torch.rand(d_in) * (math.log(1e-1) - math.log(1e-3)) + math.log(1e-3))
        with torch.no_grad():
            self.dt_proj.bias.copy_(dt + torch.log(-torch.expm1(-dt)))  # softplus^-1(dt) = dt + log(1 - e^-dt)
        # S4D-real: A = -(1, 2, ..., N) in every channel, kept as log(-A) so A stays negative while training
        self.A_log = nn.Parameter(torch.log(torch.arange(1, N + 1, dtype=torch.float32)).repeat(d_in, 1))
        self.D = nn.Parameter(torch.ones(d_in))
        self.A_log._no_weight_decay = self.D._no_weight_decay = True  # train.py exempts these from decay

    def forward(self, x, record=None):
        L = x.shape[1]
        x, z = rearrange(self.in_proj(x), "b l d -> b d l").chunk(2, dim=1)  # (B, d_in, L) each
        x = F.silu(self.conv1d(x)[..., :L])
        dt, B, C = self.x_proj(rearrange(x, "b d l -> b l d")).split([self.dt_rank, self.d_state, self.d_state], -1)
        # Δ = softplus(dt_proj(dt)): the bias and the softplus are applied inside the scan, in float32 (as
        # the official kernel does), so that under bf16 autocast Δ is not rounded before the exponential
        delta = rearrange(dt @ self.dt_proj.weight.T, "b l d -> b d l")
        A = -torch.exp(self.A_log)  # (d_in, N), parameters stay float32 under autocast
        y = selective_scan(x, delta, A, rearrange(B, "b l n -> b n l"), rearrange(C, "b l n -> b n l"), self.D,
                           z, delta_bias=self.dt_proj.bias, delta_softplus=True, mode=self.scan)
        if record is not None:
            record.update(delta=F.softplus(delta + self.dt_proj.bias[:, None]).transpose(1, 2), B=B, C=C)
        return self.out_proj(rearrange(y, "b d l -> b l d"))


class Block(nn.Module):

    def __init__(self, config):
        super().__init__()
        self.norm, self.mixer = make_norm(config), MambaMixer(config)

    def forward(self, x, record=None):
        return x + self.mixer(self.norm(x), record)  # pre-norm residual (official: fused add -> norm, the same sum)


class Mamba(nn.Module):
    width_field = "d_model"  # the field train.py's --match_params resizes

    def __init__(self, config):
        super().__init__()
        c = config
        if c.pos not in POS or c.norm not in NORMS or c.scan not in ("auto", *SCAN_MODES):
            raise ValueError(f"mamba: pos must be one of {POS}, norm one of {NORMS}, scan one of "
                             f"{('auto', *SCAN_MODES)}; got {c.pos!r}, {c.norm!r}, {c.scan!r}")
        if min(c.n_layer, c.d_model, c.d_state, c.d_conv, c.expand, c.block_size) < 1 or c.dt_rank < 0:
            raise ValueError("mamba: n_layer, d_model, d_state, d_conv, expand and block_size must be >= 1, dt_rank >= 0")
        if c.vocab_size < 1 and c.n_features < 1:
            raise ValueError("mamba: the input size must be >= 1 (vocab_size for tokens or n_features for reals)")
        self.config = c
        self.tied = bool(c.tie_head and c.vocab_size and c.answer_offset is not None and not c.gaussian)
        if self.tied and not 0 <= c.answer_offset <= c.vocab_size - c.n_classes:
            raise ValueError(f"mamba: answer tokens {c.answer_offset}..{c.answer_offset + c.n_classes - 1} "
                             f"lie outside the vocabulary of {c.vocab_size}")
        # real-valued inputs enter through a linear read-in instead of a token table
        self.wte = nn.Embedding(c.vocab_size, c.d_model) if c.vocab_size else nn.Linear(c.n_features, c.d_model)
        self.wpe = nn.Embedding(c.block_size, c.d_model) if c.pos == "learned" else None
        self.blocks = nn.ModuleList([Block(c) for _ in range(c.n_layer)])
        self.norm_f = make_norm(c)
        self.head = None if self.tied else nn.Linear(c.d_model, 2 if c.gaussian else c.n_classes)
        # official LM init: embeddings N(0, 0.02), other biases 0 (dt_proj's keeps its own init); Linear
        # weights keep PyTorch's default, with out_proj scaled by 1/sqrt(n_layer) so the residual
        # stream's variance does not grow with depth
        with torch.no_grad():
            for m in (self.wte, self.wpe, self.head):
                if isinstance(m, nn.Embedding):
                    nn.init.normal_(m.weight, std=0.02)
                elif isinstance(m, nn.Linear):
                    nn.init.zeros_(m.bias)
            for block in self.blocks:
                block.mixer.out_proj.weight.div_(math.sqrt(c.n_layer))

    def num_params(self):
        return sum(p.numel() for p in self.parameters())

    def forward(self, x, skip_layers=(), return_internals=False):
        """x: (B, T) tokens or (B, T, F) reals -> (B, T, C) logits, or (B, T, 2) = (mean, log-variance).

        Causal by construction: the conv sees only the past, and the scan runs forward in time.
        Internals: per layer, the block's input residual `x` (B, T, d_model) and the selection `delta`
        (B, T, d_inner), `B` and `C` (B, T, N); `final` is the normed last residual. `skip_layers` bypasses blocks.
        """
        c = self.config
        B, T = x.shape[:2]
        if c.pos == "learned" and T > c.block_size:
            raise ValueError(f"sequence length {T} exceeds the model's position table block_size={c.block_size}")
        h = self.wte(x)  # (B, T, d_model)
        if self.wpe is not None:
            h = h + self.wpe(torch.arange(T, device=h.device))
        layers = []
        for i, block in enumerate(self.blocks):
            record = {"x": h} if return_internals else None
            if i not in skip_layers:
                h = block(h, record)
            layers.append(record)
        h = self.norm_f(h)
        if self.tied:  # logits against the embeddings of the C answer tokens
            out = h @ self.wte.weight[c.answer_offset:c.answer_offset + c.n_classes].T
        else:
            out = self.head(h)  # (B, T, C), or (B, T, 2) = (mean, log-variance)
        return (out, dict(layers=layers, final=h)) if return_internals else out
