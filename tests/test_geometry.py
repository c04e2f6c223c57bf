"""geometry.py (and geometry_attention.py, geometry_stats.py): its statistics on constructed cases, every diagnostic on
tiny checkpoints, the claims table over seeds, bad input."""
from functools import partial
import json
import math
import os
import subprocess
import sys

from types import SimpleNamespace

import pytest
import torch
import torch.nn as nn
import torch.nn.functional as F

import checkpoints
import geometry
import geometry_attention
import geometry_jlens
import geometry_stats
import presets
import train
from cli import exit_code
from tasks import make_task
from transformer import Transformer, TransformerConfig
import settings

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
D = torch.float64


def tiny(**kw):
    c = dict(vocab_size=10, n_classes=5, answer_offset=5, block_size=9, n_layer=2, n_head=2, d_model=16)
    torch.manual_seed(0)
    return Transformer(TransformerConfig(**(c | kw))).double().eval()


def test_orthogonal_keys_give_zero_and_parallel_keys_one():
    Q, _ = torch.linalg.qr(torch.randn(16, 16, dtype=D))
    assert geometry_stats.offdiag_abs_cos(Q[:10] * torch.rand(10, 1, dtype=D)).item() < 1e-12
    assert abs(geometry_stats.offdiag_abs_cos(-torch.ones(4, 3, dtype=D)).item() - 1) < 1e-12
    two = torch.tensor([[1.0, 0.0], [0.5, 3 ** 0.5 / 2]], dtype=D)  # 60 degrees apart
    assert abs(geometry_stats.offdiag_abs_cos(two).item() - 0.5) < 1e-12


def test_a_model_with_orthogonal_hypothesis_keys_scores_zero():
    model, task = tiny(), make_task("bijection", V=5)
    tokens = geometry_attention.hypothesis_tokens(task)
    assert tokens.tolist() == [5, 6, 7, 8, 9]  # the value tokens
    assert geometry_attention.hypothesis_tokens(make_task("bijection", V=5, layout="query")).tolist() == [0, 1, 2, 3, 4]
    with torch.no_grad():  # value token 5 + i embeds as e_i + e_{8+i}; W_K = I: each head sees e_i
        model.wte.weight[5:10] = torch.eye(16, dtype=D)[:5] + torch.eye(16, dtype=D)[8:13]
        model.blocks[0].attn.c_attn.weight[16:32] = torch.eye(16, dtype=D)
    cos, _ = geometry_attention.key_frame(model, tokens)
    assert cos.shape == (2, 2) and cos[0].abs().max() < 1e-12 and cos[1].min() > 0


def test_signed_cosine_floor_and_orthonormal_rows():
    n = 20
    U = torch.eye(n, dtype=D) - 1 / n  # the rows sum to zero and have equal norms: a regular simplex
    U = U * (1 + torch.rand(n, 1, dtype=D))  # lengths do not matter to a cosine
    assert abs(geometry_stats.offdiag_cos(U, signed=True).item() + 1 / (n - 1)) < 1e-12  # -0.0526: the floor
    assert abs(geometry_stats.offdiag_cos(U).item() - 1 / (n - 1)) < 1e-12
    Q, _ = torch.linalg.qr(torch.randn(32, 32, dtype=D))
    assert abs(geometry_stats.offdiag_cos(Q[:n], signed=True).item()) < 1e-12
    assert geometry_stats.offdiag_cos(Q[:n]).item() < 1e-12
    G = torch.randn(500, n, 8, dtype=D)  # any rows stay above the floor
    assert (geometry_stats.offdiag_cos(G, signed=True) >= -1 / (n - 1) - 1e-12).all()


@pytest.mark.parametrize("d, want", [(32, 0.141), (96, 0.082), (192, 0.058)])
def test_gaussian_keys_mean_abs_cos(d, want):  # about sqrt(2 / (pi d)): the Gaussian baselines' scale
    G = torch.randn(200, 20, d, generator=torch.Generator().manual_seed(0), dtype=D)
    assert abs(geometry_stats.offdiag_cos(G).mean().item() - want) < 0.003


def by_hand_key_stat(model, tokens, layer, normed, signed, heads):
    """The key statistic written out with python loops, float64."""
    C, H = model.config.d_model, model.config.n_head
    d, block = C // H, model.blocks[layer]
    E = model.wte.weight[tokens].detach().clone()
    if normed:
        ln = block.ln_1
        if isinstance(ln, nn.LayerNorm):
            E = (E - E.mean(1, keepdim=True)) / (E.var(1, unbiased=False, keepdim=True) + ln.eps).sqrt()
            E = E * ln.weight + (ln.bias if ln.bias is not None else 0)
        else:
            E = E / (E.pow(2).mean(1, keepdim=True) + ln.eps).sqrt() * ln.weight
    Wk = block.attn.c_attn.weight[C:2 * C]
    per_head = []
    for h in range(H):
        K = (E @ Wk[h * d:(h + 1) * d].T).tolist()
        cos = [sum(a * b for a, b in zip(K[i], K[j])) / math.sqrt(sum(a * a for a in K[i]) * sum(b * b for b in K[j]))
               for i in range(len(K)) for j in range(len(K)) if i != j]
        per_head.append(sum(c if signed else abs(c) for c in cos) / len(cos))
    return sum(per_head) / H if heads == "mean" else min(per_head)


@pytest.mark.parametrize("norm", ["layernorm", "rmsnorm"])
def test_every_key_variant_by_hand(norm):
    model, init, task = tiny(norm=norm), tiny(norm=norm), make_task("bijection", V=5)
    with torch.no_grad():  # a trained-looking norm, and an init that differs from the model
        for m in (model, init):
            for p in m.parameters():
                p.add_(0.3 * torch.randn_like(p))
    rows = geometry_attention.key_variants(model, init, task, n_draws=4)
    assert len(rows) == 16 and {(r["tokens"], r["n_tokens"]) for r in rows} == {("hypothesis", 5), ("vocab", 10)}
    for r in rows:
        tokens = geometry_attention.hypothesis_tokens(task, r["tokens"])
        for who, m in (("trained", model), ("init", init)):
            for layer in range(2):
                want = by_hand_key_stat(m, tokens, layer, r["input"] == "norm", r["statistic"] == "signed", r["heads"])
                assert abs(r[who][layer] - want) < 1e-12, (r, who, layer)
        assert r["floor"] == (-1 / (r["n_tokens"] - 1) if r["statistic"] == "signed" else None)
        assert r["gaussian"] >= (r["floor"] or 0) - 1e-12


def test_keys_named_variants_are_the_authors_statistics(runs):
    assert geometry_main(["keys", "--ckpt", runs["bij"], "--n_seq", "8", "--no_plot"]) == 0
    k = read(runs["bij"], "keys")
    assert len(k["variants"]) == 16 and set(k["named"]) == {"ours", "qkv_analysis", "identify_frame_head"}
    q, f = k["named"]["qkv_analysis"], k["named"]["identify_frame_head"]
    assert (q["tokens"], q["n_tokens"], q["floor"]) == ("vocab", 12, -1 / 11)
    model, task, _ = settings.load(runs["bij"])
    with torch.no_grad():
        assert abs(q["trained"] - by_hand_key_stat(model, torch.arange(12), 0, False, True, "mean")) < 1e-12
        assert abs(f["trained"] - by_hand_key_stat(model, torch.arange(6, 12), 0, True, False, "min")) < 1e-12
    assert abs(k["named"]["ours"]["trained"] - k["layers"][0]["trained_weight_mean"]) < 1e-12  # the old statistic
    assert abs(f["init"] - min(k["variants"][5]["init_per_head"][0])) < 1e-12


def test_pca_shares_and_dimensions():
    X = torch.tensor([[3, 0, 0], [-3, 0, 0], [0, 2, 0], [0, -2, 0], [0, 0, 1], [0, 0, -1]], dtype=D)
    _, share = geometry_stats.pca(X)
    assert torch.allclose(share, torch.tensor([9, 4, 1], dtype=D) / 14)
    r, _ = geometry_stats.manifold_stats(X, torch.arange(6, dtype=D))
    assert (r["dims_90"], r["dims_95"]) == (2, 3)


def test_a_representation_linear_in_entropy_gives_r2_one():
    g = torch.Generator().manual_seed(0)
    H = 4 * torch.rand(600, generator=g, dtype=D)
    a, b = torch.randn(1, 8, generator=g, dtype=D), torch.randn(8, generator=g, dtype=D)
    r, _ = geometry_stats.manifold_stats(H[:, None] * a + b, H)
    assert abs(r["probe_r2"] - 1) < 1e-9 and abs(r["corr_pc1"] - 1) < 1e-9
    assert abs(r["pc1_share"] - 1) < 1e-9 and r["dims_90"] == 1
    noisy = torch.cat([H[:, None] * a + b, torch.randn(600, 5, generator=g, dtype=D)], 1)  # H still in the span
    assert abs(geometry_stats.probe_r2(noisy, H) - 1) < 1e-9
    assert abs(geometry_stats.probe_r2(torch.randn(600, 3, generator=g, dtype=D), H)) < 0.05  # unrelated: about 0


def test_silhouette_by_hand():
    X, labels = torch.tensor([[0.0], [1.0], [10.0], [11.0]], dtype=D), torch.tensor([0, 0, 1, 1])
    want = (9.5 / 10.5 + 8.5 / 9.5) / 2  # a = 1 for every point; b = 10.5, 9.5, 9.5, 10.5
    assert abs(geometry_stats.silhouette(X, labels) - want) < 1e-12
    assert geometry_stats.silhouette(torch.tensor([[0.0], [1.0], [5.0]], dtype=D), torch.tensor([0, 0, 1])) == \
        pytest.approx(((5 - 1) / 5 + (4 - 1) / 4 + 0) / 3)  # a point alone in its cluster scores 0
    assert math.isnan(geometry_stats.silhouette(X, torch.zeros(4, dtype=torch.long)))  # one cluster: undefined


def test_pc1_of_a_representation_linear_in_position():
    g = torch.Generator().manual_seed(0)
    pos = torch.randint(0, 40, (500,), generator=g)
    a, b = torch.randn(1, 6, generator=g, dtype=D), torch.randn(6, generator=g, dtype=D)
    H = torch.rand(500, generator=g, dtype=D)  # unrelated to the position
    r, _ = geometry_stats.manifold_stats(pos[:, None] * a + b, H, position=pos)
    assert abs(r["corr_pc1_position"] - 1) < 1e-12 and r["corr_pc1"] < 0.15
    r, _ = geometry_stats.manifold_stats(H[:, None] * a + b, H, position=pos)
    assert abs(r["corr_pc1"] - 1) < 1e-12 and r["corr_pc1_position"] < 0.15


def test_bijection_sites_label_a_value_with_the_preceding_keys_entropy():
    task = make_task("bijection", V=5)
    batch = task.sample(3, torch.Generator().manual_seed(0))
    H, pos, _ = geometry.site_labels(task, batch, "key")
    assert pos[:5].tolist() == [0, 2, 4, 6, 0]  # row-major: the next sequence starts at t = 0
    assert torch.allclose(H[:4], torch.log2(torch.tensor([5., 4, 3, 2], dtype=D)))
    H, pos, _ = geometry.site_labels(task, batch, "value")  # values at t = 1, 3, 5: H before each is seen
    assert pos[:3].tolist() == [1, 3, 5] and torch.allclose(H[:3], torch.log2(torch.tensor([5., 4, 3], dtype=D)))
    assert len(H) == 3 * 3


@pytest.mark.parametrize("model", ["transformer", "mamba", "lstm", "mlp", "linear_attn"])
def test_the_stream_before_the_final_norm(model):
    Config, Model = presets.MODELS[model]
    torch.manual_seed(0)
    m = Model(Config(vocab_size=10, n_classes=5, answer_offset=5, block_size=9, n_layer=2, d_model=16)).double().eval()
    x = torch.randint(10, (2, 9))
    with torch.no_grad():
        before, after = geometry.final_streams(m, x)
        norm = m.ln_f if hasattr(m, "ln_f") else m.norm_f
        assert torch.allclose(norm(before), after, atol=1e-12) and not torch.allclose(before, after)
        _, inside = m(x, return_internals=True)
        assert torch.equal(after, inside["final"])


@pytest.mark.parametrize("window", [0, 6])
def test_qk_compares_attention_entropy_with_the_keys_in_view(window):
    """Zero queries and keys, no ALiBi: each row attends uniformly to the keys in view, so the attention
    entropy is the uniform reference exactly: log2(t + 1), or under a window the header and the last `window`."""
    task = make_task("hmm", n_states=2, n_obs=2, K=12)  # header 11 tokens, 35 in all
    io = dict(vocab_size=task.vocab_size, n_classes=task.n_classes, answer_offset=None)
    model = tiny(**io, block_size=task.seq_len, n_pos=task.header_len + 1, window=window)
    for block in model.blocks:
        block.attn.c_attn.weight.data[:2 * 16] = 0  # q and k
        block.attn.c_attn.bias.data[:2 * 16] = 0
    batch = task.sample(3, torch.Generator().manual_seed(0))
    r, _ = geometry_attention.qk(model, task, batch, None, None)
    t = batch.mask[0].nonzero().squeeze(1).double()  # the scored rows
    n = t + 1 if not window else task.header_len + torch.clamp(t + 1 - task.header_len, max=window)
    assert r["uniform_entropy_bits"] == pytest.approx(n.log2().mean().item(), abs=1e-12)
    assert not window or n[-1] == task.header_len + window < t[-1] + 1  # the window hides keys from the later rows
    assert all(l["att_entropy_bits"] == pytest.approx(r["uniform_entropy_bits"], abs=1e-9) for l in r["layers"])


def test_adjusted_rand_index():
    a = torch.tensor([0, 0, 1, 1, 2, 2, 2])
    assert geometry_stats.adjusted_rand_index(a, a) == pytest.approx(1)
    assert geometry_stats.adjusted_rand_index(a, torch.tensor([2, 1, 0])[a]) == pytest.approx(1)  # renamed clusters
    ari = geometry_stats.adjusted_rand_index(torch.tensor([0, 0, 1, 1]), torch.tensor([0, 0, 1, 2]))
    assert ari == pytest.approx(4 / 7)
    g = torch.Generator().manual_seed(0)
    x, y = torch.randint(5, (20000,), generator=g), torch.randint(5, (20000,), generator=g)
    assert abs(geometry_stats.adjusted_rand_index(x, y)) < 0.005  # independent: chance level


def test_silhouette_against_brute_force():
    g = torch.Generator().manual_seed(0)
    X, labels = torch.randn(40, 3, generator=g, dtype=D), torch.randint(3, (40,), generator=g)
    labels[0] = 3  # one point alone in its cluster: 0
    dist = lambda i, j: math.dist(X[i].tolist(), X[j].tolist())
    s = []
    for i in range(40):
        own = [j for j in range(40) if labels[j] == labels[i] and j != i]
        if not own:
            s.append(0.0)
            continue
        a = sum(dist(i, j) for j in own) / len(own)
        b = min(sum(dist(i, j) for j in range(40) if labels[j] == k) / (labels == k).sum().item()
                for k in labels.unique().tolist() if k != labels[i])
        s.append((b - a) / max(a, b))
    assert abs(geometry_stats.silhouette(X, labels) - sum(s) / 40) < 1e-12


def test_planted_clusters_beat_the_null_and_k_means_finds_them():
    g = torch.Generator().manual_seed(0)
    states = torch.arange(5).repeat(60)
    centres = 10 * torch.randn(5, 4, generator=g, dtype=D)
    X = centres[states] + torch.randn(300, 4, generator=g, dtype=D)
    r = geometry_stats.silhouette_null(X, states, n_perm=50)
    assert r["silhouette"] > 0.5 and r["silhouette_p"] == 1 / 51 and r["silhouette_null_p95"] < 0.05
    assert geometry_stats.adjusted_rand_index(geometry_stats.kmeans(X, 5), states) == pytest.approx(1)
    r = geometry_stats.silhouette_null(X, states[torch.randperm(300, generator=g)], n_perm=50)  # labels unrelated
    assert r["silhouette_p"] > 0.05 and abs(r["silhouette"] - r["silhouette_null_mean"]) < 0.05
    c = geometry_stats.state_clusters(X, states, 5, max_points=200, n_perm=20)
    assert c["kmeans_ari"] == pytest.approx(1) and c["kmeans_k"] == 5 and c["silhouette_p"] == 1 / 21


def test_frame_head_concentration():
    delta = {"L0H0": 0.1, "L0H1": 0.4, "L1H0": 0.15, "L1H1": 0.05}
    c = geometry_stats.concentration(delta)
    assert (c["top_head"], c["second_head"], c["l0_top"], c["l0_second_head"]) == ("L0H1", "L1H0", "L0H1", "L0H0")
    assert c["top_over_second"] == pytest.approx(0.4 / 0.15) and c["l0_top_over_second"] == pytest.approx(4)
    assert c["single_head_concentrated"] and c["n_heads_above_half_top"] == 1
    c = geometry_stats.concentration({"L0H0": 0.1, "L0H1": 0.09, "L1H0": 0.3})
    assert c["top_head"] == "L1H0" and c["l0_top"] == "L0H0" and not c["l0_single_head_concentrated"]
    assert c["n_heads_above_half_top"] == 1


def test_js_divergence():
    p = torch.tensor([[0.2, 0.8, 0.0], [1.0, 0.0, 0.0]], dtype=D)
    q = torch.tensor([[0.2, 0.8, 0.0], [0.0, 0.5, 0.5]], dtype=D)
    assert torch.allclose(geometry_stats.js_bits(p, q), torch.tensor([0.0, 1.0], dtype=D))


def test_key_positions_mae_is_the_authors_paired_statistic_prefix_by_prefix():
    """jlens paired_calibration_mae: for each t, the prefix k1 v1 .. k_t run alone, its last entropy against
    log2(V - t + 1), |difference| averaged over sequences, then over t; the query's recall is not scored."""
    task = make_task("bijection", V=5, layout="query")
    model = tiny(vocab_size=5, n_classes=5, answer_offset=0, block_size=task.seq_len)
    batch = task.sample(6, torch.Generator().manual_seed(0))
    by_t = []
    for t in range(1, task.L + 1):
        with torch.no_grad():
            p = torch.softmax(model(batch.x[:, :2 * t - 1])[:, -1].double(), -1)
        h = -(p * p.log2()).sum(-1)
        by_t.append((h - math.log2(task.V - t + 1)).abs().mean())
    with torch.no_grad():
        got = geometry_stats.key_positions_mae(model, task, batch)
    assert got == pytest.approx(torch.stack(by_t).mean().item(), abs=1e-12)


class AttentionOff(nn.Module):
    def __init__(self, out=None):
        super().__init__()
        self.out = out

    def forward(self, x, *args):
        return torch.zeros_like(x) if self.out is None else self.out.expand_as(x)


@pytest.mark.parametrize("bias", [False, True])
def test_masking_every_head_of_a_layer_equals_skipping_its_attention(bias):
    model, x = tiny(bias=bias), torch.randint(10, (3, 9))
    mask = torch.ones(2, 2, dtype=D)
    mask[1] = 0
    with torch.no_grad():
        masked = model(x, head_mask=mask)
        # with biases the silenced attention still adds its output projection's bias
        model.blocks[1].attn = AttentionOff(model.blocks[1].attn.c_proj.bias if bias else None)
        assert torch.allclose(masked, model(x), atol=1e-12)


# -----------------------------------------------------------------------------
# end to end on tiny checkpoints written by train.py

SMALL = ["--max_iters", "6", "--batch_size", "8", "--eval_interval", "3", "--log_interval", "3",
         "--eval_samples", "10", "--eval_samples_during", "10", "--n_layer", "2"]
HMM = ["--task", "hmm", "--K", "4", "--n_states", "3", "--n_obs", "3"]


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    d = tmp_path_factory.mktemp("runs")
    argvs = dict(bij=["--task", "bijection", "--V", "6", "--n_head", "2", "--d_model", "16", "--ckpt_schedule", "log"],
                 hmm=HMM + ["--n_head", "2", "--d_model", "16"],
                 mamba=HMM + ["--model", "mamba", "--d_model", "16"], lstm=HMM + ["--model", "lstm", "--d_model", "16"])
    for name, argv in argvs.items():
        assert train.main(argv + SMALL + ["--out_dir", str(d / name)]) == 0
    return {name: str(d / name) for name in argvs}


@pytest.mark.parametrize("name", ["bij", "mamba"])
def test_the_init_baseline_is_the_runs_initialisation(runs, name):
    state = settings.load_checkpoint(os.path.join(runs[name], "ckpt.pt"))
    torch.manual_seed(state["config"]["train"]["seed"])  # as train.run does before train.build
    model, _ = train.build(settings.resumed(state, SimpleNamespace(explicit={}), {}, runs[name]), torch.device("cpu"))
    fresh = settings.build_model(state, trained=False)
    assert all(torch.equal(a.double(), b) for a, b in zip(model.state_dict().values(), fresh.state_dict().values()))


geometry_main = partial(exit_code, geometry.main)


def read(run, name):
    return json.load(open(os.path.join(run, f"geometry_{name}.json")))


def test_every_diagnostic_on_a_tiny_bijection_transformer(runs):
    assert geometry_main(["all", "--ckpt", runs["bij"], "--n_seq", "12", "--no_plot"]) == 0
    k = read(runs["bij"], "keys")
    assert k["n_tokens"] == 6 and k["d_head"] == 8 and len(k["layers"]) == 2
    assert len(k["layers"][0]["trained_weight"]) == 2 and 0 < k["gaussian"] < 1
    assert set(k["embedding"]) == {"trained", "init", "gaussian"}
    q = read(runs["bij"], "qk")
    assert len(q["layers"]) == 2 and all(0 <= l["att_mass_hypothesis"] <= 1 for l in q["layers"])
    v = read(runs["bij"], "values")
    assert list(v["layers"]) == ["emb", "L1", "final", "attn0", "attn1"]
    assert all(0 < s["pc1_share"] <= 1 and 1 <= s["dims_90"] <= s["dims_95"] for s in v["layers"].values())
    for site, n in (("key", 12 * 5), ("value", 12 * 4)):  # V=6: keys at t = 0, 2, .., 8, values between
        s = v["final_layer"][site]
        assert s["n_points"] == n and set(s) == {"n_points", "corr_h_position", "before_norm", "after_norm"}
        assert all(0 <= s[b][k] <= 1 for b in ("before_norm", "after_norm")
                   for k in ("pc1_share", "corr_pc1", "corr_pc1_position"))
    assert v["final_layer"]["key"]["after_norm"]["pc1_share"] == v["layers"]["final"]["pc1_share"]
    a = read(runs["bij"], "ablate")
    assert [r["ablation"] for r in a["ablations"]][:5] == [
        "skip L0", "skip L1", "skip L0 MLP", "skip L1 MLP", "mask L0H0"]
    assert len(a["ablations"]) == 2 + 2 + 2 * 3
    ratios = a["figures"]["error x with layer l's MLP skipped (per token)"]
    assert ratios == [r["ratio_token"] for r in a["ablations"] if r["ablation"].endswith("MLP")] and len(ratios) == 2
    f, rows = a["frame"], {r["ablation"]: r["mae_token"] for r in a["ablations"]}
    assert f["delta_mae"] == {f"L{l}H{h}": rows[f"mask L{l}H{h}"] - a["baseline"]["mae_token"]
                              for l in range(2) for h in range(2)}
    assert f["top_delta"] == max(f["delta_mae"].values()) and f["l0_top"] in ("L0H0", "L0H1")
    scores = f["orthogonality_scores"]
    assert f["frame_head_by_orthogonality"] == f"L0H{scores.index(min(scores))}"
    assert min(scores) == pytest.approx(k["named"]["identify_frame_head"]["trained"], abs=1e-12)
    dyn = read(runs["bij"], "dynamics")
    # checkpoints.snapshot_steps("log", 6), the last is ckpt.pt
    assert [r["step"] for r in dyn["steps"]] == [1, 2, 3, 6]
    assert dyn["steps"][-1]["att_similarity"] == [1.0, 1.0] and len(dyn["summary"]["attention_settled_step"]) == 2
    last = dyn["steps"][-1]  # the claims table's figures at every checkpoint
    assert len(last["keys_jlens"]) == 2 and len(last["att_entropy_bits"]) == 2 and len(last["skip_ratio"]) == 2
    assert last["keys_jlens"] == pytest.approx(k["variants"][[(v["tokens"], v["input"], v["statistic"], v["heads"])
        for v in k["variants"]].index(("hypothesis", "norm", "abs", "mean"))]["trained_per_head"][0], abs=1e-12)
    assert set(last["values"]) == {"ours", "geometric", "manifold", "qkv"} and last["values"]["qkv"]["n_distinct"] == 5
    assert last["values"]["geometric"]["n_points"] == 3200 * 4 and "frame" not in last  # V=6: 4 values a sequence
    assert not os.path.exists(os.path.join(runs["bij"], "geometry_clusters.json"))  # not hmm


def test_seeds_gives_each_seeds_figure_and_their_mean_min_and_max(runs, tmp_path, capsys):
    if not os.path.exists(os.path.join(runs["bij"], "geometry_dynamics.json")):
        assert geometry_main(["all", "--ckpt", runs["bij"], "--n_seq", "12", "--no_plot"]) == 0
    dirs = [tmp_path / "a", tmp_path / "b"]
    for i, d in enumerate(dirs):  # two "seeds": the run's figures, and the same with planted values
        d.mkdir()
        for n in ("keys", "qk", "values", "dynamics", "ablate"):
            r = read(runs["bij"], n)
            if i:  # as a file written before the diagnostics wrote their figures: seeds reads them from the numbers
                del r["figures"]
            if i and n == "keys":
                r["named"]["ours"]["trained"] = 0.5
            if i and n == "qk":
                r["layers"][1]["att_entropy_bits"] = 3.0
            (d / f"geometry_{n}.json").write_text(json.dumps(r))
    assert geometry_main(["seeds", *map(str, dirs), "--out", str(tmp_path)]) == 0
    fig = json.load(open(tmp_path / "geometry_seeds.json"))["figures"]
    ours, first = fig["keys: mean |cos|, value tokens, raw, mean over heads"], read(runs["bij"], "keys")
    was = first["named"]["ours"]["trained"]
    assert ours["values"] == [was, 0.5] and ours["mean"] == pytest.approx((was + 0.5) / 2)
    assert (ours["min"], ours["max"]) == (min(was, 0.5), max(was, 0.5))
    ent, q = fig["attention entropy by layer (bits)"], read(runs["bij"], "qk")["layers"]
    assert ent["values"] == [[l["att_entropy_bits"] for l in q], [q[0]["att_entropy_bits"], 3.0]]
    assert ent["max"] == [q[0]["att_entropy_bits"], max(q[1]["att_entropy_bits"], 3.0)]
    assert fig["keys: the signed floor -1/(n-1)"]["mean"] == pytest.approx(-1 / 5)  # V = 6 value tokens
    assert len(fig["error x with layer l skipped (per token)"]["mean"]) == 2
    assert "| keys: the same at init |" in capsys.readouterr().out
    assert geometry_main(["seeds", str(tmp_path / "none"), "--out", str(tmp_path)]) == 2
    assert "no geometry_*.json" in capsys.readouterr().err


def test_seeds_names_a_figure_that_a_run_lacks(runs, tmp_path, capsys):
    if not os.path.exists(os.path.join(runs["bij"], "geometry_dynamics.json")):
        assert geometry_main(["all", "--ckpt", runs["bij"], "--n_seq", "12", "--no_plot"]) == 0
    dirs = [tmp_path / "a", tmp_path / "b"]
    for i, d in enumerate(dirs):
        d.mkdir()
        for n in ("keys", "qk", "values", "ablate") + ("dynamics",) * (i == 0):  # b: no dynamics
            r = read(runs["bij"], n)
            assert r["figures"] == geometry.FIGURES[n](r)  # written by the diagnostic, from its numbers
            if i and n == "keys":
                del r["figures"]["keys: its floor"]
            (d / f"geometry_{n}.json").write_text(json.dumps(r))
    assert geometry_main(["seeds", *map(str, dirs), "--out", str(tmp_path)]) == 0
    out, report = capsys.readouterr().out, json.load(open(tmp_path / "geometry_seeds.json"))
    for name in ("keys: its floor", "layer-0 attention settled at step", "entropy MAE's fall after that"):
        assert name not in report["figures"] and report["missing"][name]["runs"] == [str(tmp_path / "b")]
    assert f"missing: keys: its floor (geometry_keys.json) in {tmp_path / 'b'}" in out
    assert "keys: the same at init" in report["figures"] and len(report["missing"]) == 3
    os.remove(dirs[0] / "geometry_dynamics.json")  # now neither run has it
    assert geometry_main(["seeds", *map(str, dirs), "--out", str(tmp_path)]) == 0
    assert "missing: every dynamics figure (geometry_dynamics.json) in every run" in capsys.readouterr().out
    (dirs[0] / "geometry_qk.json").write_text(json.dumps({"layers": "renamed"}))  # no figures, another layout
    assert geometry_main(["seeds", *map(str, dirs), "--out", str(tmp_path)]) == 2
    assert "geometry_qk.json holds no figures, and not the layout geometry.py writes" in capsys.readouterr().err


@pytest.mark.parametrize("name", ["mamba", "lstm", "hmm"])
def test_clusters_and_values_on_tiny_hmm_models(runs, name):
    assert geometry_main(["all", "--ckpt", runs[name], "--n_seq", "30", "--no_plot"]) == 0
    c = read(runs[name], "clusters")
    assert list(c["layers"])[:3] == ["emb", "L1", "final"] and -1 <= c["layers"]["final"]["silhouette"] <= 1
    assert c["K"] == 4 and list(c["final_layer"]) == ["observation"]
    after = c["final_layer"]["observation"]["after_norm"]
    assert after["silhouette"] == c["layers"]["final"]["silhouette"] and after["kmeans_k"] == 3
    assert 1 / 201 <= after["silhouette_p"] <= 1 and -1 <= after["kmeans_ari"] <= 1
    assert set(c["final_layer"]["observation"]["before_norm"]) == set(after)
    assert geometry_main(["clusters", "--ckpt", runs[name], "--n_seq", "20", "--K", "3", "--n_perm", "10",
                          "--no_plot"]) == 0
    c = read(runs[name], "clusters")
    assert c["K"] == 3 and c["final_layer"]["observation"]["n_points"] == 20 * 3
    assert c["final_layer"]["observation"]["after_norm"]["silhouette_p"] >= 1 / 11
    assert read(runs[name], "ablate")["ablations"][0]["ablation"] == "skip L0"
    assert os.path.exists(os.path.join(runs[name], "geometry_qk.json")) == (name == "hmm")


def test_figures(runs):
    pytest.importorskip("matplotlib")
    assert geometry_main(["all", "--ckpt", runs["bij"], "--n_seq", "8"]) == 0
    for name in ("keys", "qk", "values", "ablate", "dynamics"):
        assert os.path.getsize(os.path.join(runs["bij"], f"geometry_{name}.png")) > 1000


def test_without_matplotlib_the_json_still_comes_out(runs, monkeypatch, capsys):
    monkeypatch.setitem(sys.modules, "matplotlib", None)  # makes `import matplotlib` raise ImportError
    out = os.path.join(runs["lstm"], "geometry_clusters.json")
    if os.path.exists(out):
        os.remove(out)
    assert geometry_main(["clusters", "--ckpt", runs["lstm"], "--n_seq", "8"]) == 0
    assert "matplotlib is not installed" in capsys.readouterr().out and os.path.exists(out)


@pytest.mark.parametrize("argv, message", [
    (["keys", "--ckpt", "{lstm}"], "keys needs a model with softmax attention"),
    (["dynamics", "--ckpt", "{hmm}"], "dynamics needs snapshot checkpoints"),
    (["clusters", "--ckpt", "{bij}"], "clusters needs a categorical posterior with a top answer"),
    (["values", "--ckpt", "{bij}/nowhere"], "no checkpoint at"),
    (["value", "--ckpt", "{bij}"], "invalid choice"),
    (["values", "--ckpt", "{bij}", "--K", "3"], "--K applies to hmm checkpoints only"),
    (["clusters", "--ckpt", "{hmm}", "--n_perm", "0"], "--n_perm >= 1"),
    (["dynamics", "--ckpt", "{bij}", "--settle", "5"], "--settle must be in [0, 1] (an attention similarity"),
    (["dynamics", "--ckpt", "{bij}", "--settle", "nan"], "--settle must be in [0, 1]"),
])
def test_bad_input_is_a_one_line_error(runs, capsys, argv, message):
    assert geometry_main([a.format(**runs) for a in argv]) == 2
    err = capsys.readouterr().err
    assert message in err and err.count("\n") == 1


def test_missing_checkpoint_from_the_shell(tmp_path):
    p = subprocess.run([sys.executable, "geometry.py", "keys", "--ckpt", str(tmp_path)], cwd=ROOT,
                       capture_output=True, text=True)
    assert p.returncode == 2 and "Traceback" not in p.stderr and p.stderr.count("\n") == 1
    assert "no checkpoint at" in p.stderr


def test_ablate_on_a_regression_checkpoint(tmp_path):
    argv = ["--task", "regression", "--K", "4", "--d", "2", "--n_head", "2", "--d_model", "16",
            "--out_dir", str(tmp_path)]
    assert train.main(argv + SMALL) == 0
    assert geometry_main(["all", "--ckpt", str(tmp_path), "--n_seq", "8", "--no_plot"]) == 0
    assert read(str(tmp_path), "ablate")["ablations"][0]["ablation"] == "skip L0"


def test_ablate_on_the_query_layout_scores_the_key_positions_as_the_authors_do(tmp_path):
    argv = ["--task", "bijection", "--V", "6", "--layout", "query", "--n_head", "2", "--d_model", "16",
            "--out_dir", str(tmp_path)]
    assert train.main(argv + SMALL) == 0
    assert geometry_main(["ablate", "--ckpt", str(tmp_path), "--n_seq", "8", "--no_plot"]) == 0
    a = read(str(tmp_path), "ablate")
    keys, every = a["frame_key_positions"], a["frame"]
    assert set(keys["delta_mae"]) == set(every["delta_mae"]) == {f"L{l}H{h}" for l in (0, 1) for h in (0, 1)}
    assert keys["baseline"] != a["baseline"]["mae_token"] and len(keys["skip_ratio"]) == 2  # the recall left out


@pytest.mark.parametrize("content", [b"", b"\x80\x02garbage", b"epoch,loss\n"])
def test_unreadable_checkpoint_from_the_shell(tmp_path, content):
    (tmp_path / "ckpt.pt").write_bytes(content)
    p = subprocess.run([sys.executable, "geometry.py", "ablate", "--ckpt", str(tmp_path)], cwd=ROOT,
                       capture_output=True, text=True)
    assert p.returncode == 2 and "Traceback" not in p.stderr and p.stderr.count("\n") == 1, p.stderr
    assert "not a readable train.py checkpoint (truncated or corrupt?)" in p.stderr


def test_not_finite_weights_are_one_line_and_exit_1(runs, tmp_path, capsys):
    state = torch.load(os.path.join(runs["hmm"], "ckpt.pt"), weights_only=True)
    state["model"]["wte.weight"][0, 0] = float("nan")  # a diverged run's
    torch.save(state, tmp_path / "ckpt.pt")
    assert geometry_main(["belief", "--ckpt", str(tmp_path), "--n_seq", "8", "--no_plot"]) == 1
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "are not finite (step 6): nothing to analyse" in err, err
    assert os.listdir(tmp_path) == ["ckpt.pt"]


def test_a_full_disk_is_one_line_and_keeps_the_files_written_before(runs, monkeypatch, capsys):
    assert geometry_main(["ablate", "--ckpt", runs["lstm"], "--n_seq", "8", "--no_plot"]) == 0
    path = os.path.join(runs["lstm"], "geometry_ablate.json")
    before, files = open(path).read(), sorted(os.listdir(runs["lstm"]))

    def full(src, dst):
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(checkpoints.os, "replace", full)  # write_file's rename: the new file never lands
    capsys.readouterr()
    assert geometry_main(["ablate", "--ckpt", runs["lstm"], "--n_seq", "8", "--no_plot"]) == 1
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and f"{path}: No space left on device; the files written before are kept" in err
    assert open(path).read() == before and sorted(os.listdir(runs["lstm"])) == files


# -----------------------------------------------------------------------------
# the authors' protocols (geometry_stats.py) and the frame ratio


def tiny_bijection(V=6, seed=0):
    task = make_task("bijection", V=V)
    torch.manual_seed(seed)
    m = Transformer(TransformerConfig(vocab_size=task.vocab_size, n_classes=task.n_classes, block_size=task.seq_len,
                                      answer_offset=task.answer_offset, n_layer=2, n_head=2, d_model=16))
    return m.double().eval(), task


def test_pca_shares_are_the_covariances_eigenvalues_over_their_sum():
    X = torch.randn(300, 7, generator=torch.Generator().manual_seed(0), dtype=torch.float64) @ torch.diag(
        torch.arange(1.0, 8.0, dtype=torch.float64))
    Z, share = geometry_stats.pca_shares(X, 3)
    ev = torch.linalg.eigvalsh(torch.cov(X.T)).flip(0)
    assert torch.allclose(share, (ev / ev.sum())[:3], atol=1e-12)
    assert torch.allclose(Z.var(0), ev[:3], rtol=1e-10)  # the scores' variances are the eigenvalues


def test_the_geometric_protocol_takes_the_pc_most_correlated_with_entropy():
    g = torch.Generator().manual_seed(1)
    H = torch.rand(500, generator=g, dtype=torch.float64)
    X = torch.stack([5 * torch.randn(500, generator=g, dtype=torch.float64),  # PC1: noise
                     2 * (H - 0.5), 0.01 * torch.randn(500, generator=g, dtype=torch.float64)], 1)  # PC2: H
    r = geometry_stats.protocol_geometric(torch.cat([X, torch.zeros(500, 9, dtype=torch.float64)], 1), H)
    assert r["which_pc"] == 2 and r["abs_corr"] > 0.999 and r["dim_90"] == 1  # PC1 alone holds > 90%
    noise = torch.randn(500, 40, generator=g, dtype=torch.float64)
    assert geometry_stats.protocol_geometric(noise, H)["dim_90"] is None


def test_repeating_one_sequence_leaves_the_qkv_protocols_pca_unchanged():
    g = torch.Generator().manual_seed(2)
    X = torch.randn(19, 16, generator=g, dtype=torch.float64)
    H = torch.log2(20 - torch.arange(19.0, dtype=torch.float64))
    once, times = geometry_stats.protocol_qkv(X, H), geometry_stats.protocol_qkv(X.repeat(100, 1), H.repeat(100))
    assert times["n_points"] == 1900 and times["n_distinct"] == 19
    assert times["pc1_share"] == pytest.approx(once["pc1_share"], abs=1e-12)
    assert times["abs_corr"] == pytest.approx(once["abs_corr"], abs=1e-12)


def test_the_qkv_sequence_is_the_authors_and_the_jlens_batch_is_a_bijection():
    task = make_task("bijection")  # generate_no_replacement_sequence(20, 19) as numpy 2 draws it
    perm = [12, 19, 11, 6, 7, 9, 3, 10, 13, 5, 18, 14, 16, 2, 8, 4, 15, 17, 0, 1]
    keys = [9, 17, 12, 4, 3, 7, 10, 2, 5, 6, 19, 1, 15, 14, 18, 8, 11, 0, 16]
    assert geometry_stats.qkv_sequence(task)[0].tolist() == [t for k in keys for t in (k, 20 + perm[k])][:-1]
    x = geometry_jlens.jlens_tokens(task, 5)
    assert x.shape == (5, task.seq_len) and torch.equal(x, geometry_jlens.jlens_tokens(task, 5))
    for row in x:  # distinct keys, and values that are one permutation's
        assert len(set(row[0::2].tolist())) == task.L and len(set(row[1::2].tolist())) == task.L - 1
        assert (row[1::2] >= task.V).all()


def test_value_rows_read_the_value_positions_before_and_after_the_final_norm():
    m, task = tiny_bijection()
    before, after, H = geometry_stats.value_rows(m, task, 7, seed=3, draw=4)
    g = torch.Generator().manual_seed(3)
    x = torch.cat([task.sample(4, g).x, task.sample(3, g).x])
    b, a = geometry_stats.final_streams(m, x)
    assert torch.allclose(after, a[:, 1::2].reshape(-1, 16), atol=1e-5)  # float32, as the authors' arrays
    assert torch.allclose(before, b[:, 1::2].reshape(-1, 16), atol=1e-5)
    assert H[:task.L - 1].tolist() == pytest.approx([math.log2(task.V - i) for i in range(task.L - 1)])
    assert next(m.parameters()).dtype == torch.float64  # the model itself is left in float64


def test_jspace_grams_against_the_full_jacobian():
    m, task = tiny_bijection()
    x = geometry_jlens.jlens_tokens(task, 2)
    grams = geometry_jlens.jspace_grams(m, x, task, chunk=1)
    bias = geometry_attention.attn_bias(m.config, x.shape[1], x.device)

    def logits_from(h, first):  # the forward pass from the stream entering block `first`
        for block in m.blocks[first:]:
            h = block(h, None, None, None, bias)
        return m.ln_f(h) @ m.wte.weight[task.answer_offset:task.answer_offset + task.n_classes].T

    want = torch.zeros_like(grams)
    for t in x[:, None]:
        h0 = (m.wte(t) + m.wpe(torch.arange(t.shape[1]))).detach()  # the stream into block 0
        for site, h in enumerate((h0, m.blocks[0](h0, None, None, None, bias).detach())):
            # d out[p, v] / d h[i]
            J = torch.autograd.functional.jacobian(lambda h: logits_from(h, site), h)[0, :, :, 0]
            for i in range(x.shape[1]):
                g = J[i + 1:, :, i].reshape(-1, h.shape[-1])  # every later p and every value logit
                want[site, i] += g.T @ g
    assert grams.abs().max() > 1e-3 and torch.allclose(grams, want, atol=1e-10)


def test_a_frame_that_holds_every_jspace_gives_the_inverse_null_overlap():
    m, task = tiny_bijection()
    d = m.config.d_model
    r = geometry_jlens.frame_ratio(m, torch.eye(d, dtype=torch.float64), geometry_jlens.jlens_tokens(task, 2),
                                   task, rank=4, n_null=50)
    assert r["overlap"] == pytest.approx(1.0) and r["null_overlap"] == pytest.approx(1.0)  # the whole space
    half = torch.eye(d, dtype=torch.float64)[:, : d // 2]
    r = geometry_jlens.frame_ratio(m, half, geometry_jlens.jlens_tokens(task, 2), task, rank=4, n_null=400)
    assert r["null_overlap"] == pytest.approx(0.5, abs=0.03)  # a random 4-dim subspace: half its mass in half


def test_the_frame_ratio_of_a_frame_inside_every_jspace_and_of_one_orthogonal_to_them():
    d, T, rank = 32, 7, 8
    g = torch.Generator().manual_seed(0)
    inside, outside = torch.eye(d, dtype=torch.float64)[:, :rank], torch.eye(d, dtype=torch.float64)[:, rank:2 * rank]
    grams = torch.eye(d, dtype=torch.float64).repeat(2, T, 1, 1)
    for site in range(2):  # every J-space (the top-8 eigenvectors) is span(e_0 .. e_7), turned within it
        for i in range(T):
            R = torch.linalg.qr(torch.randn(rank, rank, generator=g, dtype=torch.float64)).Q
            grams[site, i, :rank, :rank] += 10 * R @ torch.diag(torch.arange(1.0, rank + 1, dtype=torch.float64)) @ R.T
    r = geometry_jlens.jlens_ratio(grams, inside, rank, n_null=2000)
    assert r["overlap"] == pytest.approx(1.0) and r["n_jspaces"] == 2 * 3  # key positions 0, 2, 4 (6 has no later)
    assert r["null_overlap"] == pytest.approx(rank / d, abs=0.01)  # a random 8-dim subspace: 8/32 of its mass
    assert r["frame_ratio"] == pytest.approx(d / rank, rel=0.05)
    assert geometry_jlens.jlens_ratio(grams, outside, rank)["frame_ratio"] == pytest.approx(0.0, abs=1e-12)
    mixed = torch.cat([inside[:, :4], outside[:, :4]], 1)  # half inside: each J-space keeps half its mass there
    assert geometry_jlens.jlens_ratio(grams, mixed, rank)["overlap"] == pytest.approx(0.5)


def test_trajectory_reads_the_authors_statistic_at_every_snapshot(tmp_path):
    argv = ["--task", "bijection", "--preset", "authors", "--max_iters", "200", "--n_layer", "2", "--d_model", "16",
            "--n_head", "2", "--batch_size", "8", "--eval_samples", "20", "--eval_samples_during", "10",
            "--eval_interval", "100", "--log_interval", "100", "--out_dir", str(tmp_path)]
    assert exit_code(train.main, argv) == 0
    assert exit_code(geometry.main, ["trajectory", "--ckpt", str(tmp_path), "--frame_seqs", "1", "--no_plot"]) == 0
    rows = json.load(open(tmp_path / "geometry_trajectory.json"))["steps"]
    assert [r["step"] for r in rows] == [100, 200]  # the authors' dense steps
    assert [r["authors_mae"] for r in rows] == [2.82456, 0.77779] and rows[1]["authors_frame_ratio"] == 1.024
    m, task, _ = settings.load(str(tmp_path / "ckpt_0000100.pt"))
    x = geometry_jlens.jlens_tokens(task, 256)
    H = -(torch.softmax(m(x)[:, 0::2, task.V:].double(), -1) * torch.log_softmax(m(x)[:, 0::2, task.V:].double(), -1)
          ).sum(-1) / math.log(2)  # the value slice of the 40-way head, at the 19 key positions
    want = (H - torch.log2(20 - torch.arange(19.0, dtype=torch.float64))).abs().mean().item()
    assert rows[0]["mae"] == pytest.approx(want, rel=1e-9)
    assert 0 < rows[1]["frame"]["frame_ratio"] and rows[1]["frame"]["n_seq"] == 1
    assert rows[1]["j_overlap"] == pytest.approx(1.0)  # the last snapshot is the final model
    assert rows[0]["probe_position"] == 18 and 0 <= rows[0]["elimination"] <= 1 and rows[0]["n_probes"] >= 1


def test_logistic_fit_meets_its_optimality_conditions_and_agrees_with_gradient_descent():
    g = torch.Generator().manual_seed(0)
    X = torch.randn(60, 3, generator=g, dtype=D)
    y = (X[:, 0] - 0.5 * X[:, 1] + 0.3 * torch.randn(60, generator=g, dtype=D) > 0.4).long()  # unbalanced classes
    w, b = geometry_jlens.logistic_fit(X, y)
    s = len(y) / (2 * torch.where(y > 0, y.sum(), (1 - y).sum()).double())

    def loss(theta):  # sklearn's balanced, L2 (C = 1) objective, the intercept unpenalised
        z = X @ theta[:3] + theta[3]
        return 0.5 * (theta[:3] ** 2).sum() + (s * F.softplus(-(2 * y - 1) * z)).sum()

    theta = torch.cat([w, torch.tensor([b], dtype=D)]).requires_grad_()
    assert torch.autograd.grad(loss(theta), theta)[0].abs().max() < 1e-9  # the KKT point
    ref = torch.zeros(4, dtype=D, requires_grad=True)
    opt = torch.optim.LBFGS([ref], max_iter=500, tolerance_grad=1e-12, tolerance_change=1e-15,
                            line_search_fn="strong_wolfe")
    opt.step(lambda: (opt.zero_grad(), loss(ref).backward(), loss(ref))[-1])
    assert torch.allclose(theta.detach(), ref.detach(), atol=1e-6)


def test_the_elimination_probe_reads_a_linear_code_and_not_noise():
    g = torch.Generator().manual_seed(1)
    elim = torch.rand(400, 5, generator=g) < 0.5
    coords = torch.randn(400, 8, generator=g, dtype=D)
    coded = coords.clone()
    coded[:, :5] += 4 * (elim.double() - 0.5)  # v's label along axis v
    assert geometry_jlens.elimination_probe(coded, elim)["elimination"] > 0.95
    noise = geometry_jlens.elimination_probe(coords, elim)
    assert noise["n_probes"] == 5 and abs(noise["elimination"] - 0.5) < 0.1
    assert geometry_jlens.elimination_probe(coords, torch.zeros(400, 5, dtype=torch.bool))["n_probes"] == 0


def test_eliminated_marks_each_value_from_its_pair_on_and_j_overlap_is_one_for_a_model_with_itself():
    task = make_task("bijection")
    x = geometry_jlens.jlens_tokens(task, 3)
    want = torch.zeros(*x.shape, task.V, dtype=torch.bool)
    for n, row in enumerate(x.tolist()):
        for i in range(len(row)):
            for t in row[:i + 1]:
                if t >= task.V:
                    want[n, i, t - task.V] = True
    assert torch.equal(geometry_jlens.eliminated(x, task.V), want)
    d, T = 16, 5
    grams = torch.randn(2, T, d, d, generator=torch.Generator().manual_seed(2), dtype=D)
    grams = grams @ grams.transpose(-1, -2)
    assert geometry_jlens.j_overlap(grams, grams, rank=4) == pytest.approx(1.0)
    flipped = torch.eye(d, dtype=D).repeat(2, T, 1, 1)
    flipped[..., :4, :4] *= 10  # J-spaces span(e_0..e_3)
    other = torch.eye(d, dtype=D).repeat(2, T, 1, 1)
    other[..., 4:8, 4:8] *= 10  # and span(e_4..e_7): orthogonal
    assert geometry_jlens.j_overlap(flipped, other, rank=4) == pytest.approx(0.0, abs=1e-12)
