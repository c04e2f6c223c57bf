"""Tests for mamba.py: the selective scan against brute force and across modes, stability, dtypes, the model."""
from functools import partial
import math
import os
from types import SimpleNamespace

import pytest
import torch
import torch.nn.functional as F
from torch.utils._python_dispatch import TorchDispatchMode

from hardware import SCAN_NAMES as NAMES, rel_err, run_scan, scan_inputs  # the comparison `bench.py gpu` runs on a GPU
from mamba import SCAN_MODES, Mamba, MambaConfig, linear_scan, selective_scan, selective_scan_ref
import settings

torch.set_num_threads(1)


def brute_force(u, delta, A, B, C, D, z):
    """y from an explicit (l x l) matrix of decay products per (b, d, n): h_t = sum_{s<=t} M[t, s] Δ_s B_s u_s."""
    b, d, l = u.shape
    dA = [torch.exp(delta[:, :, k, None] * A) for k in range(l)]  # (b, d, n) per step
    one = torch.ones_like(dA[0])
    M = torch.zeros(b, d, A.shape[1], l, l, dtype=u.dtype)
    for t in range(l):
        for s in range(t + 1):
            prod = one
            for k in range(s + 1, t + 1):
                prod = prod * dA[k]
            M[..., t, s] = prod
    x = delta[:, :, None, :] * B[:, None] * u[:, :, None, :]  # (b, d, n, l)
    h = (M @ x[..., None]).squeeze(-1)  # (b, d, n, l)
    y = (h * C[:, None]).sum(2) + D[:, None] * u
    return y * F.silu(z), h[..., -1]


@pytest.mark.parametrize("mode", SCAN_MODES)
def test_scan_matches_brute_force(mode):
    x = scan_inputs(2, 3, 4, 6)
    y, last = selective_scan(**x, delta_softplus=True, return_last_state=True, mode=mode)
    delta = F.softplus(x["delta"] + x["delta_bias"][:, None])
    y_ref, last_ref = brute_force(x["u"], delta, x["A"], x["B"], x["C"], x["D"], x["z"])
    torch.testing.assert_close(y, y_ref, rtol=1e-12, atol=1e-12)
    torch.testing.assert_close(last, last_ref, rtol=1e-12, atol=1e-12)


def test_reference_loop_matches_brute_force():
    x = scan_inputs(2, 3, 4, 6)
    delta = F.softplus(x["delta"] + x["delta_bias"][:, None])
    args = x["u"], delta, x["A"], x["B"], x["C"], x["D"], x["z"]
    for got, want in zip(selective_scan_ref(*args), brute_force(*args)):
        torch.testing.assert_close(got, want, rtol=1e-12, atol=1e-12)


@pytest.mark.parametrize("dtype,l,tol", [(torch.float64, 1, 1e-12), (torch.float64, 7, 1e-12),
                                         (torch.float64, 50, 1e-12), (torch.float64, 130, 1e-12),
                                         (torch.float32, 7, 1e-5), (torch.float32, 50, 1e-5),
                                         (torch.float32, 130, 1e-5)])
def test_chunked_matches_sequential(dtype, l, tol):
    # blocks of 1, 3, 16, 32 (the default) and 200 steps: none of 7, 50, 130 is a multiple of 3, 16 or 32, so
    # the last block is short; within a block linear_scan's pieces of ceil(sqrt(block)) steps are padded too
    x = scan_inputs(2, 5, 4, l, dtype)
    seq = run_scan(x, "sequential")
    for chunk in (1, 3, 16, None, 200):
        par = run_scan(x, "chunked", chunk=chunk)
        for k in seq:
            assert rel_err(par[k], seq[k]) < tol, (chunk, k)


class LargestTensor(TorchDispatchMode):
    """Records the most elements of any tensor an op returns (forward and backward)."""

    def __init__(self):
        super().__init__()
        self.numel = 0

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        out = func(*args, **(kwargs or {}))
        for t in out if isinstance(out, (tuple, list)) else [out]:
            self.numel = max(self.numel, t.numel() if isinstance(t, torch.Tensor) else 0)
        return out


def test_chunked_memory_does_not_grow_with_the_length():
    # d and n > l / chunk, so that the (l, b, d) and (l, b, n) inputs and outputs are smaller than a block's
    # (chunk, b, d, n) tensors (padded to whole pieces of linear_scan: 9 steps) and than the l / chunk states kept
    # for the backward; nothing has the l (b, d, n) states of the whole sequence
    b, d, n, chunk = 1, 40, 40, 8
    for l in (128, 256):
        with LargestTensor() as spy:
            run_scan(scan_inputs(b, d, n, l, torch.float32), "chunked", chunk=chunk)
        assert spy.numel <= max(9, l // chunk) * b * d * n <= l * b * d * n / 8, (l, spy.numel)


def reference_scan(u, delta, A, B, C, D=None, z=None, delta_bias=None, delta_softplus=False):
    """The official selective_scan_ref as a plain loop: autograd stores every step's state."""
    if delta_bias is not None:
        delta = delta + delta_bias[:, None]
    if delta_softplus:
        delta = F.softplus(delta)
    h, ys = u.new_zeros(*u.shape[:2], A.shape[1]), []
    for t in range(u.shape[-1]):
        h = torch.exp(delta[..., t, None] * A) * h + (delta[..., t] * u[..., t])[..., None] * B[:, None, :, t]
        ys.append((h * C[:, None, :, t]).sum(-1))
    y = torch.stack(ys, -1) + (0 if D is None else u * D[:, None])
    return (y if z is None else y * F.silu(z)), h


@pytest.mark.parametrize("mode", SCAN_MODES)
@pytest.mark.parametrize("l,chunk", [(1, 16), (7, 3), (16, 16), (17, 16), (50, 4), (50, 64)])
@pytest.mark.parametrize("options", ["all", "none", "D", "z", "bias", "softplus"])
def test_scan_function_matches_autograd_loop(mode, l, chunk, options):
    # outputs and the gradients of every input (and through the last state) against the stored-state loop
    x = scan_inputs(2, 3, 4, l)
    keep = {"all": ("D", "z", "delta_bias"), "none": (), "D": ("D",), "z": ("z",), "bias": ("delta_bias",),
            "softplus": ()}[options]
    x = {k: v.requires_grad_() for k, v in x.items() if k in ("u", "delta", "A", "B", "C") + keep}
    softplus = options in ("all", "softplus")
    if not softplus:
        x["delta"] = x["delta"].detach().exp().requires_grad_()  # Δ > 0 without the softplus
    gy, gl = torch.randn(2, 3, l, dtype=torch.float64), torch.randn(2, 3, 4, dtype=torch.float64)
    outs = []
    for f in (reference_scan, lambda **k: selective_scan(**k, return_last_state=True, mode=mode, chunk=chunk)):
        y, last = f(**x, delta_softplus=softplus)
        outs.append((y, last, *torch.autograd.grad((y * gy).sum() + (last * gl).sum(), list(x.values()))))
    for got, want in zip(*outs):
        torch.testing.assert_close(got, want, rtol=1e-12, atol=1e-12)


def test_scan_stores_no_per_step_states():
    # what autograd keeps for the backward: the inputs and one state per chunk, not one per step
    b, d, n, l = 2, 32, 32, 64
    x = {k: v.requires_grad_() for k, v in scan_inputs(b, d, n, l, torch.float32).items()}
    for mode in SCAN_MODES:
        saved = []
        with torch.autograd.graph.saved_tensors_hooks(lambda t: saved.append(t.numel()) or t, lambda t: t):
            selective_scan(**x, delta_softplus=True, mode=mode, chunk=16)
        assert sum(saved) < b * d * n * l / 2, (mode, sum(saved))  # one full set of per-step states: b d n l


@pytest.mark.parametrize("reverse", [False, True])
def test_linear_scan_matches_loop(reverse):
    g = torch.Generator().manual_seed(0)
    for T in (1, 2, 5, 9, 10, 17):
        a, x, h0 = (torch.rand(T, 2, 3, 4, generator=g, dtype=torch.float64),
                    torch.randn(T, 2, 3, 4, generator=g, dtype=torch.float64),
                    torch.randn(2, 3, 4, generator=g, dtype=torch.float64))
        want, h = torch.empty_like(x), h0
        for t in (reversed(range(T)) if reverse else range(T)):
            h = want[t] = a[t] * h + x[t]
        torch.testing.assert_close(linear_scan(a, x, h0, reverse=reverse), want, rtol=1e-12, atol=1e-12)


class ExpSpy(TorchDispatchMode):
    """Records the largest argument of every exp and exp_ dispatched (forward and backward)."""

    def __init__(self):
        super().__init__()
        self.max_arg = -math.inf

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        if func.overloadpacket in (torch.ops.aten.exp, torch.ops.aten.exp_):
            self.max_arg = max(self.max_arg, args[0].max().item())
        return func(*args, **(kwargs or {}))


@pytest.mark.parametrize("mode", SCAN_MODES)
def test_long_sequence_is_finite(mode):
    # L = 4096 with Δ spread over [~0, ~20] and A down to -20: summed decays reach e^-1e5 and underflow
    x = scan_inputs(1, 2, 3, 4096, torch.float32, delta_scale=4.0)
    x["A"] = x["A"] * 3
    with ExpSpy() as spy:
        out = run_scan(x, mode)
    for k, v in out.items():
        assert torch.isfinite(v).all(), k
    assert spy.max_arg <= 0.0  # no exp of a positive number, forward or backward
    if mode == "chunked":
        ref = run_scan(x, "sequential")
        assert rel_err(out["y"], ref["y"]) < 1e-5 and rel_err(out["last"], ref["last"]) < 1e-5


@pytest.mark.parametrize("mode", SCAN_MODES)
def test_bf16_inputs_compute_in_float32(mode):
    x = scan_inputs(2, 4, 3, 20, torch.float32)
    # A, D, bias stay float32
    low = {k: v.bfloat16() if k in ("u", "delta", "B", "C", "z") else v for k, v in x.items()}
    y, last = selective_scan(**low, delta_softplus=True, return_last_state=True, mode=mode)
    up = {k: v.float() for k, v in low.items()}
    y32, last32 = selective_scan(**up, delta_softplus=True, return_last_state=True, mode=mode)
    assert y.dtype == torch.bfloat16 and last.dtype == torch.float32
    torch.testing.assert_close(last, last32, rtol=1e-6, atol=1e-6)  # same float32 maths on the same values
    assert rel_err(y, y32) < 1e-2  # only the final rounding to bf16 differs


def test_bad_scan_inputs_raise():
    x = scan_inputs(2, 3, 4, 5, torch.float32)
    bad = [dict(u=x["u"][0]), dict(delta=x["delta"][:, :2]), dict(A=x["A"][:, :0]), dict(A=x["A"][None]),
           dict(B=x["B"][:, :3]), dict(C=x["C"][..., :4]), dict(D=x["D"][:2]), dict(z=x["z"][:1]),
           dict(delta_bias=x["delta_bias"][None]), dict(delta=x["delta"].double()), dict(B=x["B"].bfloat16()),
           dict(u=x["u"].long()), dict(A=x["A"].to(torch.complex64)), dict(C=x["C"].to("meta")), dict(mode="pscan")]
    for change in bad:
        with pytest.raises(ValueError):
            selective_scan(**(x | change))


# -----------------------------------------------------------------------------
# the model


def tiny_config(**kw):
    return MambaConfig(**dict(dict(vocab_size=12, n_classes=5, answer_offset=7, d_model=16, n_layer=2, d_state=4),
                              **kw))


def block_params(d_model, d_state, d_conv, expand, norm_params):
    d_in, R = expand * d_model, math.ceil(d_model / 16)
    return (d_model * 2 * d_in  # in_proj
            + d_in * d_conv + d_in  # conv1d weight and bias
            + d_in * (R + 2 * d_state)  # x_proj -> (Δ, B, C)
            + R * d_in + d_in  # dt_proj weight and bias
            + d_in * d_state + d_in  # A_log, D
            + d_in * d_model  # out_proj
            + norm_params)


def test_parameter_count():
    # d_model 64, N 16, d_conv 4, expand 2: d_in 128, R 4; by hand 16384 + 640 + 4608 + 640 + 2048 + 128 + 8192 + 64
    assert block_params(64, 16, 4, 2, 64) == 32704
    m = Mamba(MambaConfig(vocab_size=40, n_classes=20, answer_offset=20, d_model=64, n_layer=3))
    assert sum(p.numel() for p in m.blocks[0].parameters()) == 32704
    assert m.num_params() == 40 * 64 + 3 * 32704 + 64  # tied head: no head parameters
    m = Mamba(MambaConfig(n_features=10, gaussian=True, d_model=32, n_layer=2, norm="layernorm", pos="learned",
                          block_size=50))
    assert m.num_params() == (10 * 32 + 32) + 50 * 32 + 2 * block_params(32, 16, 4, 2, 64) + 64 + (32 * 2 + 2)


def test_official_init():
    m = Mamba(tiny_config(d_model=48))
    mixer = m.blocks[0].mixer
    torch.testing.assert_close(mixer.A_log, torch.log(torch.arange(1.0, 5.0)).repeat(96, 1))
    assert torch.equal(mixer.D, torch.ones(96)) and mixer.dt_rank == 3
    dt = F.softplus(mixer.dt_proj.bias)
    assert dt.min() >= 1e-3 * (1 - 1e-5) and dt.max() <= 1e-1 * (1 + 1e-5)
    assert mixer.dt_proj.weight.abs().max() <= 3 ** -0.5
    assert mixer.A_log._no_weight_decay and mixer.D._no_weight_decay


def test_mimetic_init_starts_as_linear_attention_with_query_equal_to_key():
    torch.manual_seed(0)
    m = Mamba(tiny_config(d_model=48, mimetic=True)).double()
    mixer, R, N = m.blocks[0].mixer, 3, 4
    W = mixer.x_proj.weight
    assert torch.equal(W[R + N:], W[R:R + N]) and not torch.equal(W[:R], W[R:R + N][:R])
    torch.testing.assert_close(-torch.exp(mixer.A_log), torch.full((96, N), -0.01, dtype=torch.float64))
    _, rec = m(torch.randint(0, 10, (2, 7)), return_internals=True)
    B, C = rec["layers"][0]["B"], rec["layers"][0]["C"]
    torch.testing.assert_close(B, C)  # a token's query is its key, so C_t.B_s is largest where s matches t
    assert torch.equal(Mamba(tiny_config(d_model=48)).blocks[0].mixer.A_log[0], torch.log(torch.arange(1.0, 5.0)))


@pytest.mark.parametrize("scan", SCAN_MODES)
@pytest.mark.parametrize("kind", ["tokens", "reals", "learned_pos", "n_pos_y_norm"])
def test_model_is_causal(scan, kind):
    T, g = 23, torch.Generator().manual_seed(0)
    if kind == "reals":
        config, x = tiny_config(vocab_size=0, n_features=6, gaussian=True, scan=scan), torch.randn(3, T, 6, generator=g)
    elif kind == "n_pos_y_norm":  # shared position rows past n_pos, LayerNorm on y
        config, x = (tiny_config(scan=scan, pos="learned", n_pos=5, y_norm=True),
                     torch.randint(0, 12, (3, T), generator=g))
    else:
        config = tiny_config(scan=scan, pos="learned" if kind == "learned_pos" else "none", block_size=T)
        x = torch.randint(0, 12, (3, T), generator=g)
    torch.manual_seed(0)
    model = Mamba(config).eval()
    with torch.no_grad():
        out = model(x)
        assert out.shape == (3, T, 2 if config.gaussian else 5)
        for t in (0, 7, 15, T - 2):
            x2, shape = x.clone(), x[:, t + 1:].shape
            x2[:, t + 1:] = (torch.randn(shape, generator=g) if kind == "reals"
                             else torch.randint(0, 12, shape, generator=g))
            out2 = model(x2)
            torch.testing.assert_close(out2[:, :t + 1], out[:, :t + 1], rtol=0, atol=1e-6)
            assert not torch.allclose(out2[:, t + 1:], out[:, t + 1:])


def test_model_modes_agree_and_internals():
    torch.manual_seed(0)
    model = Mamba(tiny_config())
    x = torch.randint(0, 12, (2, 30))
    out, rec = model(x, return_internals=True)
    model.blocks.apply(lambda m: setattr(m, "scan", "chunked") if hasattr(m, "scan") else None)
    torch.testing.assert_close(model(x), out, rtol=1e-5, atol=1e-5)
    assert len(rec["layers"]) == 2 and rec["final"].shape == (2, 30, 16)
    r = rec["layers"][1]
    assert (r["x"].shape == (2, 30, 16) and r["delta"].shape == (2, 30, 32)
            and r["B"].shape == r["C"].shape == (2, 30, 4))
    assert (r["delta"] > 0).all()
    skipped = model(x, skip_layers=(0, 1))
    emb = model.norm_f(model.wte(x))
    torch.testing.assert_close(skipped, emb @ model.wte.weight[7:12].T)


def test_positions_from_n_pos_on_share_the_last_learned_row():
    torch.manual_seed(0)
    model = Mamba(tiny_config(pos="learned", n_pos=6, block_size=8))
    assert model.wpe.num_embeddings == 6
    x = torch.randint(0, 12, (2, 40))  # longer than block_size: the table never runs out
    out = model(x)
    with torch.no_grad():
        model.wpe.weight[5] += 1.0  # the shared row moves every position from 5 on, and no earlier one
    moved = (model(x) - out).abs().amax((0, 2))
    assert moved[:5].max() == 0 and moved[5:].min() > 0


def test_y_norm_is_a_layernorm_on_the_ssm_output_before_skip_and_gate():
    torch.manual_seed(0)
    mixer = Mamba(tiny_config(y_norm=True)).blocks[0].mixer.double()
    with torch.no_grad():  # a non-trivial norm: not the identity init
        mixer.y_norm.weight.normal_()
        mixer.y_norm.bias.normal_()
    h = torch.randn(2, 11, 16, dtype=torch.float64, requires_grad=True)
    out = mixer(h)
    # by hand: the same projections, the scan without D and the gate, then norm, skip and gate
    L = h.shape[1]
    xz = mixer.in_proj(h).transpose(1, 2)
    x, z = xz.chunk(2, dim=1)
    x = F.silu(mixer.conv1d(x)[..., :L])
    dt, B, C = mixer.x_proj(x.transpose(1, 2)).split([mixer.dt_rank, mixer.d_state, mixer.d_state], -1)
    delta = F.softplus(dt @ mixer.dt_proj.weight.T + mixer.dt_proj.bias).transpose(1, 2)
    y, _ = brute_force(x, delta, -torch.exp(mixer.A_log), B.transpose(1, 2), C.transpose(1, 2),
                       torch.zeros_like(mixer.D), torch.full_like(z, 30.0))  # SiLU(30) = 30 to 1e-12
    y = F.layer_norm((y / 30).transpose(1, 2), (y.shape[1],), mixer.y_norm.weight, mixer.y_norm.bias).transpose(1, 2)
    ref = mixer.out_proj(((y + x * mixer.D[:, None]) * F.silu(z)).transpose(1, 2))
    torch.testing.assert_close(out, ref, rtol=1e-9, atol=1e-9)
    g = torch.randn_like(out)
    torch.testing.assert_close(torch.autograd.grad((out * g).sum(), h)[0], torch.autograd.grad((ref * g).sum(), h)[0],
                               rtol=1e-9, atol=1e-9)


def test_bf16_autocast_forward_backward():
    torch.manual_seed(0)
    model = Mamba(tiny_config())
    x = torch.randint(0, 12, (2, 17))
    ref = model(x)
    with torch.autocast("cpu", dtype=torch.bfloat16):
        out = model(x)
    out.float().sum().backward()
    assert torch.isfinite(out.float()).all() and all(torch.isfinite(p.grad).all() for p in model.parameters())
    assert rel_err(out.float(), ref) < 5e-2


def test_bad_configs_raise():
    for kw in (dict(pos="rotary"), dict(norm="batchnorm"), dict(scan="pscan"), dict(n_layer=0), dict(d_state=0),
               dict(expand=0), dict(d_conv=0), dict(dt_rank=-1), dict(n_pos=-1), dict(vocab_size=0, n_features=0),
               dict(answer_offset=10)):  # answers 10..14 outside a vocabulary of 12
        with pytest.raises(ValueError):
            Mamba(tiny_config(**kw))
    with pytest.raises(ValueError):  # longer than the learned position table
        Mamba(tiny_config(pos="learned", block_size=8))(torch.zeros(1, 9, dtype=torch.long))


def test_trains_through_train_py(tmp_path, monkeypatch):
    import presets
    import train
    monkeypatch.setitem(presets.MODELS, "mamba", (MambaConfig, Mamba))
    helps = settings.field_help(MambaConfig)
    assert all(helps.get(f) for f in MambaConfig.__dataclass_fields__), "every config field needs a # help comment"
    rc = train.main(["--task", "bijection", "--model", "mamba", "--V", "6", "--L", "5", "--d_model", "16",
                     "--n_layer", "1", "--max_iters", "3", "--log_interval", "3", "--eval_interval", "3",
                     "--eval_samples", "20", "--eval_samples_during", "20", "--out_dir", str(tmp_path)])
    assert rc == 0 and (tmp_path / "results.json").exists()


@pytest.mark.parametrize("mode", SCAN_MODES)
def test_scan_backward_runs_in_float32_under_autocast_and_compile(mode):
    # the backward's matmuls must not be cast to bf16, whether it runs inside an autocast region or is traced
    x = scan_inputs(2, 4, 3, 9, torch.float32)
    f = lambda **k: selective_scan(**k, delta_softplus=True, mode=mode).sum()
    grads = []
    for fn, ctx in ((f, torch.autocast("cpu", enabled=False)), (f, torch.autocast("cpu", dtype=torch.bfloat16)),
                    (torch.compile(f, backend="aot_eager"), torch.autocast("cpu", dtype=torch.bfloat16))):
        xx = {k: v.clone().requires_grad_() for k, v in x.items()}
        with ctx:
            fn(**xx).backward()
        grads.append([xx[k].grad for k in NAMES])
    for g in grads[1:]:
        for k, a, b in zip(NAMES, g, grads[0]):
            torch.testing.assert_close(a, b, rtol=1e-6, atol=1e-6, msg=k)


def test_a_bad_scan_mode_in_the_environment_stops_only_mamba(monkeypatch):
    import subprocess
    import sys
    import mamba
    env = dict(os.environ, WINDTUNNEL_SCAN="garbage", OMP_NUM_THREADS="1")
    root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    p = subprocess.run([sys.executable, "-c", "import train, geometry, reproduce, bench, conditioning"], cwd=root,
                       env=env, capture_output=True, text=True, timeout=300)
    assert p.returncode == 0, p.stderr
    monkeypatch.setitem(mamba.DEFAULT_SCAN, "cpu", "garbage")
    with pytest.raises(ValueError, match="WINDTUNNEL_SCAN='garbage': valid modes are sequential, compiled, chunked"):
        Mamba(MambaConfig(vocab_size=8, n_classes=4, n_layer=1, d_model=8))



def test_the_compiled_model_takes_new_lengths_without_compiling_each(monkeypatch):
    # train.py --compile under a curriculum, or hmm's several evaluation lengths: traced, the scan's loop over time
    # would unroll into a graph per length, and with a recompile limit of 2 the third length would fail compiling
    # (and the wrapper run eager). aot_eager traces the backward too, as inductor would, with no C++ compiler;
    # `bench.py gpu` runs this cell with inductor
    import hardware
    monkeypatch.setattr(torch, "compile", partial(torch.compile, backend="aot_eager"))
    cell = hardware.lengths_cell(SimpleNamespace(dry_run=True, device="cpu"), torch.device("cpu"))
    assert 0 < cell["graphs"] <= 2 * 4, cell  # the 4 pieces around the scan, compiled at most twice each
