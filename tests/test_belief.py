"""geometry.py belief: the ridge probe on planted and random representations, end to end on tiny checkpoints."""
from functools import partial
import json
import os

import pytest
import torch

import geometry
import geometry_stats
import train
from cli import exit_code
from tasks import make_task
from test_geometry import HMM, SMALL

D = torch.float64


def beliefs(n, S, g):
    """n random points of the (S-1)-simplex (Dirichlet(1)), each the belief of its own sequence."""
    e = -torch.rand(n, S, generator=g, dtype=D).log()
    return e / e.sum(-1, keepdim=True)


def test_ridge_is_the_closed_form():
    g = torch.Generator().manual_seed(0)
    X, Y = torch.randn(50, 6, generator=g, dtype=D), torch.randn(50, 2, generator=g, dtype=D)
    (W, b), = geometry_stats.ridge(X, Y, [0.1])
    Xc = X - X.mean(0)
    lam = 0.1 * (Xc ** 2).sum() / 6
    assert torch.allclose(W, torch.linalg.solve(Xc.T @ Xc + lam * torch.eye(6, dtype=D), Xc.T @ (Y - Y.mean(0))))
    assert torch.allclose(b, Y.mean(0) - X.mean(0) @ W)


@pytest.mark.parametrize("S", [3, 5])
def test_the_probe_recovers_a_planted_linear_belief(S):
    g = torch.Generator().manual_seed(S)
    n = 400
    Y = beliefs(n, S, g)
    # the belief in a random S-dim subspace of 12 dims, plus 4 unrelated ones, shifted
    X = torch.cat([Y @ torch.randn(S, 12, generator=g, dtype=D), torch.randn(n, 4, generator=g, dtype=D)], 1) + 3
    alpha, P = geometry_stats.probe(X, Y, torch.arange(n), n)
    task = make_task("hmm", n_states=S)
    assert alpha == 1e-8 and geometry_stats.r2(Y[n // 2:], P) > 1 - 1e-9
    assert geometry_stats.belief_kl(Y[n // 2:], P, task.gaussian).abs().max() < 1e-9


def test_the_gaussian_target_planted_and_its_kl():
    g = torch.Generator().manual_seed(1)
    Y = torch.stack([torch.randn(300, generator=g, dtype=D), torch.rand(300, generator=g, dtype=D) - 1], 1)
    X = Y @ torch.randn(2, 8, generator=g, dtype=D)
    task = make_task("regression")
    _, P = geometry_stats.probe(X, Y, torch.arange(300) // 3, 100)  # 3 points per sequence
    assert geometry_stats.r2(Y[150:], P) > 1 - 1e-9
    assert geometry_stats.belief_kl(Y[150:], P, task.gaussian).abs().max() < 1e-9
    kl = geometry_stats.belief_kl(torch.zeros(1, 2, dtype=D), torch.tensor([[1.0, 0.0]], dtype=D), task.gaussian)
    assert abs(kl.item() - 0.5 / geometry_stats.LOG2) < 1e-12  # KL(N(0, 1) || N(1, 1)) = 1/2 nat


def test_a_random_representation_scores_near_zero_held_out():
    g = torch.Generator().manual_seed(0)
    Y, X = beliefs(2000, 3, g), torch.randn(2000, 16, generator=g, dtype=D)
    alpha, P = geometry_stats.probe(X, Y, torch.arange(2000) // 10, 200)
    assert abs(geometry_stats.r2(Y[1000:], P)) < 0.02
    assert alpha >= 1e-2  # the validation half prefers shrinking an unrelated map towards the mean


# -----------------------------------------------------------------------------
# end to end on tiny checkpoints written by train.py

WIDTH = dict(transformer=["--n_head", "2", "--d_model", "16"], linear_attn=["--n_head", "2", "--d_model", "16"],
             mamba=["--d_model", "16"], lstm=["--d_model", "16"], mlp=["--d_model", "16", "--d_flat", "4"])


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    d = tmp_path_factory.mktemp("belief")
    argvs = {m: HMM + ["--model", m] + w for m, w in WIDTH.items()}
    argvs["recall"] = ["--task", "recall", "--n_pairs", "4", "--n_queries", "2", "--key_vocab", "8",
                       "--value_vocab", "8", "--filler", "2", "--n_head", "2", "--d_model", "16"]
    argvs["regression"] = ["--task", "regression", "--K", "4", "--d", "2", "--n_head", "2", "--d_model", "16"]
    for name, argv in argvs.items():
        assert train.main(argv + SMALL + ["--out_dir", str(d / name)]) == 0
    return {name: str(d / name) for name in argvs}


geometry_main = partial(exit_code, geometry.main)


@pytest.mark.parametrize("name", list(WIDTH) + ["regression"])
def test_belief_on_every_model(runs, name):
    assert geometry_main(["belief", "--ckpt", runs[name], "--n_seq", "16", "--no_plot"]) == 0
    r = json.load(open(os.path.join(runs[name], "geometry_belief.json")))
    assert list(r["layers"]) == ["emb", "L1", "final"] and r["n_fit"] == r["n_scored"] == 8 * 4  # K = 4
    for row in [r["tokens"], r["constant"]] + [v for l in r["layers"].values() for v in l.values()]:
        assert row["r2"] <= 1 and row["kl_bits"] >= 0
    assert r["target"] == ("(mean, log var)" if name == "regression" else "P over 3 hidden states")
    assert not any(f.endswith(".tmp") for f in os.listdir(runs[name]))


def test_the_belief_figure(runs):
    pytest.importorskip("matplotlib")
    for name in ("transformer", "regression"):
        assert geometry_main(["belief", "--ckpt", runs[name], "--n_seq", "8"]) == 0
        assert os.path.getsize(os.path.join(runs[name], "geometry_belief.png")) > 1000


@pytest.mark.parametrize("argv, message", [
    (["belief", "--ckpt", "{recall}"], "recall's is a point mass on one answer"),
    (["belief", "--ckpt", "{lstm}", "--n_seq", "3"], "belief needs --n_seq >= 4"),
    (["belief", "--ckpt", "{lstm}/nowhere"], "no checkpoint at"),
])
def test_bad_input_is_a_one_line_error(runs, capsys, argv, message):
    assert geometry_main([a.format(**runs) for a in argv]) == 2
    err = capsys.readouterr().err
    assert message in err and err.count("\n") == 1
