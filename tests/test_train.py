"""train.py end to end: learning, resume, eval-only, checkpoints, divergence and bad input."""
from functools import partial
import json
import os
import subprocess
import sys

import pytest
import torch

import tasks
import train
from cli import exit_code

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
TINY = ["--task", "bijection", "--V", "6", "--n_layer", "1", "--n_head", "2", "--n_embd", "16",
        "--batch_size", "16", "--log_interval", "5", "--eval_samples", "50", "--eval_samples_during", "50"]


run_main = partial(exit_code, train.main)


def test_a_few_steps_lower_the_loss():
    torch.manual_seed(0)
    task = tasks.make_task("bijection", V=6)
    cfg = train.build_config("bijection", "transformer", "quick", dict(V=6, n_layer=1, n_embd=32, lr=3e-3))
    _, _, model, opt, _ = train.build(cfg, torch.device("cpu"))
    fixed = task.sample(256, torch.Generator().manual_seed(1))
    before = task.loss(model(fixed.x), fixed).item()
    g = torch.Generator().manual_seed(2)
    for _ in range(60):
        b = task.sample(64, g)
        loss = task.loss(model(b.x), b)
        opt.zero_grad()
        loss.backward()
        opt.step()
    assert task.loss(model(fixed.x), fixed).item() < before - 0.1


@pytest.mark.parametrize("name", ["hmm", "regression", "recall"])
def test_every_task_runs_and_writes_results(tmp_path, name):
    small = dict(hmm=["--K", "4", "--n_states", "3", "--n_obs", "3", "--eval_K", "6"], regression=["--K", "4", "--d", "2"],
                 recall=["--n_pairs", "4", "--n_queries", "2", "--key_vocab", "8", "--value_vocab", "8", "--filler", "2"])
    argv = ["--task", name, "--max_iters", "4", "--eval_interval", "2", "--log_interval", "2", "--n_layer", "1",
            "--n_embd", "16", "--n_head", "2", "--batch_size", "8", "--eval_samples", "20", "--eval_samples_during", "10",
            "--out_dir", str(tmp_path)] + small[name]
    assert run_main(argv) == 0
    r = json.load(open(tmp_path / "results.json"))
    assert r["iters"] == 4 and r["n_params"] > 0 and len(r["history"]) == 2
    assert set(r["metrics"]) == ({"default", "K6"} if name == "hmm" else {"default"})
    m = r["metrics"]["default"]
    assert {"mae_curve", "mae_token", "kl", "curve_model", "curve_oracle"} <= set(m)
    assert m["mae_token"] >= m["mae_curve"] - 1e-12


@pytest.mark.parametrize("chunk", ["1", "4"])  # with 4 batches per draw, step 6 is in the middle of a chunk
def test_resume_continues_identically(tmp_path, chunk):
    a, b = tmp_path / "a", tmp_path / "b"
    common = TINY + ["--max_iters", "12", "--eval_interval", "6", "--data_chunk", chunk, "--data_device", "device"]
    assert run_main(common + ["--out_dir", str(a), "--ckpt_schedule", "eval"]) == 0
    os.makedirs(b)
    os.replace(a / "ckpt_0000006.pt", b / "ckpt.pt")  # as if the run had stopped at step 6
    assert run_main(["--task", "bijection", "--resume", "--out_dir", str(b)]) == 0
    sa = torch.load(a / "ckpt.pt", weights_only=True)
    sb = torch.load(b / "ckpt.pt", weights_only=True)
    assert sb["iter"] == sa["iter"] == 12
    for k in sa["model"]:
        assert torch.equal(sa["model"][k], sb["model"][k]), k
    ra, rb = json.load(open(a / "results.json")), json.load(open(b / "results.json"))
    assert ra["metrics"] == rb["metrics"]


def test_muon_runs_save_and_resume_identically(tmp_path):
    a, b = tmp_path / "a", tmp_path / "b"
    common = TINY + ["--optimizer", "muon", "--max_iters", "12", "--eval_interval", "6"]
    assert run_main(common + ["--out_dir", str(a), "--ckpt_schedule", "eval"]) == 0
    state = torch.load(a / "ckpt_0000006.pt", weights_only=True)
    adamw, muon = state["optimizer"]  # both optimizers' states are in the checkpoint
    assert adamw["state"] and muon["state"] and all("momentum_buffer" in s for s in muon["state"].values())
    os.makedirs(b)
    os.replace(a / "ckpt_0000006.pt", b / "ckpt.pt")
    assert run_main(["--task", "bijection", "--resume", "--out_dir", str(b)]) == 0
    sa, sb = (torch.load(p / "ckpt.pt", weights_only=True) for p in (a, b))
    for k in sa["model"]:
        assert torch.equal(sa["model"][k], sb["model"][k]), k


def test_muon_takes_the_hidden_matrices_and_adamw_the_rest():
    cfg = train.build_config("hmm", "transformer", "quick", dict(optimizer="muon", n_layer=1))
    _, _, model, opt, _ = train.build(cfg, torch.device("cpu"))
    adamw, muon = opt.opts
    names = {id(p): n for n, p in model.named_parameters()}
    in_muon = {names[id(p)] for g in muon.param_groups for p in g["params"]}
    assert in_muon == {n for n, p in model.named_parameters() if n.startswith("blocks.") and p.dim() == 2}
    assert {"wte.weight", "wpe.weight", "head.weight"} <= {names[id(p)] for g in adamw.param_groups for p in g["params"]}
    assert len(in_muon) + sum(len(g["params"]) for g in adamw.param_groups) == len(names)


def test_muon_needs_torch_2_9(monkeypatch, capsys):
    monkeypatch.delattr(torch.optim, "Muon")
    assert run_main(TINY + ["--optimizer", "muon", "--max_iters", "1"]) == 2
    assert "--optimizer muon needs torch >= 2.9" in capsys.readouterr().err


def test_resuming_a_gpu_drawn_run_on_a_cpu_reseeds_the_batches(tmp_path, capsys):
    assert run_main(TINY + ["--max_iters", "4", "--eval_interval", "2", "--out_dir", str(tmp_path)]) == 0
    state = torch.load(tmp_path / "ckpt.pt", weights_only=True)
    state["gen_state"], state["iter"] = torch.zeros(16, dtype=torch.uint8), 2  # a CUDA generator's state
    torch.save(state, tmp_path / "ckpt.pt")
    assert run_main(["--task", "bijection", "--resume", "--out_dir", str(tmp_path)]) == 0
    assert "reseeding" in capsys.readouterr().out
    assert torch.load(tmp_path / "ckpt.pt", weights_only=True)["iter"] == 4


def test_eval_only_and_log_spaced_checkpoints(tmp_path):
    assert run_main(TINY + ["--max_iters", "12", "--eval_interval", "12", "--ckpt_schedule", "log", "--out_dir", str(tmp_path)]) == 0
    assert sorted(p for p in os.listdir(tmp_path) if p.startswith("ckpt_")) == \
        [f"ckpt_{i:07d}.pt" for i in (1, 2, 3, 6, 10)]
    assert run_main(["--task", "bijection", "--eval_only", "--out_dir", str(tmp_path), "--eval_samples", "30"]) == 0
    r = json.load(open(tmp_path / "eval.json"))
    assert r["metrics"]["default"]["n_sequences"] == 30 and r["iters"] == 12


def test_eval_only_beyond_the_trained_context_is_a_clear_error(tmp_path, capsys):
    argv = ["--task", "hmm", "--K", "3", "--n_layer", "1", "--n_head", "2", "--n_embd", "16", "--max_iters", "2",
            "--eval_interval", "2", "--eval_K", "4", "--eval_samples", "10", "--eval_samples_during", "10",
            "--out_dir", str(tmp_path)]
    assert run_main(argv) == 0
    assert run_main(["--task", "hmm", "--eval_only", "--out_dir", str(tmp_path), "--eval_K", "9"]) == 2
    err = capsys.readouterr().err.strip().splitlines()[-1]
    assert "exceed the model's context block_size=61" in err, err


def test_nan_loss_stops_and_keeps_the_last_good_checkpoint(tmp_path, monkeypatch):
    calls = {"n": 0}
    real = tasks.Task.loss

    def poisoned(self, out, batch):
        calls["n"] += 1
        loss = real(self, out, batch)
        return loss * float("nan") if calls["n"] > 7 else loss

    monkeypatch.setattr(tasks.Task, "loss", poisoned)
    assert run_main(TINY + ["--max_iters", "20", "--eval_interval", "5", "--out_dir", str(tmp_path)]) == 1
    state = torch.load(tmp_path / "ckpt.pt", weights_only=True)
    assert state["iter"] == 5
    assert all(torch.isfinite(p).all() for p in state["model"].values())
    assert not (tmp_path / "results.json").exists()


def test_resume_fills_in_settings_added_after_the_checkpoint(tmp_path):
    assert run_main(TINY + ["--max_iters", "4", "--eval_interval", "4", "--out_dir", str(tmp_path)]) == 0
    state = torch.load(tmp_path / "ckpt.pt", weights_only=True)
    del state["config"]["train"]["stop_at"]  # as written before the flag existed
    torch.save(state, tmp_path / "ckpt.pt")
    assert run_main(["--task", "bijection", "--resume", "--max_iters", "6", "--out_dir", str(tmp_path)]) == 0
    assert json.load(open(tmp_path / "results.json"))["iters"] == 6


def test_stop_at_ends_the_run_at_the_first_evaluation_that_reaches_it(tmp_path):
    argv = TINY + ["--max_iters", "12", "--eval_interval", "4"]
    assert run_main(argv + ["--stop_at", "kl<=100", "--out_dir", str(tmp_path / "a")]) == 0  # met at once
    assert run_main(argv + ["--stop_at", "accuracy>=1.01", "--out_dir", str(tmp_path / "b")]) == 0  # never met
    a, b = (json.load(open(tmp_path / d / "results.json")) for d in "ab")
    assert a["iters"] == 4 and [h["iter"] for h in a["history"]] == [4]
    assert b["iters"] == 12 and [h["iter"] for h in b["history"]] == [4, 8, 12]


class NotATensor:
    pass


@pytest.mark.parametrize("bad", ["missing", "garbage", "pickled_object"])
def test_bad_checkpoints_are_clear_errors(tmp_path, capsys, bad):
    if bad == "garbage":
        (tmp_path / "ckpt.pt").write_bytes(b"not a checkpoint")
    elif bad == "pickled_object":
        torch.save({"model": NotATensor()}, tmp_path / "ckpt.pt")  # loading would need to run code
    assert run_main(["--task", "bijection", "--eval_only", "--out_dir", str(tmp_path)]) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and ("no checkpoint" in err or "cannot load checkpoint" in err)


@pytest.mark.parametrize("argv, expect", [
    (["--task", "nope"], "invalid choice: 'nope' (choose from 'bijection', 'hmm', 'regression', 'recall', 'hop')"),
    (["--model", "rnn"], "invalid choice: 'rnn'"),
    (["--preset", "huge"], "invalid choice: 'huge'"),
    (["--lrr", "1"], "did you mean --lr"),
    (["--max_iter", "5"], "did you mean --max_iters"),
    (["--task", "bijection", "--K", "5"], "unrecognized arguments: --K"),
    (["--task", "bijection", "--V", "1"], "V must be an int >= 2"),
    (["--task", "bijection", "--L", "30"], "L must be <= V=20"),
    (["--task", "hmm", "--K", "0"], "K must be an int >= 1"),
    (["--task", "recall", "--n_pairs", "100", "--key_vocab", "50"], "needs key_vocab and value_vocab >= n_pairs"),
    (["--task", "hmm", "--block_size", "80"], "exceed the model's context block_size=80"),
    (["--task", "bijection", "--eval_K", "30"], "--eval_K needs a task with a K option"),
    (["--task", "bijection", "--n_embd", "30", "--n_head", "4"], "must split into n_head=4 heads"),
    (["--task", "bijection", "--pos", "sinusoidal"], "pos must be one of"),
    (["--task", "bijection", "--with_replacement", "maybe"], "expected true or false"),
    (["--task", "bijection", "--stop_at", "mae<=0.1"], "expected METRIC<=X or METRIC>=X"),
    (["--task", "regression", "--stop_at", "accuracy>=0.9"], "regression has no accuracy"),
    (["--task", "bijection", "--batch_size", "0"], "--batch_size must be >= 1, got 0"),
    (["--task", "bijection", "--data_chunk", "-1"], "--data_chunk must be >= 0"),
    (["--task", "bijection", "--data_device", "gpu"], "invalid choice: 'gpu' (choose from 'auto', 'cpu', 'device')"),
    (["--task", "bijection", "--optimizer", "sgd"], "invalid choice: 'sgd' (choose from 'adamw', 'muon')"),
    (["--task", "hmm", "--n_pos", "500"], "n_pos must be in 0..block_size"),
])
def test_bad_input_is_a_one_line_error(capsys, argv, expect):
    assert run_main(argv + ["--max_iters", "0", "--out_dir", "/nonexistent/never"]) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and expect in err, err


def test_cli_exit_code_and_no_traceback():
    p = subprocess.run([sys.executable, "train.py", "--task", "recall", "--n_pairs", "0"], cwd=ROOT,
                       capture_output=True, text=True, timeout=120)
    assert p.returncode == 2 and "Traceback" not in p.stderr and "n_pairs must be an int >= 1" in p.stderr
