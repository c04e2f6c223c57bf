"""The speed paths run on CPU: data-parallel training (gloo), torch.compile, bf16 autocast, bench.py's subcommands."""
import json
import os
import re
import shutil
import subprocess
import sys

import pytest
import torch

import settings
import train

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
TINY = ["--task", "bijection", "--V", "6", "--n_layer", "1", "--n_head", "2", "--d_model", "16", "--max_iters", "6",
        "--batch_size", "8", "--log_interval", "1", "--eval_interval", "6", "--eval_samples", "20",
        "--eval_samples_during", "10", "--device", "cpu", "--lr", "1e-2", "--warmup_iters", "1"]


def run(cmd, out_dir, *extra):
    env = dict(os.environ, OMP_NUM_THREADS="1")
    p = subprocess.run(cmd + TINY + ["--out_dir", str(out_dir), *extra], capture_output=True, text=True, env=env,
                       cwd=ROOT, timeout=600)
    assert p.returncode == 0, p.stdout + p.stderr
    losses = [float(x) for x in re.findall(r"\| loss (\S+) \|", p.stdout)]
    with open(os.path.join(out_dir, "results.json")) as f:
        return losses, json.load(f), p.stdout


@pytest.fixture(scope="module")
def eager(tmp_path_factory):
    """The single-process float32 run of TINY, which the data-parallel, compiled and bf16 runs are held against:
    (losses, results, its folder)."""
    out_dir = tmp_path_factory.mktemp("eager")
    losses, results, _ = run([sys.executable, "train.py"], out_dir)
    return losses, results, out_dir


def test_data_parallel_follows_the_single_process_trajectory(tmp_path, eager):
    torchrun = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node=2", "train.py"]
    ddp_losses, ddp, out = run(torchrun, tmp_path / "ddp")
    one_losses, one, one_dir = eager
    assert len(ddp_losses) == len(one_losses) == 6
    assert out.count("wrote ") == 1  # rank 0 alone logs and writes results.json
    for a, b in zip(ddp_losses, one_losses):
        assert a == pytest.approx(b, abs=2e-4)
    assert ddp["metrics"]["default"]["kl"] == pytest.approx(one["metrics"]["default"]["kl"], abs=2e-3)
    # the history holds the global batch's loss, as the log line does, not rank 0's slice of it
    assert ddp["history"][-1]["loss"] == pytest.approx(ddp_losses[-1], abs=1e-4)
    assert ddp["history"][-1]["loss"] == pytest.approx(one["history"][-1]["loss"], abs=2e-4)
    # the same function at the end (compared on outputs: Adam turns the float noise in the gradient of
    # the attention's key bias, zero in exact arithmetic, into different steps), and it moved from the init
    outs = []
    for state in [torch.load(d / "ckpt.pt", weights_only=True) for d in (tmp_path / "ddp", one_dir)] + [None]:
        torch.manual_seed(ddp["config"]["train"]["seed"])  # the run's initialisation
        c = ddp["config"]
        r = settings.run_of(c["task"], c["model"], c["preset"], c["train"] | c["task_opts"] | c["model_opts"])
        (model, _), task = train.build(r, torch.device("cpu")), r.tasks["default"]
        if state is not None:
            model.load_state_dict(state["model"])
        with torch.no_grad():
            outs.append(model(task.sample(16, torch.Generator().manual_seed(0)).x))
    assert torch.allclose(outs[0], outs[1], atol=1e-4) and not torch.allclose(outs[0], outs[2], atol=1e-2)


def test_data_parallel_needs_a_divisible_batch(tmp_path):
    torchrun = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node=2", "train.py"]
    p = subprocess.run(torchrun + TINY + ["--batch_size", "7", "--out_dir", str(tmp_path)], capture_output=True,
                       text=True, cwd=ROOT, timeout=600, env=dict(os.environ, OMP_NUM_THREADS="1"))
    assert p.returncode != 0 and "must be a multiple of the 2 data-parallel processes" in p.stderr


@pytest.mark.skipif(shutil.which("cc") is None and shutil.which("gcc") is None,
                    reason="torch.compile needs a C compiler on CPU")
def test_compiled_training_matches_eager(tmp_path, eager):
    compiled, _, out = run([sys.executable, "train.py"], tmp_path / "c", "--compile")
    assert "torch.compile failed" not in out
    for a, b in zip(compiled, eager[0]):
        assert a == pytest.approx(b, abs=1e-3)


def test_bf16_autocast_trains_close_to_float32(tmp_path, eager):
    bf16, _, out = run([sys.executable, "train.py"], tmp_path / "b", "--dtype", "bfloat16")
    fp32 = eager[0]
    assert "bf16" in out.splitlines()[0]
    assert bf16 != fp32 and all(abs(a - b) < 0.05 for a, b in zip(bf16, fp32))  # bf16 rounding, not another run


def test_bench_counts_the_flops_of_every_model(tmp_path, capsys):
    import bench
    flags = ["--task", "bijection", "--batch_size", "8", "--reps", "1", "--warmup", "0", "--threads", "1", "--peak_n",
             "128"]
    models, threads, rows = bench.train_args([])[1], torch.get_num_threads(), []
    assert models == ["transformer", "mamba", "lstm", "mlp", "linear_attn"]  # the default rows
    try:  # each row as its process of its own measures it (--one), here in this one
        for model in models:
            assert bench.main(["train", "--one", model, "quick"] + flags) == 0
            rows.append(json.loads(capsys.readouterr().out.strip().splitlines()[-1]))
    finally:
        torch.set_num_threads(threads)  # a row sets its process's threads
    # and one row through its own process, into --json
    assert bench.main(["train", "--models", "mlp", "--sizes", "quick", "--json", str(tmp_path / "b.json")] + flags) == 0
    (mlp,), here = json.load(open(tmp_path / "b.json")), rows[models.index("mlp")]
    assert (mlp["model"], mlp["params"], mlp["gflop_per_step"]) == ("mlp", here["params"], here["gflop_per_step"])
    for r in rows:
        # about 6 flops per parameter per token (forward 2, backward 4): a few parameters cost none (position
        # tables, the MLP's padded prefix weights), attention adds some; a model whose main matmuls went
        # uncounted (the LSTM's fused layers, CPU attention) would land far below
        assert r["gflop_per_step"] * 1e9 >= 0.7 * 6 * r["params"] * r["batch"] * r["seq_len"]
        assert r["tokens_per_s"] > 0 and 0 <= r["data_share"] < 1 and 0 <= r["oracle_share"] < 1
        assert (r["scan_fwd_s"] > 0 and r["scan_bwd_s"] > 0) == (r["model"] == "mamba")  # the scan's share of a step


def test_bench_rejects_unknown_models_and_sizes(capsys):
    import bench
    for argv, msg in ((["--models", "gpt"], "unknown model 'gpt'; valid models: transformer"),
                      (["--sizes", "huge"], "unknown size 'huge'; valid sizes: quick, paper")):
        with pytest.raises(SystemExit) as e:
            bench.main(["train", *argv])
        assert e.value.code == 2 and msg in capsys.readouterr().err


def test_time_to_target_trains_until_the_target_and_reads_finished_runs(tmp_path):
    import reproduce
    out, res = tmp_path / "out", tmp_path / "res"
    tiny = ["--max_iters", "4", "--batch_size", "8", "--n_layer", "1", "--n_head", "2", "--d_model", "16",
            "--eval_samples", "20", "--eval_samples_during", "10", "--device", "cpu"]
    assert reproduce.main(["time_to_target", "--tasks", "bijection", "--eval_interval", "2", "--out", str(out),
                       "--results", str(res), "--", *tiny, "--V", "6"]) == 0
    [row] = json.load(open(res / "time_to_target_fast.json"))
    assert not row["reached"] and row["run_steps"] == 4 and row["eval_interval"] == 2  # 0.01 bits is out of reach
    runs = tmp_path / "runs"  # a finished run whose history meets the target at its second evaluation
    os.makedirs(runs / "bijection_transformer")
    history = [dict(iter=2, time=1.0, mae_curve=0.3, mae_token=0.4), dict(iter=4, time=2.0, mae_curve=0.008,
                                                                          mae_token=0.012)]
    json.dump(dict(task="bijection", model="transformer", history=history, iters=4, wall_time_s=3.0, device="cpu",
                   config=dict(train=dict(eval_interval=2))),
              open(runs / "bijection_transformer" / "results.json", "w"))
    assert reproduce.main(["time_to_target", "--tasks", "bijection", "--from_runs", str(runs),
                           "--results", str(res)]) == 0
    [row] = json.load(open(res / "time_to_target_from_runs.json"))
    assert row["reached"] and row["steps"] == 4 and row["time_s"] == 2.0 and row["value"] == 0.008
    assert row["also"] == "mae_token<=0.01" and row["also_steps"] is None  # per token: 0.012, not yet at the bar
    assert "| mae_token<=0.01: not by step 4 |" in open(res / "time_to_target_from_runs.md").read()


def test_time_to_target_rejects_unknown_tasks_and_missing_runs(tmp_path, capsys):
    import reproduce
    for argv, msg in ((["--tasks", "hop"], "unknown task 'hop'; valid tasks: bijection"),
                      (["--preset", "paper"], "the fast recipe changes the quick preset"),
                      (["--from_runs", str(tmp_path)], "no finished run at")):
        with pytest.raises(SystemExit) as e:
            reproduce.main(["time_to_target", *argv])
        assert e.value.code == 2 and msg in capsys.readouterr().err


@pytest.mark.parametrize("content", ["{not json", json.dumps(dict(history=[], iters=0)), json.dumps([1, 2]),
                                     json.dumps(dict(iters=4))])
def test_time_to_target_from_a_run_without_history_or_a_corrupt_file_is_one_line(tmp_path, capsys, content):
    import reproduce
    os.makedirs(tmp_path / "bijection_transformer")
    (tmp_path / "bijection_transformer" / "results.json").write_text(content)
    with pytest.raises(SystemExit) as e:
        reproduce.main(["time_to_target", "--tasks", "bijection", "--from_runs", str(tmp_path),
                        "--results", str(tmp_path / "res")])
    err = capsys.readouterr().err.strip()
    assert e.value.code == 2 and len(err.splitlines()) == 1 and "not a train.py run to read" in err, err
    assert not (tmp_path / "res" / "time_to_target_from_runs.json").exists()


def time_to_target_of(tmp_path, task, history):
    """time_to_target's row for a finished run of task with this history, read with --from_runs."""
    import reproduce
    os.makedirs(tmp_path / f"{task}_transformer")
    json.dump(dict(task=task, model="transformer", history=history, iters=history[-1]["iter"],
                   wall_time_s=history[-1]["time"] + 1, device="cpu",
                   config=dict(train=dict(eval_interval=100, batch_size=64))),
              open(tmp_path / f"{task}_transformer" / "results.json", "w"))
    assert reproduce.main(["time_to_target", "--tasks", task, "--from_runs", str(tmp_path),
                           "--results", str(tmp_path)]) == 0
    [row] = json.load(open(tmp_path / "time_to_target_from_runs.json"))
    return row


def test_time_to_target_counts_training_sequences_and_bench_points_to_it(tmp_path, capsys):
    import bench
    row = time_to_target_of(tmp_path, "recall", [dict(iter=100, time=9.0, accuracy=0.5),
                                                 dict(iter=300, time=30.0, accuracy=0.9995)])
    assert row["steps"] == 300 and row["sequences"] == 300 * 64 and row["batch_size"] == 64
    assert "| 300 | 19,200 (64 a step) | 0m30s |" in open(tmp_path / "time_to_target_from_runs.md").read()
    # hmm stops per token; its mean curve crossed the same bar before
    row = time_to_target_of(tmp_path, "hmm", [dict(iter=100, time=9.0, mae_curve=0.02, mae_token=0.03),
                                              dict(iter=200, time=18.0, mae_curve=0.01, mae_token=0.02)])
    assert (row["target"], row["steps"], row["also"], row["also_steps"]) == ("mae_token<=0.024", 200,
                                                                            "mae_curve<=0.024", 100)
    with pytest.raises(SystemExit) as e:
        bench.main(["time_to_target"])
    assert e.value.code == 2 and "python reproduce.py time_to_target" in capsys.readouterr().err


def test_bench_names_the_cpu_and_scales_times_by_the_matmul_rate(tmp_path, capsys, monkeypatch):
    import bench
    import hardware
    import runtime
    monkeypatch.setattr(runtime, "cpu_flags", lambda: ("Some CPU", {"avx2", "avx512f", "avx512_bf16"}))
    assert bench.main(["matmul", "--threads", "1", "--n", "64", "--reps", "1", "--ref_gflops", "1e-9",
                       "--json", str(tmp_path / "m.json")]) == 0
    m = json.load(open(tmp_path / "m.json"))
    assert (m["cpu"], m["isa"], m["bf16"], m["threads"]) == ("Some CPU", "AVX-512", "avx512_bf16", 1)
    assert m["matmul_gflops"] > 0 and m["time_factor"] == pytest.approx(1e-9 / m["matmul_gflops"])
    assert f"CPU: Some CPU, AVX-512, avx512_bf16: {m['matmul_gflops']} GFLOP/s fp32 matmul on 1 threads" \
        in capsys.readouterr().out
    monkeypatch.setattr(runtime, "cpu_flags", lambda: ("Other", {"avx2", "amx_tile", "amx_bf16", "avx512f"}))
    assert hardware.machine(1, n=32, reps=1)["isa"] == "AMX"
    monkeypatch.setattr(runtime, "cpu_flags", lambda: ("Old", {"avx2"}))
    assert hardware.machine(1, n=32, reps=1)["bf16"] == "no native bf16"
    assert hardware.scaled_time(60.0, 188.0, 47.0) == 240.0  # a quarter of the rate: four times the wall time


@pytest.mark.parametrize("argv, expect", [
    (["--device", "nonsense"], "--device 'nonsense': expected auto, cpu, cuda, cuda:N or mps"),
    (["--peak_n", "0"], "--peak_n must be >= 1"),
    (["--json", "/proc/version/rows.json"], "--json /proc/version: cannot write there"),
    (["--json", "/tmp"], "is a folder"),
])
def test_bench_bad_input_is_a_one_line_error_before_measuring(capsys, argv, expect):
    import bench
    with pytest.raises(SystemExit) as e:
        bench.main(["train", "--task", "bijection", "--models", "mlp", "--sizes", "quick"] + argv)
    err = capsys.readouterr().err.strip()
    assert e.value.code == 2 and len(err.splitlines()) == 1 and expect in err, err


def bench_run(cmd):
    return subprocess.run([sys.executable, *cmd, "--threads", "1", "--reps", "1"], cwd=ROOT, capture_output=True,
                          text=True, timeout=300, env=dict(os.environ, OMP_NUM_THREADS="1"))


def test_benches_exit_2_when_every_row_failed():
    p = bench_run(["bench.py", "train", "--task", "bijection", "--models", "mlp", "--sizes", "quick",
                   "--batch_size", str(10 ** 12)])  # every row out of memory
    assert p.returncode == 2 and "Traceback" not in p.stderr and "failed" in p.stdout, p.stdout + p.stderr
    assert "every" in p.stderr and len(p.stderr.strip().splitlines()) == 1, p.stderr


@pytest.mark.parametrize("cmd", [["bench.py", "scan", "--L", "8", "--modes", "sequential", "--B", "0"],
                                 ["bench.py", "memory", "--rules", "hebbian", "--T", "8", "--B", "0"]])
def test_benches_refuse_an_empty_batch_before_measuring(cmd):  # these once failed in every row
    p = bench_run(cmd)
    assert p.returncode == 2 and "Traceback" not in p.stderr and "failed" not in p.stdout, p.stdout + p.stderr
    assert "--B must be >= 1, got 0" in p.stderr and len(p.stderr.strip().splitlines()) == 1, p.stderr


def test_time_to_target_writes_under_out_unless_told_and_checks_results_first(tmp_path, monkeypatch, capsys):
    import reproduce
    runs = tmp_path / "runs"
    os.makedirs(runs / "bijection_transformer")
    history = [dict(iter=2, time=1.0, mae_curve=0.3)]
    json.dump(dict(task="bijection", model="transformer", history=history, iters=2, wall_time_s=1.0, device="cpu",
                   config=dict(train=dict(eval_interval=2))),
              open(runs / "bijection_transformer" / "results.json", "w"))
    monkeypatch.chdir(tmp_path)
    assert reproduce.main(["time_to_target", "--tasks", "bijection", "--from_runs", str(runs)]) == 0
    assert (tmp_path / "out" / "time_to_target" / "time_to_target_from_runs.json").exists()
    assert not (tmp_path / "results").exists()
    (tmp_path / "f").write_text("x")
    with pytest.raises(SystemExit) as e:
        reproduce.main(["time_to_target", "--tasks", "bijection", "--results", "f/r"])
    assert e.value.code == 2 and "--results f/r: cannot write there" in capsys.readouterr().err


def test_bench_scan_refuses_zero_reps_before_measuring(capsys):
    import bench
    with pytest.raises(SystemExit) as e:
        bench.main(["scan", "--reps", "0"])
    err = capsys.readouterr().err.strip()
    assert e.value.code == 2 and len(err.splitlines()) == 1 and "--reps must be >= 1" in err, err
