"""conditioning.py and conditioning_memory.py: the memory read-out against S = sum v k^T, capacity statistics against
Theorem 6's closed forms, the head-combination rules on hand-built read-outs, exact recovery by the delta rule under
drift, every subcommand end to end at toy sizes, and one-line errors (exit code 2) for bad input."""
from functools import partial
import errno
import json
import math
import os
import sys

import pytest
import torch

import conditioning as C
import conditioning_memory as M
from cli import exit_code

torch.set_num_threads(1)
TOY = ["--d_ks", "16", "32", "--trials", "40", "--prop_d_k", "16", "--chains", "256", "--depths", "1", "2", "4",
       "--heads", "1", "2", "--n_facts", "2", "--facts_per_chain", "2", "--n_entities", "4", "--ws", "1", "2", "8",
       "--nd", "2", "1", "--seeds", "0", "--max_iters", "2", "--batch_size", "4", "--eval_samples", "10",
       "--variants", "hebbian", "delta@1", "oja@0.5", "--n_keys", "8", "--drift_d", "16", "--steps", "120",
       "--period", "40", "--norm_every", "5"]


run = partial(exit_code, C.main)


@pytest.fixture(scope="module")
def toy(tmp_path_factory):
    out = tmp_path_factory.mktemp("conditioning")
    assert run(["all", "--results", str(out / "results"), "--scratch", str(out / "scratch")] + TOY) == 0
    return out / "results"


def test_store_and_read_is_S_q_and_orthonormal_keys_have_no_crosstalk():
    g = torch.Generator().manual_seed(0)
    K, V = M.unit(3, 2, 5, 8, g=g), M.unit(3, 2, 5, 6, g=g)
    Q = torch.randn(3, 2, 4, 8, generator=g, dtype=torch.float64)
    S = torch.einsum("bhnv,bhnk->bhvk", V, K)  # sum_j v_j k_j^T
    for budget in (1 << 22, 1):  # one batch, and one sequence per batch
        torch.testing.assert_close(M.store_and_read(K, V, Q, budget), Q @ S.transpose(-1, -2), rtol=1e-12, atol=1e-12)
    K = torch.linalg.qr(torch.randn(8, 5, generator=g, dtype=torch.float64))[0].T.expand(3, 2, 5, 8)
    torch.testing.assert_close(M.store_and_read(K, V, K), V, rtol=0, atol=1e-12)  # k_m . k_j = 0: the signal alone


def test_capacity_noise_matches_theorem_6():
    p = M.capacity_point(64, 17, "sphere", trials=200, delta=0.5, seed=0)
    assert abs(p["mean_noise"] / (16 / 64) - 1) < 0.05, p  # E|noise|^2 = (n - 1)/d_k for keys on the sphere
    assert M.capacity_point(64, 1, "sphere", 20, 0.5, 0)["mean_noise"] < 1e-28  # one pair: the signal, exactly
    elu = M.capacity_point(64, 17, "elu+1", trials=50, delta=0.5, seed=0)
    assert elu["mean_noise"] > 5 * 16 / 64 and elu["p_any"] == 1.0  # positive features: crosstalk of order 1


def test_largest_and_fit():
    calls = []
    assert M.largest(lambda n: calls.append(n) or n <= 37, 1000) == 37 and len(calls) <= 2 * math.log2(1000)
    assert M.largest(lambda n: n <= 37, 20) == 20 and M.largest(lambda n: n <= 1, 64) == 1
    a, b, r2 = M.fit([1, 2, 3, 5], [3, 5, 7, 11])
    assert (round(a, 12), round(b, 12), round(r2, 12)) == (2, 1, 1)


def test_one_layer_one_head_is_single_retrieval():
    g = torch.Generator().manual_seed(1)
    K, V = M.unit(300, 1, 8, 16, g=g), M.unit(300, 8, 16, g=g)
    noise = ((torch.einsum("bkv,bkd,bnd->bnv", V, K[:, 0], K[:, 0]) - V) ** 2).sum(-1)  # |S k_m - v_m|^2 by hand
    errs = M.chain_errors(M.store_and_read(K, V[:, None], K), V, 1, 0.5, [1], [1])
    for rule in M.COMBINE:
        assert errs[rule][1][1] == pytest.approx((noise >= 0.5).double().mean().item(), abs=1e-12)
    assert 0.1 < errs["best"][1][1] < 0.9  # a case where failures and successes both occur


def test_combination_rules_on_hand_built_read_outs():
    # 1 trial, 2 layers, 2 heads, 1 stored pair, d_v = 1, v = 0; noise = r^2 against delta = 0.5
    V = torch.zeros(2, 1, 1, dtype=torch.float64)
    # layer 0: head 0 right; layer 1: both wrong
    R = torch.tensor([[0.0, 1.0], [1.0, 1.0]], dtype=torch.float64).view(2, 2, 1, 1)
    e = M.chain_errors(R, V, 2, 0.5, [1, 2], [1, 2])
    assert e["best"][2] == {1: 0.0, 2: 1.0}  # layer 0 has a good head; layer 1 none
    assert e["sum"][2] == {1: 0.0, 2: 1.0}  # layer 0's average 0.5: noise 0.25 < 0.5
    assert e["majority"][2] == {1: 1.0, 2: 1.0}  # 1 of 2 heads is not more than half
    assert e["best"][1] == e["sum"][1] == e["majority"][1] == {1: 0.0, 2: 1.0}
    # decode, two stored values e_1, e_2: pair 0 reads (1, 0), right; pair 1 reads (0.6, 0.4), nearer the wrong one
    V2 = torch.eye(2, dtype=torch.float64)[None]
    R2 = torch.tensor([[1.0, 0.0], [0.6, 0.4]], dtype=torch.float64).view(1, 1, 2, 2)
    assert M.chain_errors(R2, V2, 1, 0.5, [1], [1], "decode")["best"][1][1] == 0.5


def test_delta_recovers_the_new_mapping_exactly_and_hebbian_grows():
    g = torch.Generator().manual_seed(3)
    K, idx, targets = M.drift_stream("abrupt", 8, 16, 180, 60, 0.0, "orthonormal", g)
    err, _ = M.track(K, idx, targets, "delta", 1.0, norm_every=7)
    for s in (0, 60, 120):  # once every key has been written since the switch, each retrieves its new value exactly
        seen, t_all = set(), None
        for t in range(s, s + 60):
            seen.add(idx[t].item())
            if len(seen) == 8:
                t_all = t
                break
        assert t_all is not None and err[t_all] < 1e-12 and err[t_all - 1] > 1e-3, (s, t_all)
    _, norms = M.track(K, idx, targets, "hebbian", None, norm_every=30)
    assert norms[-1] > 1.5 * norms[1]


def test_all_writes_every_json_and_summary(toy):
    r = {name: json.loads((toy / f"{name}.json").read_text()) for name in C.EXPERIMENTS}
    sphere = [c for c in r["capacity"]["capacity"] if c["features"] == "sphere"]
    assert [c["d_k"] for c in sphere] == [16, 32] and all(c["n_wc"] >= c["bound"] for c in sphere)
    assert len(r["propagation"]["rows"]) == 3 * 2 * 3 * 4  # rules x H x L x ratios
    rows = r["depth_width"]["rows"]
    assert {(x["arch"], x["model"]) for x in rows} == {(a, m) for a in ("wide", "deep") for m in ("linear", "softmax")}
    assert {(x["L"], x["H"]) for x in rows} == {(1, 2), (2, 1)}
    assert [(x["drift"], x["variant"]) for x in r["drift"]["runs"]][:3] == [("abrupt", v)
                                                                          for v in ("hebbian", "delta@1", "oja@0.5")]
    text = (toy / "summary.md").read_text()
    c = sphere[0]
    assert f"| sphere | 16 | {c['trials']} | {c['n_avg']} | 5.0 | {c['n_wc']} | 0.89 | {c['looseness']:.1f} |" in text
    for title in ("## Capacity", "## Error propagation", "## Wide-and-shallow", "## Concept drift"):
        assert title in text
    (a, b, r2), (e, _, r2e) = r["capacity"]["fits"]["sphere"].values()  # the fits, a row of numbers per feature
    assert f"| {a:.4f} | {b:+.2f} | {r2:.4f} | {a * 4:.3f} | {e:.2f} | {r2e:.3f} |" in text
    cells = [x for x in r["propagation"]["rows"] if x["bound"] < 1]
    assert f"| {len(cells)} | {sum(x['error'] <= x['bound'] for x in cells)} |" in text
    for N in (2,):  # wide against deep, per model
        m = lambda arch, kind: C.accuracies(rows, N, arch, kind)[0]
        w, d = m("wide", "linear"), m("deep", "linear")
        assert f"| {N} | linear | {w:.3f} | {d:.3f} | {w - d:+.3f} | {2 * rows[0]['chance']:.3f} |" in text
    assert "**" not in text  # tables of numbers; their reading is results/conditioning.md's
    (toy / "summary.md").unlink()
    assert run(["summary", "--results", str(toy)]) == 0  # rebuilt from the json files
    assert (toy / "summary.md").read_text() == text
    assert not [p for p in toy.iterdir() if p.name.endswith(".tmp")]


def test_all_draws_every_figure_and_summary_redraws_them(toy):
    pytest.importorskip("matplotlib")  # figures are optional: the json and summary.md come out without it
    assert all((toy / f"{name}.png").exists() for name in C.EXPERIMENTS)
    (toy / "drift.png").unlink()
    assert run(["summary", "--results", str(toy)]) == 0
    assert (toy / "drift.png").exists()


def test_one_subcommand_without_matplotlib(tmp_path, monkeypatch):
    monkeypatch.setitem(sys.modules, "matplotlib", None)  # import matplotlib raises ImportError
    assert run(["drift", "--results", str(tmp_path)] + TOY[TOY.index("--variants"):]) == 0
    assert (tmp_path / "drift.json").exists() and not (tmp_path / "drift.png").exists()


@pytest.mark.parametrize("argv, expect", [
    (["bogus"], "choose from 'capacity', 'propagation', 'depth_width', 'drift', 'all'"),
    ([], "required"),
    (["capacity", "--d_k", "16"], "unrecognized arguments: --d_k"),
    (["propagation", "--criterion", "x"], "choose from 'threshold', 'decode'"),
    (["drift", "--variants", "hebb@1"], "valid: hebbian, delta, oja"),
    (["capacity", "--d_ks", "0"], "--d_ks must be > 0"),
    (["depth_width", "--ws", "2", "4"], "--ws takes 3 numbers"),
    (["drift", "--keys", "orthonormal", "--n_keys", "80", "--drift_d", "16"], "error"),
    (["drift", "--threads", "-1"], "--threads must be >= 0"),
    (["capacity", "--eps", "nan"], "--eps must be a finite number, got nan"),
    (["drift", "--sigma", "nan"], "--sigma must be a finite number, got nan"),
    (["drift", "--sigma", "inf"], "--sigma must be a finite number, got inf"),
    (["capacity", "--eps", "inf"], "--eps must be a finite number, got inf"),
    (["propagation", "--ratios", "0.5", "nan"], "--ratios must be a finite number, got 0.5 nan"),
    (["propagation", "--ratios", "inf"], "--ratios must be a finite number, got inf"),
    (["summary", "--results", "/nonexistent/conditioning"], "--results /nonexistent/conditioning: no such folder"),
    (["drift", "--results", "/proc/version"], "--results /proc/version: cannot write there"),
    (["depth_width", "--scratch", "/proc/version/x"], "--scratch /proc/version/x: cannot write there"),
])
def test_bad_input_is_a_one_line_error(capsys, argv, expect):
    assert run(argv) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and expect in err, err


def test_depth_width_runs_again_over_its_scratch_runs(tmp_path):
    argv = ["depth_width", "--results", str(tmp_path / "r"), "--scratch", str(tmp_path / "s"), "--twin", "false"]
    argv += TOY[TOY.index("--n_facts"):TOY.index("--variants")]
    assert run(argv) == 0 and run(argv) == 0  # the scratch runs are replaced, not refused


def test_a_diverged_cell_is_reported_in_its_table(tmp_path, monkeypatch):
    real = C.train.main  # the deep cells train with a step so large that the loss or the parameters overflow
    monkeypatch.setattr(C.train, "main", lambda argv: real(argv + ["--lr=1e30"] * any("_deep_" in a for a in argv)))
    argv = ["depth_width", "--results", str(tmp_path / "r"), "--scratch", str(tmp_path / "s"), "--twin", "false"]
    assert run(argv + TOY[TOY.index("--n_facts"):TOY.index("--variants")]) == 0
    r = json.loads((tmp_path / "r" / "depth_width.json").read_text())
    assert [(x["arch"], x["diverged"], x["accuracy"] is None) for x in r["rows"]] == [("wide", False, False),
                                                                                      ("deep", True, True)]
    text = "\n".join(C.report_depth_width(r))
    assert "| diverged (diverged); (2, 1, " in text
    assert f"| 2 | linear | {r['rows'][0]['accuracy']:.3f} | — | — |" in text


def test_a_full_disk_is_one_line_and_exit_code_1(tmp_path, monkeypatch, capsys):
    class Full:  # a file on a full disk: the write fails
        def __init__(self, *a, **kw):
            pass

        def __enter__(self):
            return self

        def __exit__(self, *exc):
            return False

        def write(self, data):
            raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))
    monkeypatch.setattr(C.checkpoints, "open", Full, raising=False)  # checkpoints.write_text's open
    assert run(["drift", "--results", str(tmp_path)] + TOY[TOY.index("--variants"):]) == 1
    err = capsys.readouterr().err.strip()
    assert err == (f"conditioning.py: error: {tmp_path / 'drift.json'}: No space left on device; "
                   "the files written before it are kept"), err
    assert not list(tmp_path.iterdir())  # no drift.json, whole or partial, and no .tmp left behind
