"""geometry.py: its statistics on constructed cases, every diagnostic on tiny checkpoints, bad input."""
from functools import partial
import json
import math
import os
import subprocess
import sys

import pytest
import torch
import torch.nn as nn

import geometry
import runtime
import train
from cli import exit_code
from tasks import make_task
from transformer import Transformer, TransformerConfig

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
D = torch.float64


def tiny(**kw):
    c = dict(vocab_size=10, n_classes=5, answer_offset=5, block_size=9, n_layer=2, n_head=2, d_model=16)
    torch.manual_seed(0)
    return Transformer(TransformerConfig(**(c | kw))).double().eval()


def test_orthogonal_keys_give_zero_and_parallel_keys_one():
    Q, _ = torch.linalg.qr(torch.randn(16, 16, dtype=D))
    assert geometry.offdiag_abs_cos(Q[:10] * torch.rand(10, 1, dtype=D)).item() < 1e-12
    assert abs(geometry.offdiag_abs_cos(-torch.ones(4, 3, dtype=D)).item() - 1) < 1e-12
    two = torch.tensor([[1.0, 0.0], [0.5, 3 ** 0.5 / 2]], dtype=D)  # 60 degrees apart
    assert abs(geometry.offdiag_abs_cos(two).item() - 0.5) < 1e-12


def test_a_model_with_orthogonal_hypothesis_keys_scores_zero():
    model, task = tiny(), make_task("bijection", V=5)
    tokens = geometry.hypothesis_tokens(task)
    assert tokens.tolist() == [5, 6, 7, 8, 9]  # the value tokens
    with torch.no_grad():  # value token 5 + i embeds as e_i + e_{8+i}; W_K = I: each head sees e_i
        model.wte.weight[5:10] = torch.eye(16, dtype=D)[:5] + torch.eye(16, dtype=D)[8:13]
        model.blocks[0].attn.c_attn.weight[16:32] = torch.eye(16, dtype=D)
    cos, _ = geometry.key_frame(model, tokens)
    assert cos.shape == (2, 2) and cos[0].abs().max() < 1e-12 and cos[1].min() > 0


def test_pca_shares_and_dimensions():
    X = torch.tensor([[3, 0, 0], [-3, 0, 0], [0, 2, 0], [0, -2, 0], [0, 0, 1], [0, 0, -1]], dtype=D)
    _, share = geometry.pca(X)
    assert torch.allclose(share, torch.tensor([9, 4, 1], dtype=D) / 14)
    r, _ = geometry.manifold_stats(X, torch.arange(6, dtype=D))
    assert (r["dims_90"], r["dims_95"]) == (2, 3)


def test_a_representation_linear_in_entropy_gives_r2_one():
    g = torch.Generator().manual_seed(0)
    H = 4 * torch.rand(600, generator=g, dtype=D)
    a, b = torch.randn(1, 8, generator=g, dtype=D), torch.randn(8, generator=g, dtype=D)
    r, _ = geometry.manifold_stats(H[:, None] * a + b, H)
    assert abs(r["probe_r2"] - 1) < 1e-9 and abs(r["corr_pc1"] - 1) < 1e-9
    assert abs(r["pc1_share"] - 1) < 1e-9 and r["dims_90"] == 1
    noisy = torch.cat([H[:, None] * a + b, torch.randn(600, 5, generator=g, dtype=D)], 1)  # H still in the span
    assert abs(geometry.probe_r2(noisy, H) - 1) < 1e-9
    assert abs(geometry.probe_r2(torch.randn(600, 3, generator=g, dtype=D), H)) < 0.05  # unrelated: about 0


def test_silhouette_by_hand():
    X, labels = torch.tensor([[0.0], [1.0], [10.0], [11.0]], dtype=D), torch.tensor([0, 0, 1, 1])
    want = (9.5 / 10.5 + 8.5 / 9.5) / 2  # a = 1 for every point; b = 10.5, 9.5, 9.5, 10.5
    assert abs(geometry.silhouette(X, labels) - want) < 1e-12
    assert geometry.silhouette(torch.tensor([[0.0], [1.0], [5.0]], dtype=D), torch.tensor([0, 0, 1])) == \
        pytest.approx(((5 - 1) / 5 + (4 - 1) / 4 + 0) / 3)  # a point alone in its cluster scores 0
    assert math.isnan(geometry.silhouette(X, torch.zeros(4, dtype=torch.long)))  # one cluster: undefined


def test_js_divergence():
    p = torch.tensor([[0.2, 0.8, 0.0], [1.0, 0.0, 0.0]], dtype=D)
    q = torch.tensor([[0.2, 0.8, 0.0], [0.0, 0.5, 0.5]], dtype=D)
    assert torch.allclose(geometry.js_bits(p, q), torch.tensor([0.0, 1.0], dtype=D))


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
    state = runtime.load_checkpoint(os.path.join(runs[name], "ckpt.pt"))
    torch.manual_seed(state["config"]["train"]["seed"])  # as train.run does before train.build
    _, _, model, _, _ = train.build(state["config"], torch.device("cpu"))
    fresh = geometry.build_model(state, trained=False)
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
    a = read(runs["bij"], "ablate")
    assert [r["ablation"] for r in a["ablations"]][:3] == ["skip L0", "skip L1", "mask L0H0"]
    assert len(a["ablations"]) == 2 + 2 * 3
    dyn = read(runs["bij"], "dynamics")
    assert [r["step"] for r in dyn["steps"]] == [1, 2, 3, 6]  # runtime.log_spaced(6), the last is ckpt.pt
    assert dyn["steps"][-1]["att_similarity"] == [1.0, 1.0] and len(dyn["summary"]["attention_settled_step"]) == 2
    assert not os.path.exists(os.path.join(runs["bij"], "geometry_clusters.json"))  # not hmm


@pytest.mark.parametrize("name", ["mamba", "lstm", "hmm"])
def test_clusters_and_values_on_tiny_hmm_models(runs, name):
    assert geometry_main(["all", "--ckpt", runs[name], "--n_seq", "30", "--no_plot"]) == 0
    c = read(runs[name], "clusters")
    assert list(c["layers"])[:3] == ["emb", "L1", "final"] and -1 <= c["layers"]["final"]["silhouette"] <= 1
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
    (["clusters", "--ckpt", "{bij}"], "clusters needs an hmm checkpoint"),
    (["values", "--ckpt", "{bij}/nowhere"], "no checkpoint at"),
    (["value", "--ckpt", "{bij}"], "invalid choice"),
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


@pytest.mark.parametrize("content", [b"", b"\x80\x02garbage", b"epoch,loss\n"])
def test_unreadable_checkpoint_from_the_shell(tmp_path, content):
    (tmp_path / "ckpt.pt").write_bytes(content)
    p = subprocess.run([sys.executable, "geometry.py", "ablate", "--ckpt", str(tmp_path)], cwd=ROOT,
                       capture_output=True, text=True)
    assert p.returncode == 2 and "Traceback" not in p.stderr and p.stderr.count("\n") == 1, p.stderr
    assert "not a readable train.py checkpoint (truncated or corrupt?)" in p.stderr
