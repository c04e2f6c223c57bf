"""Tests for linear_attn.py: the rules against the paper's equations, chunked against
recurrent (values and gradients), Theorem 5, Oja's bound, the model's causality, bad input, training."""
import json

import pytest
import torch
import torch.nn.functional as F

from conftest import loss_before_after
from linear_attn import RULES, LinearAttention, LinearAttentionConfig, memory
import settings

torch.set_num_threads(1)
CASES = [("hebbian", None), ("hebbian", 0.9), ("delta", None), ("oja", None)]  # (rule, decay)


def memory_inputs(B, H, T, d_k, d_v, dtype=torch.float64, seed=0):
    """What the model feeds the memory: unit-norm keys and values, beta in (0, 1), and a random S_0."""
    g = torch.Generator().manual_seed(seed)
    r = lambda *s: torch.randn(*s, generator=g, dtype=torch.float64)
    x = dict(q=r(B, H, T, d_k), k=F.normalize(r(B, H, T, d_k), dim=-1), v=F.normalize(r(B, H, T, d_v), dim=-1),
             beta=torch.sigmoid(r(B, H, T)), initial_state=0.5 * r(B, H, d_v, d_k))
    return {k: t.to(dtype) for k, t in x.items()}


def run_memory(x, rule, decay, mode, chunk_size=None, seed=1):
    """o, S_T and the gradients of q, k, v, beta and S_0 under random cotangents."""
    x = {k: t.detach().clone().requires_grad_() for k, t in x.items()}
    o, S = memory(x["q"], x["k"], x["v"], rule, x["beta"], decay, mode, x["initial_state"], chunk_size)
    g = torch.Generator().manual_seed(seed)
    go, gS = (torch.randn(t.shape, generator=g, dtype=torch.float64).to(t.dtype) for t in (o, S))
    grads = torch.autograd.grad((o * go).sum() + (S * gS).sum(), list(x.values()))
    return dict(o=o, S=S, **{f"grad_{k}": t for k, t in zip(x, grads)})


def rel_err(a, b):
    return ((a.double() - b.double()).norm() / b.double().norm().clamp_min(1e-30)).item()


def test_recurrent_is_the_papers_equations():
    # an independent loop with explicit matrices, in the paper's forms (§5.3, transposed to S = d_v x d_k)
    x = memory_inputs(1, 1, 9, 4, 3)
    q, k, v, beta, S0 = (t[0, 0] for t in x.values())
    I = torch.eye(4, dtype=torch.float64)
    for rule, decay in CASES:
        S, outs = S0.clone(), []
        for t in range(9):
            b, kt, vt = beta[t], k[t][:, None], v[t][:, None]  # columns
            if rule == "hebbian":
                S = (decay or 1.0) * S + b * vt @ kt.T
            elif rule == "delta":  # S (I - beta k k^T) + beta v k^T
                S = S @ (I - b * kt @ kt.T) + b * vt @ kt.T
            else:  # S - beta diag(v * v) S + beta v k^T
                S = S - b * torch.diag(v[t] * v[t]) @ S + b * vt @ kt.T
            outs.append(S @ q[t])
        o, S_T = memory(x["q"], x["k"], x["v"], rule, x["beta"], decay, "recurrent", x["initial_state"])
        torch.testing.assert_close(o[0, 0], torch.stack(outs), rtol=1e-12, atol=1e-12)
        torch.testing.assert_close(S_T[0, 0], S, rtol=1e-12, atol=1e-12)


def test_delta_with_beta_one_overwrites():
    # beta = 1 and |k| = 1: after the write, k_t retrieves exactly v_t, whatever was stored before
    x = memory_inputs(2, 2, 20, 8, 5)
    o, _ = memory(x["k"], x["k"], x["v"], "delta", 1.0, mode="recurrent", initial_state=x["initial_state"])
    torch.testing.assert_close(o, x["v"], rtol=1e-12, atol=1e-12)


@pytest.mark.parametrize("mode", ["recurrent", "chunked"])
def test_theorem_5_hebbian_is_causal_linear_attention(mode):
    # decay = beta = 1, S_0 = 0: o = (Q K^T * causal mask) V; with decay gamma the mask holds gamma^(t-s) (RetNet)
    x = memory_inputs(2, 3, 37, 6, 5)
    q, k, v = x["q"], x["k"], x["v"]
    causal = torch.ones(37, 37, dtype=torch.float64).tril()
    o, S = memory(q, k, v, "hebbian", mode=mode, chunk_size=8)
    torch.testing.assert_close(o, (q @ k.transpose(-1, -2) * causal) @ v, rtol=1e-12, atol=1e-12)
    torch.testing.assert_close(S, v.transpose(-1, -2) @ k, rtol=1e-12, atol=1e-12)  # S = sum_t v_t k_t^T
    t = torch.arange(37, dtype=torch.float64)
    gamma = 0.8 ** (t[:, None] - t[None, :]).clamp(min=0) * causal
    o, _ = memory(q, k, v, "hebbian", decay=0.8, mode=mode, chunk_size=8)
    torch.testing.assert_close(o, (q @ k.transpose(-1, -2) * gamma) @ v, rtol=1e-12, atol=1e-12)


@pytest.mark.parametrize("dtype,tol", [(torch.float64, 1e-10), (torch.float32, 1e-5)])
@pytest.mark.parametrize("T,chunk", [(50, 16), (5, 16), (1, 4), (75, None)])  # never a multiple of the chunk
@pytest.mark.parametrize("rule,decay", CASES)
def test_chunked_matches_recurrent(rule, decay, T, chunk, dtype, tol):
    x = memory_inputs(2, 3, T, 8, 6, dtype)
    rec, par = run_memory(x, rule, decay, "recurrent"), run_memory(x, rule, decay, "chunked", chunk)
    for name in rec:
        assert par[name].dtype == dtype and rel_err(par[name], rec[name]) < tol, name


def test_chunked_delta_with_the_models_positive_keys():
    # elu+1 keys, L2-normalised, are all positive and nearly parallel: the WY solve's hardest case here
    x = memory_inputs(2, 2, 300, 16, 16, torch.float32)
    x["k"] = F.normalize(F.elu(0.1 * x["k"]) + 1, dim=-1)
    x["beta"] = torch.sigmoid(torch.logit(x["beta"]) + 3)  # near 1
    rec, par = run_memory(x, "delta", None, "recurrent"), run_memory(x, "delta", None, "chunked")
    for name in rec:
        assert rel_err(par[name], rec[name]) < 1e-5, name


@pytest.mark.parametrize("mode", ["recurrent", "chunked"])
def test_oja_row_norms_stay_bounded(mode):
    # Row i of S follows s_t = a s_{t-1} + beta v_i k with a = 1 - beta v_i^2. Let x = beta v_i^2: it lies in
    # [0, 1] when beta is in (0, 1] and |v| = 1 (so |v_i| <= 1). If v_i = 0 the row is unchanged. Otherwise
    # beta |v_i| = x / |v_i|, so |s_t| <= (1 - x)|s_{t-1}| + x |k_t| / |v_i|, a convex combination:
    #     |s_t| <= max(|s_{t-1}|, |k_t| / |v_{t,i}|)   and by induction   |s_t| <= max(|s_0|, max_u |k_u| / |v_{u,i}|).
    # No bound holds uniformly in v: with v_i = eps and k fixed the row tends to k / eps. With equal-magnitude
    # values, |v_i| = d_v^-1/2, every decay factor is 1 - beta/d_v in [0, 1) and |s_t| <= max(|s_0|, sqrt(d_v)),
    # so |S_t|_F <= d_v from S_0 = 0, while Hebbian memory of a fixed binding grows linearly in t.
    B, H, T, d_k, d_v = 2, 2, 120, 6, 4
    x = memory_inputs(B, H, T, d_k, d_v)
    k = x["k"] * torch.rand(B, H, T, 1, generator=torch.Generator().manual_seed(4), dtype=torch.float64)  # |k| <= 1
    S, bound = x["initial_state"], x["initial_state"].norm(dim=-1)  # (B, H, d_v) per-row bound
    for t in range(T):
        step = lambda a: a[:, :, t:t + 1]
        _, S = memory(step(x["q"]), step(k), step(x["v"]), "oja", step(x["beta"]), mode=mode, initial_state=S)
        vi = x["v"][:, :, t].abs()
        bound = torch.maximum(bound, torch.where(vi > 0, k[:, :, t].norm(dim=-1, keepdim=True) / vi, 0.0))
        assert (S.norm(dim=-1) <= bound * (1 + 1e-12)).all()
    # equal-magnitude values on a fixed binding of 3 keys, T = 600
    keys = F.normalize(torch.randn(3, d_k, generator=torch.Generator().manual_seed(5), dtype=torch.float64), dim=-1)
    vals = torch.tensor([[1, -1, 1, 1], [-1, -1, 1, -1], [1, 1, -1, -1]], dtype=torch.float64) / d_v ** 0.5
    which = torch.arange(600) % 3
    k, v = keys[which].expand(1, 1, 600, d_k), vals[which].expand(1, 1, 600, d_v)
    _, S_oja = memory(k, k, v, "oja", 1.0, mode=mode)
    _, S_hebb = memory(k, k, v, "hebbian", mode=mode)
    assert S_oja.norm() <= d_v and S_hebb.norm() > 25 * d_v  # Hebbian: 200 * |sum_m v_m k_m^T|_F, which is >= 200


@pytest.mark.parametrize("bad", [
    dict(rule="sum"), dict(mode="parallel"), dict(q="1d"), dict(k="short"), dict(v="other_T"), dict(beta="shape"),
    dict(initial_state="shape"), dict(rule="delta", beta=1.5), dict(rule="oja", beta=0.0), dict(rule="oja", beta="big"),
    dict(decay=0.0), dict(decay=1.2), dict(rule="delta", decay=0.9), dict(chunk_size=0), dict(v="integer"),
    dict(rule="oja", v="unnormalised")])
def test_bad_memory_inputs_raise(bad):
    x = memory_inputs(2, 2, 5, 4, 3)
    args = dict(q=x["q"], k=x["k"], v=x["v"], rule="hebbian", beta=x["beta"], decay=None, mode="chunked",
                initial_state=x["initial_state"], chunk_size=None)
    swap = dict(q={"1d": x["q"][0, 0, 0]}, k={"short": x["k"][..., :3]}, v={"other_T": x["v"][:, :, :4],
                "integer": x["v"].long(), "unnormalised": 3 * x["v"]},
                beta={"shape": x["beta"][:, :1], "big": x["beta"] + 0.5},
                initial_state={"shape": x["initial_state"].mT})
    for key, val in bad.items():
        args[key] = swap[key][val] if isinstance(val, str) and key in swap else val
    with pytest.raises(ValueError, match="memory: "):
        memory(**args)


def test_beta_error_says_why():
    x = memory_inputs(1, 1, 3, 4, 4)
    with pytest.raises(ValueError, match=r"\(0, 1\] for the delta rule.*beta > 2 \(it diverges\)"):
        memory(x["q"], x["k"], x["v"], "delta", beta=3.0)
    with pytest.raises(ValueError, match="valid: hebbian, delta, oja"):
        memory(x["q"], x["k"], x["v"], "bcm")

# -----------------------------------------------------------------------------
# the model


def tiny(**kw):
    c = dict(vocab_size=12, n_classes=5, answer_offset=7, block_size=24, n_layer=2, n_head=2, d_model=16, mlp_ratio=2)
    torch.manual_seed(0)
    return LinearAttention(LinearAttentionConfig(**(c | kw))).double()


@pytest.mark.parametrize("mode", ["recurrent", "chunked"])
@pytest.mark.parametrize("rule", RULES)
def test_model_is_causal_in_outputs_and_gradients(rule, mode):
    model = tiny(rule=rule, mode=mode, chunk_size=8, learn_beta=True)
    x = torch.randint(12, (3, 24))
    out = model(x)
    for t in (0, 9, 22):
        x2 = x.clone()
        x2[:, t + 1:] = torch.randint(12, (3, 23 - t))
        torch.testing.assert_close(model(x2)[:, :t + 1], out[:, :t + 1], rtol=0, atol=1e-12)
    model = tiny(rule=rule, mode=mode, chunk_size=8, vocab_size=0, n_features=4, gaussian=True, answer_offset=None)
    xr = torch.randn(2, 20, 4, dtype=torch.float64, requires_grad=True)
    out = model(xr)
    assert out.shape == (2, 20, 2)
    for t in (0, 8, 17):
        (g,) = torch.autograd.grad(out[:, t].sum(), xr, retain_graph=True)
        assert g[:, t + 1:].abs().max() == 0 and g[:, :t + 1].abs().max() > 0


@pytest.mark.parametrize("rule", RULES)
def test_model_modes_agree_and_internals(rule):
    model = tiny(rule=rule, learn_beta=True, mode="recurrent")
    x = torch.randint(12, (2, 24))
    out, rec = model(x, return_internals=True)
    model.config.mode, model.config.chunk_size = "chunked", 5  # the layers share the config
    torch.testing.assert_close(model(x), out, rtol=1e-10, atol=1e-10)
    L = rec["layers"][1]
    assert L["x"].shape == (2, 24, 16) and L["q"].shape == L["k"].shape == L["v"].shape == (2, 2, 24, 8)
    assert L["S"].shape == (2, 2, 8, 8) and rec["final"].shape == (2, 24, 16)
    if rule == "delta":
        torch.testing.assert_close(L["k"].norm(dim=-1), torch.ones(2, 2, 24, dtype=torch.float64))
    if rule == "oja":
        torch.testing.assert_close(L["v"].norm(dim=-1), torch.ones(2, 2, 24, dtype=torch.float64))
    assert torch.allclose(model(x, head_mask=torch.ones(2, 2)), out, atol=1e-10)
    assert not torch.allclose(model(x, head_mask=torch.tensor([[1.0, 0.0], [1.0, 1.0]])), out)
    h0 = model.ln_f(model.blocks[0](model.wte(x) + model.wpe(torch.arange(24))))
    torch.testing.assert_close(model(x, skip_layers={1}), h0 @ model.wte.weight[7:12].T)


def test_parameter_count_by_hand():
    n, V, T, C = 16, 12, 24, 5
    attn = 3 * n * n + n * n + 8  # W_Q, W_K, W_V, W_O, the output RMSNorm's gain over d_v = 8 (shared by the heads)
    mlp = n + (n * 2 * n + 2 * n) + (2 * n * n + n)  # pre-norm, c_fc, c_proj (mlp_ratio 2)
    block = n + attn + mlp
    assert tiny().num_params() == V * n + T * n + 2 * block + n  # tied head
    assert tiny(learn_beta=True, use_mlp=False).num_params() == V * n + T * n + 2 * (n + attn + n * 2 + 2) + n
    assert tiny(tie_head=False).num_params() == tiny().num_params() + n * C + C


@pytest.mark.parametrize("kw, match", [
    (dict(rule="bcm"), "rule must be one of hebbian, delta, oja"), (dict(feature_map="relu"), "feature_map"),
    (dict(norm="batchnorm"), "norm must be"), (dict(pos="rotary"), "pos must be"), (dict(mode="scan"), "mode must be"),
    (dict(norm_k="sum"), "norm_k"), (dict(d_model=15), "n_head"), (dict(n_layer=0), ">= 1"),
    (dict(decay=0.0), "decay"), (dict(rule="delta", decay=0.9), "hebbian rule only"),
    (dict(rule="oja", beta=2.0), r"beta in \(0, 1\]"), (dict(rule="oja", norm_v="none"), "unit-norm values"),
    (dict(answer_offset=10), "outside the vocabulary"), (dict(vocab_size=0, n_features=0), "input size")])
def test_bad_configs_raise(kw, match):
    with pytest.raises(ValueError, match=match):
        tiny(**kw)


def test_too_long_for_the_position_table():
    with pytest.raises(ValueError, match="block_size"):
        tiny()(torch.zeros(1, 25, dtype=torch.long))
    tiny(pos="none")(torch.zeros(1, 40, dtype=torch.long))


@pytest.mark.parametrize("rule", RULES)
def test_trains_through_train_py(tmp_path, rule):
    import presets
    import train
    assert presets.MODELS["linear_attn"] == (LinearAttentionConfig, LinearAttention)
    helps = settings.field_help(LinearAttentionConfig)
    assert all(helps.get(f) for f in LinearAttentionConfig.__dataclass_fields__), "every field needs a # help comment"
    rc = train.main(["--task", "bijection", "--model", "linear_attn", "--rule", rule, "--V", "6", "--d_model", "16",
                     "--n_head", "2", "--n_layer", "1", "--learn_beta", "--max_iters", "4", "--log_interval", "2",
                     "--eval_interval", "4", "--eval_samples", "20", "--eval_samples_during", "20", "--batch_size", "8",
                     "--out_dir", str(tmp_path)])
    r = json.load(open(tmp_path / "results.json"))
    assert rc == 0 and r["iters"] == 4 and r["model_config"]["rule"] == rule and r["n_params"] > 0


@pytest.mark.parametrize("rule", RULES)
def test_a_few_steps_lower_the_loss(rule):
    opts = dict(n_layer=1, d_model=32, n_head=2, lr=3e-3, rule=rule, learn_beta=True)
    before, after = loss_before_after("linear_attn", opts, steps=40)
    assert after < before - 0.2


def test_hop_trains_through_train_py(tmp_path, monkeypatch):
    import presets
    import train
    if "hop" not in presets.PRESETS["quick"]:  # train.py has no preset for hop yet
        monkeypatch.setitem(presets.PRESETS["quick"], "hop", {})
    rc = train.main(["--task", "hop", "--model", "linear_attn", "--rule", "delta", "--n_facts", "4", "--depth", "2",
                     "--n_entities", "8", "--d_model", "16", "--n_head", "2", "--n_layer", "2", "--use_mlp", "false",
                     "--max_iters", "3", "--log_interval", "3", "--eval_interval", "3", "--eval_samples", "20",
                     "--eval_samples_during", "20", "--batch_size", "8", "--out_dir", str(tmp_path)])
    assert rc == 0 and (tmp_path / "results.json").exists()


@pytest.mark.filterwarnings("ignore:Mismatch dtype between input and weight")
def test_bf16_autocast_computes_the_memory_in_float32():
    torch.manual_seed(0)
    model = LinearAttention(LinearAttentionConfig(vocab_size=12, n_classes=5, answer_offset=7, d_model=16, n_head=2,
                                                  rule="delta", learn_beta=True, mode="chunked"))
    x = torch.randint(12, (2, 30))
    ref = model(x)
    with torch.autocast("cpu", dtype=torch.bfloat16):
        out = model(x)
    out.float().sum().backward()
    assert torch.isfinite(out.float()).all() and all(torch.isfinite(p.grad).all() for p in model.parameters())
    assert rel_err(out.float(), ref) < 5e-2
