"""train.py end to end: learning, resume, eval-only, checkpoints, divergence and bad input."""
from functools import partial
import json
import math
import os
import re

from unittest import mock

import pytest
import torch
import torch.nn.functional as F

import batches
import evaluation
import optim
import runtime
import tasks
import presets
import train
from cli import exit_code
from conftest import loss_before_after
import settings

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
TINY = ["--task", "bijection", "--V", "6", "--n_layer", "1", "--n_head", "2", "--d_model", "16",
        "--batch_size", "16", "--log_interval", "5", "--eval_samples", "50", "--eval_samples_during", "50"]


run_main = partial(exit_code, train.main)


def test_a_few_steps_lower_the_loss():
    before, after = loss_before_after("transformer", dict(n_layer=1, d_model=32, lr=3e-3), steps=60)
    assert after < before - 0.1


@pytest.mark.parametrize("name", ["hmm", "regression", "recall"])
def test_every_task_runs_and_writes_results(tmp_path, name):
    small = dict(hmm=["--K", "4", "--n_states", "3", "--n_obs", "3", "--eval_K", "6"],
                 regression=["--K", "4", "--d", "2"],
                 recall=["--n_pairs", "4", "--n_queries", "2", "--key_vocab", "8", "--value_vocab", "8",
                         "--filler", "2"])
    argv = ["--task", name, "--max_iters", "4", "--eval_interval", "2", "--log_interval", "2", "--n_layer", "1",
            "--d_model", "16", "--n_head", "2", "--batch_size", "8", "--eval_samples", "20",
            "--eval_samples_during", "10", "--out_dir", str(tmp_path)] + small[name]
    assert run_main(argv) == 0
    r = json.load(open(tmp_path / "results.json"))
    assert r["iters"] == 4 and r["n_params"] > 0 and len(r["history"]) == 2
    assert set(r["metrics"]) == ({"default", "K6"} if name == "hmm" else {"default"})
    m = r["metrics"]["default"]
    assert {"mae_curve", "mae_token", "kl", "curve_model", "curve_oracle"} <= set(m)
    assert m["mae_token"] >= m["mae_curve"] - 1e-12


def run_and_resume(tmp_path, argv, task="bijection"):
    """Run argv (12 steps, an evaluation every 6) into a/, resume its step-6 snapshot in b/ as if the run had
    stopped there, check both end with the same model; returns a, b."""
    a, b = tmp_path / "a", tmp_path / "b"
    assert run_main(argv + ["--max_iters", "12", "--eval_interval", "6", "--out_dir", str(a),
                            "--ckpt_schedule", "eval"]) == 0
    os.makedirs(b)
    os.replace(a / "ckpt_0000006.pt", b / "ckpt.pt")
    assert run_main(["--task", task, "--resume", "--out_dir", str(b)]) == 0
    sa, sb = (torch.load(p / "ckpt.pt", weights_only=True) for p in (a, b))
    assert sb["iter"] == sa["iter"] == 12
    for k in sa["model"]:
        assert torch.equal(sa["model"][k], sb["model"][k]), k
    return a, b


# with 4 batches per draw, step 6 is in the middle of a chunk; dropout needs torch's global RNG restored
@pytest.mark.parametrize("chunk, dropout", [("1", "0.2"), ("4", "0")])
def test_resume_continues_identically(tmp_path, chunk, dropout):
    a, b = run_and_resume(tmp_path, TINY + ["--data_chunk", chunk, "--data_device", "device", "--dropout", dropout])
    ra, rb = json.load(open(a / "results.json")), json.load(open(b / "results.json"))
    assert ra["metrics"] == rb["metrics"]


def test_muon_runs_save_and_resume_identically(tmp_path):
    a, b = run_and_resume(tmp_path, TINY + ["--optimizer", "muon"])
    adamw, muon = torch.load(a / "ckpt.pt", weights_only=True)["optimizer"]  # both optimizers' states are kept
    assert adamw["state"] and muon["state"] and all("momentum_buffer" in s for s in muon["state"].values())


def test_curriculum_grows_the_option_in_equal_stages_and_resumes_identically(tmp_path):
    opts = dict(n_pairs=8, n_queries=2, key_vocab=16, value_vocab=16, filler=2)
    task = tasks.make_task("recall", **opts)
    grow = lambda spec, **kw: settings.Curriculum("recall", opts, CURRICULUM | dict(curriculum=spec, **kw), task)
    stage = grow("n_pairs=5", curriculum_iters=8, max_iters=20)
    assert [stage(it).n_pairs for it in range(12)] == [5, 5, 6, 6, 7, 7, 8, 8, 8, 8, 8, 8]
    assert stage(10) == task and stage(0).seq_len < task.seq_len
    assert stage.tokens(0, 12) == sum(stage(it).seq_len for it in range(12))  # in closed form, not step by step
    assert grow("")(3) is task
    held = grow("n_pairs=5", curriculum_iters=8, curriculum_hold=4, max_iters=20)
    assert [held(it).n_pairs for it in range(10)] == [5, 5, 5, 5, 5, 6, 7, 8, 8, 8]  # 4 steps at 5, then grown by 8
    assert held.tokens(2, 9) == sum(held(it).seq_len for it in range(2, 9))
    with pytest.raises(ValueError, match="--curriculum_hold 8 must be below --curriculum_iters"):
        grow("n_pairs=5", curriculum_iters=8, curriculum_hold=8, max_iters=20)
    with pytest.raises(ValueError, match="--curriculum_hold 4 needs a --curriculum"):
        grow("", curriculum_iters=8, curriculum_hold=4, max_iters=20)
    run_and_resume(tmp_path, ["--task", "recall", "--n_pairs", "8", "--n_queries", "2", "--key_vocab", "16",
                              "--value_vocab", "16", "--filler", "2", "--n_layer", "1", "--d_model", "16",
                              "--batch_size", "8", "--eval_samples", "20", "--eval_samples_during", "20",
                              "--curriculum", "n_pairs=3", "--curriculum_iters", "10"], task="recall")


CURRICULUM = dict(curriculum_hold=0, train_all_queries=False, lr_decay_iters=0)  # what Curriculum reads besides


def test_every_preset_curriculum_is_valid():
    found = []
    for preset in presets.PRESETS:
        for task in [t for t in presets.PRESETS[preset] if t != "any task"]:
            for model in presets.MODELS:
                run = settings.run_of(task, model, preset, {})
                if run.train["curriculum"]:
                    stage = run.curriculum
                    assert stage(run.train["max_iters"]) == stage.layout and stage(0) != stage.layout
                    found.append((preset, task))
    assert ("quick", "regression") in found and ("cpu_paper_task", "recall") in found


MUON = {  # per model, the parameters of block 0 that Muon takes (every other block the same)
    "transformer": {"attn.c_attn.weight", "attn.c_proj.weight", "mlp.c_fc.weight", "mlp.c_proj.weight"},
    "mamba": {"mixer.in_proj.weight", "mixer.x_proj.weight", "mixer.dt_proj.weight", "mixer.out_proj.weight"},
    "lstm": {"weight_ih_l0", "weight_hh_l0"},
    "mlp": {"c_fc.weight", "c_proj.weight"},
    "linear_attn": {"attn.c_attn.weight", "attn.c_proj.weight", "mlp.1.c_fc.weight", "mlp.1.c_proj.weight"},
}


@pytest.mark.parametrize("model_name", list(MUON))
def test_muon_takes_the_linear_weights_of_the_blocks_and_adamw_the_rest(model_name):
    model, opt = train.build(settings.run_of("recall", model_name, "quick", dict(optimizer="muon", n_layer=2)),
                             torch.device("cpu"))
    adamw, muon = opt.opts
    names = {id(p): n for n, p in model.named_parameters()}
    in_muon = {names[id(p)] for g in muon.param_groups for p in g["params"]}
    prefix = "layers." if model_name == "lstm" else "blocks."
    assert in_muon == {f"{prefix}{i}.{n}" for i in range(2) for n in MUON[model_name]}
    assert not any(n.endswith(("A_log", "D")) for n in in_muon)
    in_adamw = {names[id(p)]: g["weight_decay"] for g in adamw.param_groups for p in g["params"]}
    assert {"wte.weight"} <= set(in_adamw) and set(in_adamw).isdisjoint(in_muon)
    assert len(in_muon) + len(in_adamw) == len(names)
    if model_name == "mamba":  # in AdamW, without decay
        assert {n: in_adamw[n] for n in in_adamw if n.endswith(("A_log", ".D"))} == \
            {f"blocks.{i}.mixer.{k}": 0.0 for i in range(2) for k in ("A_log", "D")}


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
    assert run_main(TINY + ["--max_iters", "12", "--eval_interval", "12", "--ckpt_schedule", "log",
                            "--out_dir", str(tmp_path)]) == 0
    assert sorted(p for p in os.listdir(tmp_path) if p.startswith("ckpt_")) == \
        [f"ckpt_{i:07d}.pt" for i in (1, 2, 3, 6, 10)]
    assert run_main(["--task", "bijection", "--eval_only", "--out_dir", str(tmp_path), "--eval_samples", "30"]) == 0
    r = json.load(open(tmp_path / "eval.json"))
    assert r["metrics"]["default"]["n_sequences"] == 30 and r["iters"] == 12


def test_eval_only_on_weights_that_are_not_finite_exits_1_without_an_eval_json(tmp_path, capsys):
    assert run_main(TINY + ["--max_iters", "2", "--eval_interval", "2", "--out_dir", str(tmp_path)]) == 0
    state = torch.load(tmp_path / "ckpt.pt", weights_only=True)
    state["model"]["wte.weight"][0, 0] = float("nan")
    torch.save(state, tmp_path / "ckpt.pt")
    capsys.readouterr()
    assert run_main(["--task", "bijection", "--eval_only", "--out_dir", str(tmp_path)]) == 1
    err = capsys.readouterr().err.strip()
    assert err == f"train.py: error: {tmp_path}: its weights are not finite (step 2)", err
    assert run_main(["--task", "bijection", "--resume", "--max_iters", "4", "--out_dir", str(tmp_path)]) == 1
    assert capsys.readouterr().err.strip() == err  # not trained on, and not called a good checkpoint
    assert not (tmp_path / "eval.json").exists()


def test_eval_only_beyond_the_trained_context_is_a_clear_error(tmp_path, capsys):
    argv = ["--task", "hmm", "--K", "3", "--n_layer", "1", "--n_head", "2", "--d_model", "16", "--max_iters", "2",
            "--pos", "learned", "--n_pos", "0", "--eval_interval", "2", "--eval_K", "4", "--eval_samples", "10",
            "--eval_samples_during", "10", "--out_dir", str(tmp_path)]
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
    assert run_main(argv + ["--stop_at", "accuracy>=1", "--out_dir", str(tmp_path / "b")]) == 0  # never met
    a, b = (json.load(open(tmp_path / d / "results.json")) for d in "ab")
    assert a["iters"] == 4 and [h["iter"] for h in a["history"]] == [4]
    assert a["stop"] == dict(why="reached kl<=100", step=4, target="kl<=100", final_meets_target=True)
    assert b["iters"] == 12 and [h["iter"] for h in b["history"]] == [4, 8, 12]
    assert b["stop"]["why"] == "its schedule's end" and b["stop"]["final_meets_target"] is False


@pytest.mark.parametrize("spec", ["accuracy>=2", "kl<=-1", "mae_token<=-0.5", "accuracy<=-1"])
def test_a_target_no_run_can_meet_is_refused_before_training(tmp_path, spec, capsys):
    assert run_main(TINY + ["--stop_at", spec, "--out_dir", str(tmp_path)]) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and "so no run can meet it" in err and not os.listdir(tmp_path), err


def test_a_stop_on_the_checks_that_the_final_evaluation_misses_says_so(tmp_path, capsys, monkeypatch):
    """The checks' sequences are not the final evaluation's: a run stopped on them that misses its target on the
    final sequences says so in its last line and in results.json (a check made to read 100% stands for the luck of
    a small one)."""
    real = evaluation.evaluate
    lucky = lambda model, task, n, *a, **kw: real(model, task, n, *a, **kw) | (
        dict(accuracy=1.0, accuracy_se=0.0) if kw.get("flag") == "--eval_samples_during" else {})
    monkeypatch.setattr(evaluation, "evaluate", lucky)
    argv = ["--preset", "tiny", "--max_iters", "8", "--eval_interval", "2", "--out_dir", str(tmp_path)]
    assert run_main(argv + ["--stop_at", "accuracy>=0.2"]) == 0
    r = json.load(open(tmp_path / "results.json"))
    last = capsys.readouterr().out.strip().splitlines()[-1]
    final = r["metrics"]["default"]["accuracy"]
    assert r["iters"] == 2 and final < 0.2  # tiny's recall after 2 steps: at chance
    assert r["stop"] == dict(why="reached accuracy>=0.2", step=2, target="accuracy>=0.2", final_meets_target=False)
    assert f"reached accuracy>=0.2 on the checks at step 2, but the final evaluation misses it: accuracy " \
           f"{final:.4f}" in last, last


def test_checks_during_training_draw_sequences_of_their_own_and_stop_the_run(tmp_path, monkeypatch, capsys):
    calls, real = [], evaluation.evaluate

    def spy(model, task, n_samples, seed, *a, **kw):
        r = real(model, task, n_samples, seed, *a, **kw)
        calls.append((n_samples, seed, task.sample(n_samples, torch.Generator().manual_seed(seed)).x))
        if n_samples == 10:  # a check during training: below the rule, then at it
            r["accuracy"] = [0.5, 0.9995][sum(c[0] == 10 for c in calls) - 1]
            r["accuracy_se"] = 0.0002  # met by two standard errors: 0.9995 - 0.0004 >= 0.999
        return r
    monkeypatch.setattr(evaluation, "evaluate", spy)
    argv = ["--task", "recall", "--n_pairs", "4", "--n_queries", "2", "--key_vocab", "8", "--value_vocab", "8",
            "--filler", "2", "--n_layer", "1", "--d_model", "16", "--n_head", "2", "--batch_size", "8",
            "--max_iters", "12", "--eval_interval", "4", "--log_interval", "4", "--eval_samples", "20",
            "--eval_samples_during", "10", "--out_dir", str(tmp_path)]  # the preset's --stop_at accuracy>=0.999
    assert run_main(argv) == 0
    r = json.load(open(tmp_path / "results.json"))
    assert r["iters"] == 8 and [h["accuracy"] for h in r["history"]] == [0.5, 0.9995]
    out = capsys.readouterr().out
    assert "reached accuracy>=0.999 at step 8" in out and "/12 | loss" in out
    assert all(line.endswith(", or at accuracy>=0.999 or a plateau") for line in out.splitlines() if "| eta " in line)
    (n1, s1, x1), (n2, s2, x2), (n3, s3, x3) = calls  # two checks, then the final evaluation once
    assert (n1, n2, n3) == (10, 10, 20) and s1 == s2 == 424243 and s3 == r["config"]["train"]["eval_seed"] == 424242
    assert r["metrics"]["default"]["accuracy"] < 0.999  # the final figure is the final evaluation's own
    assert not any(torch.equal(a, b) for a in x1 for b in x3)  # no check sequence is one of the final evaluation's
    assert settings.entries("recall", "transformer", "quick")[0]["stop_at"] == "accuracy>=0.999"
    assert settings.entries("recall", "transformer", "cpu_paper_task")[0]["stop_at"] == "accuracy>=0.99"
    assert settings.entries("recall", "mamba", "quick")[0]["stop_at"] == "accuracy>=0.999"  # the task's, not Mamba's


def test_a_plateau_ends_a_run_and_a_target_is_met_by_two_standard_errors():
    """--patience N: N evaluations in a row whose KL is not 1% below the best before them end the run; a resumed run
    counts the evaluations it had. A target counts as met where it holds by two standard errors of the check."""
    rule = evaluation.StopRule(dict(stop_at="", patience=2), tasks.make_task("bijection"))
    assert [rule(dict(kl=k)) for k in (1.0, 0.5, 0.496, 0.4)] == [None, None, None, None]  # 0.496: not 1% better
    assert rule(dict(kl=0.399)) is None and rule(dict(kl=0.398)).startswith("plateau: KL not 1% below 0.4 in 2")
    resumed = evaluation.StopRule(dict(stop_at="", patience=2), tasks.make_task("bijection"),
                             [dict(kl=0.4), dict(kl=0.399)])
    assert resumed(dict(kl=0.398)) is not None and resumed.what == "a plateau"
    target = evaluation.StopRule(dict(stop_at="mae_curve<=0.01", patience=0), tasks.make_task("bijection"))
    assert [target(dict(kl=1.0, mae_curve=0.5)) for _ in range(9)] == [None] * 9
    assert target(dict(kl=1.0, mae_curve=0.01)) == "reached mae_curve<=0.01"
    assert target(dict(kl=1.0, mae_curve=0.009, mae_curve_se=0.001)) is None  # 0.009 + 2 x 0.001 > 0.01
    assert target(dict(kl=1.0, mae_curve=0.007, mae_curve_se=0.001)) == "reached mae_curve<=0.01"
    acc = evaluation.StopRule(dict(stop_at="accuracy>=0.999", patience=0), tasks.make_task("recall"))
    assert acc(dict(kl=1.0, accuracy=0.9995, accuracy_se=0.0004)) is None  # 99.95% - 2 x 0.04% < 99.9%
    assert acc(dict(kl=1.0, accuracy=1.0, accuracy_se=0.0)) == "reached accuracy>=0.999"


@pytest.mark.parametrize("preset", ["quick", "tiny"])
def test_one_stop_rule_a_task_the_same_for_every_model(preset):
    """The quick table compares like with like: a task's cells share its target, plateau rule, cap and checks;
    a model's entry changes how it trains, never when it stops (presets.STOP_RULE)."""
    for task, entry in presets.PRESETS[preset].items():
        assert entry["train"].get("patience") == 4, task
        assert entry["train"].get("stop_at") or task == "any task", task
        for model, opts in entry.items():
            if isinstance(opts, dict) and "train" in opts and model not in ("train", "task"):
                assert not set(opts["train"]) & set(presets.STOP_RULE), (task, model, opts["train"])
        rules = {tuple(settings.entries(task if task != "any task" else "hop", m, preset)[0][k]
                       for k in presets.STOP_RULE) for m in presets.MODELS}
        assert len(rules) == 1, (task, rules)


@pytest.mark.parametrize("argv, expect", [
    (["--task", "nope"],
     "--task unknown task 'nope'; valid tasks: bijection, hmm, regression, recall, hop, or PATH.py:Class"),
    (["--model", "rnn"], "--model rnn: not a model; give one of transformer, mamba, lstm, mlp, linear_attn, "
                         "PATH.py:Class or module:Class"),
    (["--preset", "huge"], "invalid choice: 'huge'"),
    (["--lrr", "1"], "did you mean --lr"),
    (["--max_iter", "5"], "did you mean --max_iters"),
    (["--task", "bijection", "--K", "5"], "unrecognized arguments: --K"),
    (["--task", "bijection", "--V", "1"], "V must be an int >= 2"),
    (["--task", "bijection", "--L", "30"], "L must be <= V=20"),
    (["--task", "hmm", "--K", "0"], "K must be an int >= 1"),
    (["--task", "recall", "--n_pairs", "100", "--key_vocab", "50"], "needs key_vocab and value_vocab >= n_pairs"),
    (["--task", "hmm", "--n_pos", "0", "--block_size", "80"], "exceed the model's context block_size=80"),
    (["--task", "bijection", "--eval_K", "30"], "--eval_K needs a task with a K option"),
    (["--task", "bijection", "--d_model", "30", "--n_head", "4"], "must split into n_head=4 heads"),
    (["--task", "bijection", "--pos", "sinusoidal"], "pos must be one of"),
    (["--task", "bijection", "--with_replacement", "maybe"], "expected true or false"),
    (["--task", "bijection", "--stop_at", "mae<=0.1"], "expected METRIC<=X or METRIC>=X"),
    (["--task", "regression", "--stop_at", "accuracy>=0.9"], "regression has no accuracy"),
    (["--task", "bijection", "--batch_size", "0"], "--batch_size must be >= 1, got 0"),
    (["--eval_seed_during", "424242"], "--eval_seed_during must be -1 (--eval_seed + 1) or a seed other than"),
    (["--eval_seed", "7", "--eval_seed_during", "-2"], "--eval_seed_during must be -1"),
    (["--task", "bijection", "--data_chunk", "-1"], "--data_chunk must be >= 0"),
    (["--task", "bijection", "--data_device", "gpu"], "invalid choice: 'gpu' (choose from 'auto', 'cpu', 'device')"),
    (["--task", "bijection", "--optimizer", "sgd"], "invalid choice: 'sgd' (choose from 'adamw', 'muon')"),
    (["--task", "hmm", "--n_pos", "-1"], "n_pos must be >= 0, got -1"),
    (["--task", "hmm", "--window", "-16"], "window must be >= 0, got -16"),
    (["--lr", "-1e-3"], "--lr must be in (0, 1e30]"),
    (["--lr", "nan"], "--lr must be a finite number, got nan"),
    (["--lr", "0"], "--lr must be in (0, 1e30]"),
    (["--beta1", "1.5"], "--beta1 must be in [0, 1), got 1.5"),
    (["--beta2", "-0.1"], "--beta2 must be in [0, 1)"),
    (["--min_lr_ratio", "-2", "--warmup_iters", "0"], "--min_lr_ratio must be in [0, 1], got -2.0"),
    (["--weight_decay", "-1"], "--weight_decay must be >= 0"),
    (["--warmup_iters", "-5"], "--warmup_iters must be >= 0"),
    (["--grad_clip", "-1"], "--grad_clip must be >= 0"),
    (["--lr_decay_iters", "-1"], "--lr_decay_iters must be >= 0"),
    (["--device", "nonsense"], "--device 'nonsense': expected auto, cpu, cuda, cuda:N or mps"),
    (["--rule", "delta"], "--rule is an option of --model linear_attn only"),
    (["--resume", "--overwrite"], "--overwrite starts a new run"),
    (["--task", "recall", "--curriculum", "pairs=2"],
     "expected NAME=START with NAME an integer option of recall: n_pairs"),
    (["--task", "recall", "--curriculum", "n_pairs=0"], "START must be in [1, 8] (recall's n_pairs)"),
    (["--task", "recall", "--curriculum", "n_pairs=4"],
     "refuses its first stage: recall: n_queries=8 must be <= n_pairs=4"),
    (["--task", "hmm", "--curriculum", "n_obs=2"], "n_obs changes the model's inputs or outputs"),
    (["--task", "recall", "--curriculum", "n_pairs=6", "--n_queries", "3", "--curriculum_iters", "-1"],
     "--curriculum_iters must be >= 0"),
])
def test_bad_input_is_a_one_line_error(capsys, argv, expect):
    assert run_main(argv + ["--max_iters", "0", "--out_dir", "/nonexistent/never"]) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and expect in err, err


def test_help_opens_with_train_pys_own_description_and_the_runs_values(capsys):
    assert run_main(["--help"]) == 0
    text = " ".join(capsys.readouterr().out.split())  # as one line: argparse wraps them
    first = " ".join(train.__doc__.strip().split("\n\n")[0].split())
    assert text.startswith("usage: train.py") and text.split(" options: ")[0].endswith(first)
    assert "Settings: the training defaults" not in text  # presets.py's own docstring
    assert "training steps (default 1500)" in text and "(default out/recall_transformer)" in text  # recall, quick
    assert "(default )" not in text and "N stored key-value pairs (default 8)" in text


@pytest.mark.parametrize("preset", list(presets.PRESETS))
def test_every_flag_shows_the_value_the_run_takes(preset):
    shown = lambda v: "none" if v in ("", []) else str(v)
    for task in [t for t in presets.PRESETS[preset] if t != "any task"]:  # the authors': bijection only
        for model in presets.MODELS:
            _, _, parser = settings.parse_args(["--task", task, "--model", model, "--preset", preset])
            helps = {a.dest: re.search(r"\(default (.*)\)$", a.help).group(1) for a in parser._actions
                     if a.dest not in ("help", "task", "model", "preset", "preset_model", "dry_run")}
            run = settings.run_of(task, model, preset, {})
            t = run.tasks["default"]  # and the config it makes for the model
            took = {k: getattr(t, k) for k in helps if hasattr(t, k)} | run.model_config | run.train
            took["lr_decay_iters"] = 0 if took["lr_decay_iters"] == took["max_iters"] else took["lr_decay_iters"]
            if helps["curriculum_iters"] == "0":  # 0 = half of --max_iters, fixed when the run starts
                assert took["curriculum_iters"] == took["max_iters"] // 2
                took["curriculum_iters"] = 0
            assert helps == {k: shown(took[k]) for k in helps}, (task, model)
    if "recall" not in presets.PRESETS[preset]:
        return
    _, _, parser = settings.parse_args(["--preset", preset])  # recall: the preset's 1,500 steps, not 2,000
    steps = next(a.help for a in parser._actions if a.dest == "max_iters")
    took = settings.run_of("recall", "transformer", preset, {}).train["max_iters"]
    assert steps.endswith(f"(default {took})")


def test_schedule_warms_up_decays_by_cosine_and_stays_at_the_minimum():
    t = dict(lr=1e-3, min_lr_ratio=0.1, warmup_iters=10, max_iters=100, lr_decay_iters=110)
    lrs = [optim.get_lr(i, t) for i in range(130)]
    assert lrs[0] == pytest.approx(1e-3 / 11) and lrs[9] == pytest.approx(1e-3 * 10 / 11)  # linear warmup
    assert all(a < b for a, b in zip(lrs[:10], lrs[1:11])) and lrs[10] == pytest.approx(1e-3)  # the peak
    assert all(a > b for a, b in zip(lrs[10:110], lrs[11:111]))  # decays...
    assert lrs[60] == pytest.approx(1e-4 + 0.9e-3 * 0.5)  # ...by a cosine: halfway at the middle
    assert lrs[110:] == pytest.approx([1e-4] * 20)  # then stays at min_lr_ratio * lr
    run = settings.run_of("recall", "transformer", "tiny", dict(max_iters=100, lr_decay_iters=0))
    assert run.train["lr_decay_iters"] == 100  # 0 = decay over max_iters, fixed as the run is resolved


@pytest.mark.parametrize("flag", [["--task", "hmm"], ["--model", "lstm"], ["--preset", "paper"]])
def test_resume_and_eval_only_refuse_another_task_model_or_preset(tmp_path, capsys, flag):
    assert run_main(TINY + ["--max_iters", "2", "--eval_interval", "2", "--out_dir", str(tmp_path)]) == 0
    ckpt = (tmp_path / "ckpt.pt").read_bytes()
    capsys.readouterr()
    for mode in ("--resume", "--eval_only"):
        assert run_main(["--task", "bijection", mode, "--out_dir", str(tmp_path)] + flag) == 2
        err = capsys.readouterr().err.strip()
        assert len(err.splitlines()) == 1 and f"{flag[0]} {flag[1]} differs from the checkpoint's" in err, err
    assert (tmp_path / "ckpt.pt").read_bytes() == ckpt


def test_resume_keeps_the_schedule_and_lr_decay_iters_extends_a_run(tmp_path):
    a, b = tmp_path / "a", tmp_path / "b"
    common = TINY + ["--eval_interval", "4", "--warmup_iters", "2"]
    assert run_main(common + ["--max_iters", "12", "--out_dir", str(a)]) == 0
    assert run_main(common + ["--max_iters", "8", "--lr_decay_iters", "12", "--out_dir", str(b)]) == 0
    assert run_main(["--task", "bijection", "--resume", "--max_iters", "12", "--out_dir", str(b)]) == 0
    sa, sb = (torch.load(d / "ckpt.pt", weights_only=True) for d in (a, b))
    assert all(torch.equal(sa["model"][k], sb["model"][k]) for k in sa["model"])
    lrs = lambda s: [g["lr"] for o in s["optimizer"] for g in o["param_groups"]]
    assert lrs(sb) == lrs(sa)


def test_eval_only_at_any_length_for_a_model_without_a_position_table(tmp_path):
    argv = ["--task", "hmm", "--model", "lstm", "--pos", "none", "--K", "3", "--n_layer", "1", "--d_model", "16",
            "--max_iters", "2", "--eval_interval", "2", "--eval_samples", "10", "--eval_samples_during", "10",
            "--out_dir", str(tmp_path)]
    assert run_main(argv) == 0
    assert run_main(["--task", "hmm", "--eval_only", "--out_dir", str(tmp_path), "--eval_K", "100"]) == 0
    assert set(json.load(open(tmp_path / "eval.json"))["metrics"]) == {"default", "K100"}


HMM3 = ["--task", "hmm", "--K", "3", "--n_states", "3", "--n_obs", "3"]


@pytest.mark.parametrize("model, opts", [
    ("transformer", HMM3), ("mamba", HMM3), ("transformer", HMM3 + ["--n_pos", "0"]),
    ("lstm", ["--task", "regression", "--K", "4", "--d", "2", "--pos", "none", "--match_params", "-1"])])
def test_eval_only_at_a_longer_K_rebuilds_the_saved_model(tmp_path, capsys, model, opts):
    """Shared rows from n_pos on handle any length (the quick hmm presets, trained up to K=50); a learned table
    without them is refused in one line; a matched width is the checkpoint's, not matched again against the
    longer context (which changes the count of the transformer it matches)."""
    argv = ["--model", model, "--d_model", "16", "--n_layer", "1", "--max_iters", "2", "--eval_interval", "2",
            "--eval_samples", "10", "--eval_samples_during", "10", "--out_dir", str(tmp_path)] + opts
    assert run_main(argv) == 0
    fits = "--n_pos" not in opts
    code = run_main(["--task", opts[1], "--eval_only", "--out_dir", str(tmp_path), "--eval_K", "60"])
    if fits:
        saved = torch.load(tmp_path / "ckpt.pt", weights_only=True)["model_config"]
        r = json.load(open(tmp_path / "eval.json"))
        assert set(r["metrics"]) == {"default", "K60"} and r["model_config"]["d_model"] == saved["d_model"]
    else:
        assert "sequences of length 141 exceed the model's context block_size=121" in capsys.readouterr().err
    assert code == (0 if fits else 2)


def test_train_all_queries_trains_on_every_key_and_evaluates_the_task(tmp_path):
    argv = ["--task", "recall", "--n_pairs", "6", "--n_queries", "2", "--key_vocab", "8", "--value_vocab", "8",
            "--filler", "2", "--n_layer", "1", "--n_head", "2", "--d_model", "16", "--pos", "learned",
            "--batch_size", "8", "--max_iters", "2", "--log_interval", "1", "--eval_samples", "20",
            "--eval_samples_during", "20", "--train_all_queries", "--out_dir", str(tmp_path)]
    run = settings.run_of("recall", "transformer", "quick", settings.parse_args(argv)[1])
    task, mc = run.tasks["default"], run.model_config
    every = task.all_queries()
    assert mc["block_size"] == every.seq_len > task.seq_len  # the learned table covers the longer training sequences
    data = batches.Batches(run, torch.device("cpu"), 0, 1)
    batch, stage = data.get(0)
    assert stage == every and batch.mask.sum(1).eq(6).all()
    assert run_main(argv) == 0
    r = json.loads((tmp_path / "results.json").read_text())
    assert r["task_options"]["n_queries"] == 2 and r["config"]["train"]["train_all_queries"]
    with pytest.raises(ValueError, match="--train_all_queries is an option of --task recall"):
        settings.run_of("hmm", "transformer", "quick", dict(train_all_queries=True))


def test_train_all_queries_curriculum_may_start_below_the_evaluations_queries():
    # every stage queries all its pairs, so a store of 2 is a valid first stage though the task asks 3 queries
    opts = dict(n_pairs=6, n_queries=3, key_vocab=8, value_vocab=8, filler=2)
    run = settings.run_of("recall", "transformer", "quick", opts | dict(
        curriculum="n_pairs=2", max_iters=10, batch_size=4, train_all_queries=True))
    data = batches.Batches(run, torch.device("cpu"), 0, 1)
    (first, s0), (last, s9) = data.get(0), data.get(9)
    assert (s0.n_pairs, s0.n_queries, s9.n_pairs, s9.n_queries) == (2, 2, 6, 6)
    assert first.mask.sum(1).eq(2).all() and last.mask.sum(1).eq(6).all()
    # the ETA counts the steps left in units of this step's cost, which grows with the sequences
    lengths = [data.stage(it).seq_len for it in range(10)]
    assert data.steps_left(0, 10) == pytest.approx(sum(lengths) / lengths[0]) and data.steps_left(0, 10) > 10
    assert data.steps_left(9, 10) == 1 and data.steps_left(10, 10) == 0
    flat = batches.Batches(settings.run_of("recall", "transformer", "quick", opts | dict(max_iters=10)),
                         torch.device("cpu"), 0, 1)
    assert flat.steps_left(3, 10) == 7
    with pytest.raises(ValueError, match="refuses its first stage"):  # without the option the stage is refused
        settings.run_of("recall", "transformer", "quick", opts | dict(curriculum="n_pairs=2", max_iters=10))


def test_resume_with_more_steps_keeps_the_curriculum_schedule():
    opts = dict(curriculum="n_pairs=3", n_queries=2, max_iters=20)
    run = settings.run_of("recall", "transformer", "quick", opts)
    assert run.train["curriculum_iters"] == 10  # half of --max_iters, fixed at the start
    task, before = run.tasks["default"], run.curriculum
    after = settings.Curriculum("recall", run.task_opts, run.train | dict(max_iters=40), task)  # --resume to 40
    assert [after(it).n_pairs for it in range(20)] == [before(it).n_pairs for it in range(20)]
    assert after(10) == task and before(0).n_pairs == 3


def test_every_curriculum_stage_is_checked_before_training_and_a_presets_is_named(capsys):
    from dataclasses import dataclass

    @dataclass
    class Picky(tasks.Task):  # refuses one stage in the middle
        name = "picky"
        n: int = 6

        def __post_init__(self):
            if self.n == 4:
                raise ValueError("picky: n=4 is not allowed")

    def picky(spec, **opts):
        return Picky(**opts)
    with pytest.raises(ValueError, match=r"--curriculum 'n=2': the task refuses the stage n=4: picky: n=4"):
        with mock.patch.object(settings, "make_task", picky):
            settings.Curriculum("picky", {}, CURRICULUM | dict(curriculum="n=2", curriculum_iters=10, max_iters=20),
                                Picky())
    assert run_main(["--task", "recall", "--preset", "cpu_paper_task", "--n_pairs", "4", "--n_queries", "2"]) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and "--curriculum is the cpu_paper_task preset's" in err, err
    # the preset's Mamba holds its first stage: without a curriculum the hold is refused, and named as the preset's
    assert run_main(["--task", "recall", "--model", "mamba", "--preset", "cpu_paper_task", "--curriculum="]) == 2
    err = capsys.readouterr().err.strip()
    assert "--curriculum_hold is the cpu_paper_task preset's: pass --curriculum_hold 0" in err, err



@pytest.mark.parametrize("S, O", [(5, 5), (8, 8), (3, 3)])
def test_the_hmm_presets_give_every_header_token_its_own_row_at_any_size(S, O):
    """n_pos follows --n_states and --n_obs: header_len own rows, then a shared one (54 at the quick cells'
    5 x 5); the window keeps exactly the header and the last 16 positions in view of the last query."""
    from transformer import attn_bias
    for model in ("transformer", "mamba"):
        run = settings.run_of("hmm", model, "quick", dict(n_states=S, n_obs=O, n_layer=1, d_model=16))
        (net, _), task, mc = train.build(run, torch.device("cpu")), run.tasks["default"], run.model_config
        assert task.header_len == 3 + S * S + S * O and mc["n_pos"] == task.header_len + 1
        assert net.wpe.num_embeddings == task.header_len + 1 and ((S, O) != (5, 5) or mc["n_pos"] == 54)
        if model == "transformer":
            seen = attn_bias(net.config, task.seq_len, "cpu")[0, -1].isfinite()
            assert seen.sum() == task.header_len + 16 and seen[:task.header_len].all()


@pytest.mark.parametrize("model", ["transformer", "mlp", "lstm"])
def test_evaluation_splits_only_the_forward_pass_and_every_figure_stays(model):
    # the held-out sequences are drawn 250 at a time whatever the split: the metrics are the same, bit for bit
    run = settings.run_of("hmm", model, "quick", dict(K=4, n_states=3, n_obs=3, n_layer=1, d_model=32, n_head=2))
    torch.manual_seed(0)
    (net, _), task = train.build(run, torch.device("cpu")), run.tasks["default"]
    sizes, forward = [], net.forward
    net.forward = lambda x: sizes.append(len(x)) or forward(x)
    ev = lambda per_pass: evaluation.evaluate(net, task, 300, 7, torch.device("cpu"),
                                              torch.autocast("cpu", enabled=False), per_pass)
    whole = ev(250)
    assert sizes == [250, 50]
    sizes.clear()
    assert ev(64) == whole
    assert sizes == [63, 63, 62, 62, 50] and max(sizes) <= 64  # parts of near-equal size, none tiny


def test_eval_batch_size_changes_no_figure_of_a_run(tmp_path):
    argv = TINY + ["--max_iters", "4", "--eval_interval", "2"]
    # the same sequences; with several threads a matmul's blocking follows its size, so equal to rounding
    assert run_main(argv + ["--out_dir", str(tmp_path / "a")]) == 0  # auto on a CPU: 250
    assert run_main(argv + ["--out_dir", str(tmp_path / "b"), "--eval_batch_size", "7"]) == 0
    a, b = (json.load(open(tmp_path / d / "results.json")) for d in "ab")
    untimed = lambda r: [{k: v for k, v in h.items() if k != "time"} for h in r["history"]]
    assert a["config"]["train"]["eval_batch_size"] == 0 and len(untimed(a)) == 2
    for x, y in ((a["metrics"], b["metrics"]), (untimed(a), untimed(b))):
        assert close(x, y), (x, y)


def close(x, y, rel=1e-9):
    """x == y, floats to 1e-9 relative (a standard error, a spread that magnifies its terms' rounding, to 1e-6),
    through dicts and lists."""
    if isinstance(x, dict):
        return x.keys() == y.keys() and all(close(x[k], y[k], 1e-6 if k.endswith("_se") else rel) for k in x)
    if isinstance(x, list):
        return len(x) == len(y) and all(close(u, v, rel) for u, v in zip(x, y))
    return x == pytest.approx(y, rel=rel, abs=1e-12) if isinstance(x, float) else x == y




def test_the_authors_preset_builds_their_recipe_and_model():
    """--preset authors: every setting of jlens train_dense_checkpoints.py and its SepVocabTinyGPT."""
    run = settings.run_of("bijection", "transformer", "authors", {})
    t = run.train
    assert (t["optimizer"], t["lr"], t["beta1"], t["beta2"], t["weight_decay"], t["weight_decay_on"]) == \
        ("adamw", 3e-4, 0.9, 0.999, 0.1, "all")
    assert (t["warmup_iters"], t["max_iters"], t["lr_decay_iters"], t["min_lr_ratio"], t["lr_schedule"]) == \
        (2000, 50_000, 50_000, 0.0, "authors")
    assert (t["batch_size"], t["seed"], t["grad_clip"], t["dtype"], t["ckpt_schedule"]) == (
        256, 42, 1.0, "float32", "dense")
    torch.manual_seed(t["seed"])
    (model, opt), task = train.build(run, torch.device("cpu")), run.tasks["default"]
    assert (task.V, task.L, task.vocab_size, task.seq_len) == (20, 19, 40, 37)
    assert model.num_params() == 2_677_440  # theirs, with a position table of 2L = 38 rows
    assert model.wpe.num_embeddings == 38 and isinstance(model.ln_f, torch.nn.RMSNorm)
    names = {n for n, _ in model.named_parameters()}
    assert {"blocks.0.mlp.c_fc.bias", "blocks.0.mlp.c_proj.bias"} <= names  # the MLP's biases, none in attention
    assert not any(n.startswith("blocks.0.attn") and n.endswith("bias") for n in names) and model.head is None
    assert 0.95 < model.wte.weight.std().item() < 1.05  # PyTorch's own init: N(0, 1) tables, U(+-1/sqrt(fan_in))
    assert model.blocks[0].mlp.c_fc.weight.abs().max().item() <= 192 ** -0.5
    # every parameter decayed by AdamW with their betas; the tied head is the embedding, over all 40 tokens
    groups = [g for g in opt.param_groups if g["params"]]
    assert sum(p.numel() for g in groups for p in g["params"]) == model.num_params()
    assert all(g["weight_decay"] == 0.1 and g["betas"] == (0.9, 0.999) for g in groups)
    batch = task.sample(4, torch.Generator().manual_seed(0))
    out = model(batch.x)
    assert out.shape == (4, 37, 40)
    assert torch.allclose(out, model(batch.x, return_internals=True)[1]["final"] @ model.wte.weight.T, atol=1e-3)
    m = batch.mask
    want = F.cross_entropy(out[m], batch.y[m] + 20)  # the 40-way cross-entropy, at the key positions
    assert torch.allclose(task.loss(out, batch), want)
    # their rate at every step: step s = it + 1, lr s / 2000 in the warm-up, then the cosine to 0 at 50,000
    lr_at = lambda s: 3e-4 * s / 2000 if s < 2000 else 3e-4 * 0.5 * (1 + math.cos(math.pi * (s - 2000) / 48_000))
    for it in (0, 1, 1998, 1999, 2000, 2500, 25_000, 49_999):
        assert optim.get_lr(it, t) == pytest.approx(lr_at(it + 1), rel=1e-12, abs=1e-15)
    snapshots = runtime.Proc(torch.device("cpu"), 0, 1, t).ckpts.snapshots
    assert sorted(snapshots)[:12] == [100, 200, 300, 400, 500, 600, 700, 800, 900, 1000, 1500, 2000]
    assert {5000, 6000, 10_000, 15_000, 50_000} <= snapshots and len(snapshots) == 31


def test_muon_newton_schulz_in_float32_where_bf16_is_not_native():
    """optim.Muon: with ns_dtype bfloat16 the update is torch.optim.Muon's to the bit (it is its step); in float32,
    the same iteration, close to it in float64 (not bf16's rounding)."""
    torch.manual_seed(0)
    ws = [torch.nn.Parameter(torch.randn(12, 7)), torch.nn.Parameter(torch.randn(5, 9))]
    grads = [torch.randn_like(w) for w in ws]

    def after(cls, dtype=None, steps=3):
        params = [torch.nn.Parameter(w.detach().clone()) for w in ws]
        kw = dict(lr=0.02, weight_decay=0.01, adjust_lr_fn="match_rms_adamw")
        opt = cls(params, **kw) if dtype is None else cls(params, ns_dtype=dtype, **kw)
        for _ in range(steps):
            for p, g in zip(params, grads):
                p.grad = g.clone()
            opt.step()
        return [p.detach() for p in params]
    torch_, ours_bf16 = after(torch.optim.Muon), after(optim.Muon, torch.bfloat16)
    assert all(torch.equal(a, b) for a, b in zip(torch_, ours_bf16))
    ours_fp32 = after(optim.Muon, torch.float32)
    ref = [optim.newton_schulz(g, (3.4445, -4.7750, 2.0315), 5, 1e-7, torch.float64) for g in grads]
    one = after(optim.Muon, torch.float32, steps=1)
    for w, r, o in zip(ws, ref, one):  # one step from zero momentum: w (1 - lr wd) - lr 0.2 sqrt(max) NS(g)
        want = w * (1 - 0.02 * 0.01) - 0.02 * 0.2 * max(w.shape) ** 0.5 * r.float()
        assert torch.allclose(o, want, atol=1e-5)
    assert not all(torch.equal(a, b) for a, b in zip(ours_fp32, torch_))  # bf16's rounding is gone
