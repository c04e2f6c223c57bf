"""
Mamba (Gu & Dao 2023, "Mamba: Linear-Time Sequence Modeling with Selective State Spaces") for the wind
tunnels, with a pure-PyTorch selective scan. Top to bottom: the config, the model, the block's mixer, then
the selective scan (a plain reference loop, then the autograd Function the model runs, and its modes).
- SSM, eq. (2a, 2b): h_t = Ā_t h_{t-1} + B̄_t x_t, y_t = C_t h_t per channel, with a diagonal A;
  eq. (4): Ā = exp(ΔA) (zero-order hold), and B̄ ≈ ΔB, as the official `selective_scan_ref` does;
- selection (Algorithm 2, S6): B = s_B(x), C = s_C(x), Δ = softplus(bias + s_Δ(x)), s_Δ of rank R (dt_rank);
- the block (Figure 3): in_proj to (x, z), causal depthwise conv + SiLU, the SSM, + D·x, × SiLU(z), out_proj;
  pre-norm residual blocks, a final norm and the head;
- the official init: A = -(1..N) per channel (S4D-real, kept as A_log), Δ log-uniform in [1e-3, 1e-1]
  through dt_proj's bias, D = 1; no clamps (the authors' wind-tunnel Mamba clamps Δ, ΔA, ΔBx and h; this
  is the paper's model). `y_norm` adds the authors' LayerNorm on y, before the skip D·x and the gate; `mimetic`
  starts the SSM as linear attention (Trockman et al. 2024, arXiv 2410.11135: Ā ≈ 1, C's projection = B's).

Glossary (mamba-minimal's names, the paper's in brackets): b, l batch and length [B, L]; d_model [D];
d_in = expand * d_model, the SSM's channels [ED]; n = d_state, state size per channel [N]; dt_rank [R];
delta (b, d_in, l) step sizes Δ > 0; A (d_in, n) < 0; B, C (b, n, l), chosen per token; D (d_in,) skip;
h (b, d_in, n) state; deltaA = Ā = exp(ΔA); deltaB_u = B̄x = ΔBx.

Scan modes (`selective_scan`, one autograd Function that stores no per-step states: the forward keeps
the state entering each block of `chunk` steps, the backward recomputes each block and runs the adjoint
recurrence backwards in time): "sequential", one step at a time on (b, d, n) slices; "compiled", the same
with each step, and each pass over (l, b, d) around the loop, fused by torch.compile (the CPU default);
"chunked", for GPUs, each block at once on (chunk, b, d, n) tensors (`linear_scan`). With Δ >= 0 and
A <= 0 every exponent is <= 0 and nothing is divided by a decay, so all three are finite at any length.
"""
from dataclasses import dataclass
import functools
import math
import os
import warnings

import torch
import torch.nn as nn
import torch.nn.functional as F
from einops import rearrange


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
    n_pos: int = 0  # learned rows: positions >= n_pos share the last row (0 = block_size, every position its own)
    y_norm: bool = False  # LayerNorm on the SSM output y before the gate, as the authors' wind-tunnel Mamba
    mimetic: bool = False  # attention-like init (Trockman et al. 2024): C's projection = B's, A near 0
    tie_head: bool = True  # answer logits from the answer tokens' embeddings, where answers are tokens
    norm: str = "rmsnorm"  # rmsnorm (official Mamba) | layernorm
    scan: str = "auto"  # selective scan: auto (per device) | sequential | compiled | chunked


POS = ("none", "learned")
NORMS = ("rmsnorm", "layernorm")


def make_norm(config):
    return nn.RMSNorm(config.d_model, eps=1e-5) if config.norm == "rmsnorm" else nn.LayerNorm(config.d_model)


class Mamba(nn.Module):

    def __init__(self, config):
        super().__init__()
        c = config
        if c.pos not in POS or c.norm not in NORMS or c.scan not in ("auto", *SCAN_MODES):
            raise ValueError(f"mamba: pos must be one of {POS}, norm one of {NORMS}, scan one of "
                             f"{('auto', *SCAN_MODES)}; got {c.pos!r}, {c.norm!r}, {c.scan!r}")
        if min(c.n_layer, c.d_model, c.d_state, c.d_conv, c.expand, c.block_size) < 1 or min(c.dt_rank, c.n_pos) < 0:
            raise ValueError("mamba: n_layer, d_model, d_state, d_conv, expand and block_size must be >= 1, "
                             "dt_rank and n_pos >= 0")
        if c.vocab_size < 1 and c.n_features < 1:
            raise ValueError("mamba: the input size must be >= 1 (vocab_size for tokens or n_features for reals)")
        self.config = c
        self.tied = bool(c.tie_head and c.vocab_size and c.answer_offset is not None and not c.gaussian)
        if self.tied and not 0 <= c.answer_offset <= c.vocab_size - c.n_classes:
            raise ValueError(f"mamba: answer tokens {c.answer_offset}..{c.answer_offset + c.n_classes - 1} "
                             f"lie outside the vocabulary of {c.vocab_size}")
        # real-valued inputs enter through a linear read-in instead of a token table
        self.wte = nn.Embedding(c.vocab_size, c.d_model) if c.vocab_size else nn.Linear(c.n_features, c.d_model)
        self.wpe = nn.Embedding(c.n_pos or c.block_size, c.d_model) if c.pos == "learned" else None
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
        if c.pos == "learned" and not c.n_pos and T > c.block_size:
            raise ValueError(f"sequence length {T} exceeds the model's position table block_size={c.block_size}")
        # on a GPU the embedding's own assert fires: a check there would make every step wait for the device
        if c.vocab_size and x.device.type == "cpu" and not torch.compiler.is_compiling() and x.numel():
            if not 0 <= x.min() <= x.max() < c.vocab_size:
                raise ValueError(f"token ids must lie in [0, {c.vocab_size}), got {x.min().item()}..{x.max().item()}")
        h = self.wte(x)  # (B, T, d_model)
        if self.wpe is not None:  # with n_pos, every position from n_pos - 1 on reads the same (trained) row
            h = h + self.wpe(torch.arange(T, device=h.device).clamp(max=self.wpe.num_embeddings - 1))
        layers = []
        for i, block in enumerate(self.blocks):
            record = {"x": h} if return_internals else None
            if i not in skip_layers:
                h = block(h, record)
            layers.append(record)
        h = self.norm_f(h)
        # (B, T, C) logits (tied: against the C answer tokens' embeddings), or (B, T, 2) = (mean, log-variance)
        out = h @ self.wte.weight[c.answer_offset:c.answer_offset + c.n_classes].T if self.tied else self.head(h)
        return (out, dict(layers=layers, final=h)) if return_internals else out


class Block(nn.Module):

    def __init__(self, config):
        super().__init__()
        self.norm, self.mixer = make_norm(config), MambaMixer(config)

    def forward(self, x, record=None):
        return x + self.mixer(self.norm(x), record)  # pre-norm residual (official: fused add -> norm, the same sum)


class MambaMixer(nn.Module):
    """Figure 3: in_proj -> (x, z); x -> causal conv -> SiLU -> selective SSM (+ D x); * SiLU(z); out_proj."""

    def __init__(self, config):
        super().__init__()
        c = config
        default_scan("cpu")  # a bad WINDTUNNEL_SCAN fails when the model is built, not at its first step
        d_in, N, self.dt_rank = c.expand * c.d_model, c.d_state, c.dt_rank or math.ceil(c.d_model / 16)
        self.d_state = N
        self.scan = None if c.scan == "auto" else c.scan
        self.untraced_scan = untraced(selective_scan)
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
        # the authors' variant normalises y = C h per token (before + D x and the gate); the official block does
        # not, so it is an option: the scan without D and the gate, the norm, then the skip and the gate
        self.y_norm = nn.LayerNorm(d_in) if c.y_norm else None
        self.A_log._no_weight_decay = self.D._no_weight_decay = True  # train.py exempts these from decay
        if c.mimetic:
            # y_t = sum_s C_t.(the decays from s to t) Δ_s B_s x_s is linear attention with query C_t and key Δ_s B_s:
            # with C's projection equal to B's, C_t.B_s is largest where the conv outputs match (a query finds its
            # own key), and with A = -0.01 and Δ in its initial range (<= 0.1) a state keeps over 60% of itself
            # across 500 steps
            with torch.no_grad():
                self.x_proj.weight[self.dt_rank + N:] = self.x_proj.weight[self.dt_rank:self.dt_rank + N]
                self.A_log.fill_(math.log(0.01))

    def forward(self, x, record=None):
        x, z = rearrange(self.in_proj(x), "b l d -> b d l").chunk(2, dim=1)  # (B, d_in, L) each
        x = F.silu(causal_conv(x, self.conv1d))
        dt, B, C = self.x_proj(rearrange(x, "b d l -> b l d")).split([self.dt_rank, self.d_state, self.d_state], -1)
        # Δ = softplus(dt_proj(dt)): the bias and the softplus are applied inside the scan, in float32 (as
        # the official kernel does), so that under bf16 autocast Δ is not rounded before the exponential
        delta = rearrange(dt @ self.dt_proj.weight.T, "b l d -> b d l")
        A = -torch.exp(self.A_log)  # (d_in, N), parameters stay float32 under autocast
        B_, C_ = rearrange(B, "b l n -> b n l"), rearrange(C, "b l n -> b n l")
        if self.y_norm is None:
            y = self.untraced_scan(x, delta, A, B_, C_, self.D, z, delta_bias=self.dt_proj.bias,
                                   delta_softplus=True, mode=self.scan)
        else:
            y = self.untraced_scan(x, delta, A, B_, C_, delta_bias=self.dt_proj.bias, delta_softplus=True,
                                   mode=self.scan)
            y = gate(rearrange(self.y_norm(rearrange(y, "b d l -> b l d")), "b l d -> b d l"), x, self.D[:, None], z)
        if record is not None:
            record.update(delta=F.softplus(delta + self.dt_proj.bias[:, None]).transpose(1, 2), B=B, C=C)
        return self.out_proj(rearrange(y, "b d l -> b l d"))


def causal_conv(x, conv):
    """The causal depthwise conv on x (b, d, l): output t sees inputs t - d_conv + 1 .. t. Compiled, as d_conv
    shifted products: inductor's conv backward fixes the length, a graph per length past dynamo's limit."""
    L = x.shape[-1]
    if not torch.compiler.is_compiling():
        return conv(x)[..., :L]
    K, w, xp = conv.kernel_size[0], conv.weight[:, 0].to(x.dtype), F.pad(x, (conv.kernel_size[0] - 1, 0))
    out = sum(w[:, k, None] * xp[..., k:k + L] for k in range(K))  # out_t = sum_k w_k x_{t - K + 1 + k}
    return out if conv.bias is None else out + conv.bias.to(x.dtype)[:, None]


# -----------------------------------------------------------------------------
# the selective scan


def selective_scan_ref(u, delta, A, B, C, D=None, z=None):
    """The selective scan as a plain loop over time, with Δ given (the official `selective_scan_ref`): what
    every mode below computes. Autograd would keep each step's state (b, d_in, n), so the model runs
    SelectiveScan instead. u, delta, z (b, d_in, l); A (d_in, n); B, C (b, n, l) -> y (b, d_in, l), last h."""
    h, ys = u.new_zeros(*u.shape[:2], A.shape[1]), []
    for t in range(u.shape[-1]):
        deltaA = torch.exp(delta[..., t, None] * A)  # Ā_t = exp(Δ_t A), eq. (4)
        deltaB_u = (delta[..., t] * u[..., t])[..., None] * B[:, None, :, t]  # B̄_t x_t = Δ_t B_t x_t
        h = deltaA * h + deltaB_u  # eq. (2a)
        ys.append((h * C[:, None, :, t]).sum(-1))  # y_t = C_t h_t, eq. (2b)
    y = torch.stack(ys, -1) + (0 if D is None else u * D[:, None])
    return (y if z is None else y * F.silu(z)), h


SCAN_MODES = ("sequential", "compiled", "chunked")
# mode=None: "compiled" on a CPU (eager where compiling fails), "chunked" elsewhere. WINDTUNNEL_SCAN sets
# the CPU's mode instead (the tests run "sequential": compiling again for each new shape is slow)
DEFAULT_SCAN = {"cpu": os.environ.get("WINDTUNNEL_SCAN") or "compiled"}


def default_scan(device_type):
    """The scan mode for a device; a bad WINDTUNNEL_SCAN is refused here, where a Mamba is built or run,
    so that it stops no script that uses no Mamba."""
    mode = DEFAULT_SCAN.get(device_type, "chunked")
    if mode not in SCAN_MODES:
        raise ValueError(f"WINDTUNNEL_SCAN={mode!r}: valid modes are {', '.join(SCAN_MODES)}")
    return mode
# steps between the states kept for the backward; "chunked" also runs each block of them at once, on
# (chunk, b, d, n) tensors: its memory grows with the chunk, its kernel launches with l / sqrt(chunk)
DEFAULT_CHUNK = {"sequential": 16, "compiled": 16, "chunked": 32}


def selective_scan(u, delta, A, B, C, D=None, z=None, delta_bias=None, delta_softplus=False,
                   return_last_state=False, mode=None, chunk=None):
    """y (b, d, l) = SSM(u) with h_t = exp(Δ_t A) h_{t-1} + Δ_t B_t u_t, y_t = C_t h_t (+ D u_t) (* SiLU(z_t)).

    Shapes: u, delta, z (b, d, l); A (d, n); B, C (b, n, l); D, delta_bias (d,). delta, B, C and z must
    have u's dtype. A, D and delta_bias may have any floating dtype: they are parameters and stay
    float32 under autocast. The maths runs in float32, or in float64 for float64 inputs (the reference
    would round those to float32). y comes back in u's dtype. With return_last_state it also returns
    h at the last step, (b, d, n), in the compute dtype, as the reference does. `chunk`: the steps
    between the states kept for the backward (SelectiveScan; None: DEFAULT_CHUNK's for the mode); it
    changes memory and speed, not results.
    """
    _check_scan_inputs(u, delta, A, B, C, D, z, delta_bias, mode, chunk)
    mode = mode or default_scan(u.device.type)
    chunk = chunk or DEFAULT_CHUNK[mode]
    dtype_in, dtype = u.dtype, torch.promote_types(u.dtype, torch.float32)
    with torch.autocast(u.device.type, enabled=False):  # bf16 autocast must not reach the recurrence
        first = lambda t, p: None if t is None else rearrange(t.to(dtype), p)  # time-first views
        # u, delta, B, C contiguous: each step then reads whole blocks of memory; z stays a view
        y, last_state = SelectiveScan.apply(
            *(first(t, "b d l -> l b d").contiguous() for t in (u, delta)), A.to(dtype),
            *(first(t, "b n l -> l b n").contiguous() for t in (B, C)),
            None if D is None else D.to(dtype), first(z, "b d l -> l b d"),
            None if delta_bias is None else delta_bias.to(dtype), delta_softplus, chunk, mode)
        y = rearrange(y, "l b d -> b d l")
    y = y.to(dtype_in)
    return (y, last_state) if return_last_state else y


@functools.cache
def untraced(fn):
    """fn (the model's scan) as torch.compile of the model (train.py --compile) leaves it out of its graphs: traced,
    the loop over time unrolls into a graph per sequence length, so a curriculum or several evaluation lengths
    recompiled it past dynamo's limit. Left out, the graphs around it take a new length as dynamic from the second on
    (dynamo's automatic dynamic shapes). Outside torch.compile it is fn itself; the "compiled" mode compiles its own
    step, whose shapes do not depend on the length. Made as a Mamba is built, not as this file is imported:
    torch.compiler.disable imports torch._dynamo, a second of the start of every process, most of which build none."""
    return torch.compiler.disable(fn)


def _check_scan_inputs(u, delta, A, B, C, D, z, delta_bias, mode, chunk):
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
    if chunk is not None and (isinstance(chunk, bool) or not isinstance(chunk, int) or chunk < 1):
        fail(f"chunk must be None or an int >= 1, got {chunk!r}")
    if mode is not None and mode not in SCAN_MODES:
        fail(f"unknown mode {mode!r}; valid: None (per device), {', '.join(SCAN_MODES)}")


class SelectiveScan(torch.autograd.Function):
    """y_t = C_t h_t with h_t = exp(Δ_t A) h_{t-1} + Δ_t B_t u_t (eq. 2a, 2b, 4), storing no per-step states.

    Inputs are time-first: u, delta (l, b, d); A (d, n); B, C (l, b, n); D, delta_bias (d,); z (l, b, d).
    Returns (y + D u) SiLU(z) (l, b, d), with Δ = softplus(delta + delta_bias), and the last state
    (b, d, n); the skip, gate, bias and softplus are inside, as in the official kernel, so that a
    layer keeps one copy of each input for the backward and nothing per step. Modes "sequential"
    and "compiled" (fused by torch.compile) keep the state entering every block of `chunk`
    steps: O(b d n l / chunk) per layer instead of autograd's O(b d n l). The backward walks the
    blocks from the last: it recomputes a block's states from its entering state, then runs the
    adjoint recurrence backwards in time,
        g_t = dL/dh_t = C_t dL/dy_t + exp(Δ_{t+1} A) g_{t+1},
    and reads each step's gradients off h_{t-1}, h_t and g_t:
        dL/dC_t = Σ_d dL/dy_t h_t,   dL/d(Δ_t u_t) = Σ_n g_t B_t,   dL/dB_t = Σ_d g_t Δ_t u_t,
        dL/d(Δ_t A) = g_t h_{t-1} exp(Δ_t A)  (-> Δ_t through A, A through Δ_t).
    Every tensor in the loops is one step's (b, d, n) slice, small enough to stay in cache.
    Mode "chunked" (for GPUs) keeps the same states, but runs each block at once on (chunk, b, d, n)
    tensors, with `linear_scan`'s parallel form forwards and backwards in time, and the skip, gate and
    softplus block by block too: nothing of size (l, b, d, n) is ever made, and y is recomputed.
    """

    @staticmethod
    def forward(ctx, u, delta, A, B, C, D, z, delta_bias, softplus, chunk, mode):
        ctx.chunk, ctx.mode, ctx.softplus = chunk, mode, softplus
        if mode == "chunked":  # y is recomputed block by block in the backward
            out, last, starts = scan_chunks(u, delta, A, B, C, D, z, delta_bias, softplus, chunk)
            y = None
        else:
            ops = OPS[mode]
            y, last, starts = scan_blocks(u, ops["step_sizes"](delta, delta_bias, softplus), A, B, C, chunk, mode)
            out = ops["gate"](y, u, D, z)
        ctx.save_for_backward(u, delta, A, B, C, D, z, delta_bias, starts, y if z is not None else None)
        return out, last

    @staticmethod
    @torch.autograd.function.once_differentiable
    def backward(ctx, g_out, g_last):
        with torch.autocast(g_out.device.type, enabled=False):  # float32 maths, as in the forward
            u, delta, A, B, C, D, z, delta_bias, starts, y = ctx.saved_tensors
            b, d, n = *u.shape[1:], A.shape[1]
            g = u.new_zeros(b, d, n) if g_last is None else g_last.to(u.dtype)  # dL/dh_l from the last state
            gy = torch.zeros_like(u) if g_out is None else g_out.to(u.dtype)
            if ctx.mode == "chunked":
                return *scan_chunks_backward(u, delta, A, B, C, D, z, delta_bias, ctx.softplus, gy, g, starts,
                                             ctx.chunk), None, None, None
            ops = OPS[ctx.mode]
            gy, g_z, g_D = ops["gate_backward"](gy, y, u, D, z)
            gy = gy.contiguous()  # as u and delta: a view's strides change with the length (a graph per length)
            dt = ops["step_sizes"](delta, delta_bias, ctx.softplus)
            gu, gdt, gA, gB, gC = scan_blocks_backward(u, dt, A, B, C, gy, g, starts, ctx.chunk, ctx.mode)
            if D is not None:
                gu += gy * D
            g_delta, g_bias = ops["delta_backward"](gdt, delta, delta_bias, ctx.softplus)
            return gu, g_delta, gA, gB, gC, g_D, g_z, g_bias, None, None, None


def step_sizes(delta, delta_bias, softplus):
    """Δ = softplus(delta + delta_bias), each part optional (the official kernel's options)."""
    delta = delta if delta_bias is None else delta + delta_bias
    return F.softplus(delta) if softplus else delta


def gate(y, u, D, z):
    """The block's y + D u (the skip), times SiLU(z) (the gate)."""
    y = y if D is None else y + u * D
    return y if z is None else y * F.silu(z)


def gate_backward(gy, y, u, D, z):
    """From dL/d(gate's output): dL/dy, and the gradients of z and D (None where absent)."""
    g_D = g_z = None
    if z is not None:  # out = (y + D u) SiLU(z); SiLU'(z) = σ(z) (1 + z (1 - σ(z)))
        s = torch.sigmoid(z)
        g_z = gy * gate(y, u, D, None) * s * (1 + z * (1 - s))
        gy = gy * z * s
    if D is not None:
        g_D = (gy * u).sum((0, 1))
    return gy, g_z, g_D


def delta_backward(gdt, delta, delta_bias, softplus):
    """From dL/dΔ: the gradients of delta and delta_bias (None where absent), through step_sizes."""
    g_delta = gdt * torch.sigmoid(delta if delta_bias is None else delta + delta_bias) if softplus else gdt
    return g_delta, None if delta_bias is None else g_delta.sum((0, 1))


def scan_step(h, dt, u, B, C, A):
    """One step of the recurrence on (b, d, n): h_t = exp(Δ_t A) h_{t-1} + Δ_t u_t B_t, y_t = C_t h_t."""
    h = torch.exp(dt[..., None] * A) * h + (dt * u)[..., None] * B[:, None]
    return h, (h * C[:, None]).sum(-1)


def adjoint_step(g, gy, h, h_prev, dt, u, B, C, A):
    """One step back (SelectiveScan's docstring), from g = exp(Δ_{t+1} A) g_{t+1}: the carry exp(Δ_t A) g_t
    and the step's gradients of u, Δ, B, C, and of A summed over the batch."""
    dA = torch.exp(dt[..., None] * A)
    g = g + gy[..., None] * C[:, None]  # g_t
    g_du = (g * B[:, None]).sum(-1)  # dL/d(Δ_t u_t)
    g_dA = g * h_prev * dA  # dL/d(Δ_t A)
    return (g * dA, g_du * dt, (g_dA * A).sum(-1) + g_du * u, (g * (dt * u)[..., None]).sum(1),
            (gy[..., None] * h).sum(1), (g_dA * dt[..., None]).sum(0))


class Fused:
    """fn through torch.compile, which fuses a step's dozen elementwise passes over (b, d, n) into one
    loop; fn itself (eager) from the first time compiling fails, e.g. where no C++ compiler is found."""

    def __init__(self, fn):
        self.fn, self.compiled = fn, None

    def __call__(self, *args):
        if self.compiled is not self.fn:  # until compiling fails
            try:
                with warnings.catch_warnings():  # torch's own as it compiles (torch.jit's deprecation as it imports
                    warnings.simplefilter("ignore")  # inductor, dynamo reading .grad as it traces), not this file's
                    self.compiled = self.compiled or torch.compile(self.fn)
                    return self.compiled(*args)
            except Exception as e:
                warnings.warn(f"mamba: torch.compile of the scan step failed ({type(e).__name__}); running it eager")
                self.compiled = self.fn
        return self.fn(*args)


# what the sequential modes run: the steps, and the passes over (l, b, d) around the loop, which "compiled" fuses
# too (eager, the gate's backward alone makes a dozen passes over memory, some across z's transposed layout)
OPS = {"sequential": dict(step=scan_step, adjoint=adjoint_step, step_sizes=step_sizes, gate=gate,
                          gate_backward=gate_backward, delta_backward=delta_backward)}
OPS["compiled"] = {name: Fused(fn) for name, fn in OPS["sequential"].items()}


def scan_blocks(u, delta, A, B, C, chunk, mode):
    """SelectiveScan's sequential forward: y (l, b, d), the last state and the state entering every block."""
    step = OPS[mode]["step"]
    (l, b, d), n = u.shape, A.shape[1]
    h, starts, y = u.new_zeros(b, d, n), [], torch.empty_like(u)
    for t in range(l):
        if t % chunk == 0:
            starts.append(h)
        h, y[t] = step(h, delta[t], u[t], B[t], C[t], A)
    return y, h, torch.stack(starts)


def scan_blocks_backward(u, delta, A, B, C, gy, g, starts, chunk, mode):
    """SelectiveScan's sequential backward: recompute each block from its entering state, then step back."""
    step, adjoint = OPS[mode]["step"], OPS[mode]["adjoint"]
    gu, gdelta, gB, gC = (torch.empty_like(t) for t in (u, delta, B, C))
    gA = torch.zeros_like(A)
    for i in reversed(range(len(starts))):
        steps = range(i * chunk, min((i + 1) * chunk, u.shape[0]))
        hs, h = [], starts[i]
        for t in steps:
            hs.append(h)
            h, _ = step(h, delta[t], u[t], B[t], C[t], A)
        for t, h_prev in zip(reversed(steps), reversed(hs)):
            g, gu[t], gdelta[t], gB[t], gC[t], gA_t = adjoint(g, gy[t], h, h_prev, delta[t], u[t], B[t], C[t], A)
            gA += gA_t
            h = h_prev
    return gu, gdelta, gA, gB, gC


def scan_chunks(u, delta, A, B, C, D, z, delta_bias, softplus, chunk):
    """SelectiveScan's chunked forward: each block of `chunk` steps at once from its entering state, the
    blocks one after another. Returns the gated output (l, b, d), the last state, the state entering each block."""
    (l, b, d), n = u.shape, A.shape[1]
    h, starts, out = u.new_zeros(b, d, n), [], torch.empty_like(u)
    for s in (slice(t, t + chunk) for t in range(0, l, chunk)):
        starts.append(h)
        dt = step_sizes(delta[s], delta_bias, softplus)
        H = linear_scan(torch.exp(dt[..., None] * A), (dt * u[s])[..., None] * B[s, :, None], h)  # (chunk, b, d, n)
        h = H[-1].clone()  # not a view: H goes with this block
        out[s] = gate((H @ C[s, ..., None]).squeeze(-1), u[s], D, None if z is None else z[s])
    return out, h, torch.stack(starts)


def scan_chunks_backward(u, delta, A, B, C, D, z, delta_bias, softplus, gy_out, g, starts, chunk):
    """SelectiveScan's chunked backward: the blocks from the last, each at once: recompute its states from its
    entering state, then the adjoint recurrence (SelectiveScan's docstring) backwards through it."""
    gu, gdelta, gB, gC = (torch.empty_like(t) for t in (u, delta, B, C))
    g_z = None if z is None else torch.empty_like(z)
    gA, g_D, g_bias = torch.zeros_like(A), None if D is None else 0, None if delta_bias is None else 0
    for i in reversed(range(len(starts))):
        s = slice(i * chunk, (i + 1) * chunk)
        dt = step_sizes(delta[s], delta_bias, softplus)
        dA = torch.exp(dt[..., None] * A)  # (chunk, b, d, n)
        H = linear_scan(dA, (dt * u[s])[..., None] * B[s, :, None], starts[i])
        y = None if z is None else (H @ C[s, ..., None]).squeeze(-1)
        gy, g_z_s, g_D_s = gate_backward(gy_out[s], y, u[s], D, None if z is None else z[s])
        # g_t = C_t gy_t + exp(Δ_{t+1} A) g_{t+1}; past the block's end, g (the carry) is already multiplied
        a_next = torch.exp(torch.cat([dt[1:], torch.zeros_like(dt[:1])])[..., None] * A)
        g_h = linear_scan(a_next, gy[..., None] * C[s, :, None], g, reverse=True)  # g_t = dL/dh_t (chunk, b, d, n)
        del a_next
        gC[s] = (gy[:, :, None] @ H).squeeze(-2)
        g_du = (g_h @ B[s, ..., None]).squeeze(-1)  # dL/d(Δ_t u_t)
        gB[s] = ((dt * u[s])[:, :, None] @ g_h).squeeze(-2)
        g = dA[0] * g_h[0]  # the carry into the block before
        g_a = g_h  # dL/da_t = g_t h_{t-1} with a_t = exp(Δ_t A), made in g_h's memory (g_h is not read again):
        g_a[1:].mul_(H[:-1])  # h_{t-1} is the block's state one step back,
        g_a[0].mul_(starts[i])  # and at its first step the state entering it
        g_dA = g_a.mul_(dA)  # dL/d(Δ_t A) = dL/da_t a_t = g_t h_{t-1} exp(Δ_t A), in the same memory
        del H
        gu[s] = g_du * dt + (0 if D is None else gy * D)
        gdt = g_du * u[s] + (g_dA * A).sum(-1)
        gA += torch.einsum("tbdn,tbd->dn", g_dA, dt)
        gdelta[s], g_bias_s = delta_backward(gdt, delta[s], delta_bias, softplus)
        if z is not None:
            g_z[s] = g_z_s
        if D is not None:
            g_D = g_D + g_D_s
        if delta_bias is not None:
            g_bias = g_bias + g_bias_s
    return gu, gdelta, gA, gB, gC, g_D, g_z, g_bias


def linear_scan(a, x, h, reverse=False):
    """Every state of h_t = a_t h_{t-1} + x_t (t = 1..T) from h_0 = h, in about 2 sqrt(T) sequential steps.

    a, x (T, b, d, n), h (b, d, n); reverse=True runs backwards in time, h_t = a_t h_{t+1} + x_t from
    h_{T+1} = h. Split T into pieces of k = ceil(sqrt(T)) steps; k steps advance every piece at once
    from a zero state, keeping the local states L and the decay products P; one step per piece
    carries the true state across piece boundaries; then h = L + P * entering state. Only products of
    a_t <= 1 are formed, so nothing overflows and nothing is divided. Makes two copies of a's size.
    """
    T = x.shape[0]
    k = math.isqrt(T - 1) + 1
    pad = -T % k  # padded steps (a = 1, x = 0) at the end leave the state unchanged, in either direction
    P = torch.cat([a, a.new_ones(pad, *a.shape[1:])]).unflatten(0, (-1, k))  # (pieces, k, b, d, n)
    L = torch.cat([x, x.new_zeros(pad, *x.shape[1:])]).unflatten(0, (-1, k))
    back = 1 if reverse else -1  # the neighbour a step depends on
    for j in (range(k - 2, -1, -1) if reverse else range(1, k)):
        L[:, j].addcmul_(P[:, j], L[:, j + back])  # P[:, j] is still a_j here
        P[:, j].mul_(P[:, j + back])
    edge = 0 if reverse else -1  # each piece's state on leaving it
    enter = [h]
    for i in (range(L.shape[0] - 1, 0, -1) if reverse else range(L.shape[0] - 1)):
        enter.append(torch.addcmul(L[i, edge], P[i, edge], enter[-1]))
    return L.addcmul_(P, torch.stack(enter[::-1] if reverse else enter)[:, None]).flatten(0, 1)[:T]
