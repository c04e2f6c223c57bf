"""`bench.py gpu`, the prepared check of a GPU or Mac: its dry run on the CPU (the same plan at tiny sizes), the
table and JSON it writes, the exit code of a failed check, and its one line where there is neither."""
from functools import partial
import json

import pytest
import torch

import bench
from cli import exit_code
import hardware

CELLS = {"train": ["mlp"], "compile": ["mlp", "mamba, 5 lengths"], "scan": ["sequential", "chunked"],
         "sync": [f"{t} {m}" for t, m in hardware.SYNC_CELLS], "nccl": ["2 processes"],
         "memory16": [" ".join(c) for c in hardware.BIG_CELLS]}


def test_the_dry_run_runs_every_check_and_writes_the_table(tmp_path, monkeypatch, capsys):
    # dynamo without code generation, and the scan's eager modes: compiling kernels takes a while on a CPU
    monkeypatch.setattr(torch, "compile", partial(torch.compile, backend="eager"))
    monkeypatch.setattr(hardware, "SCAN_MODES", ("sequential", "chunked"))
    path = tmp_path / "gpu.json"
    argv = ["gpu", "--device", "cpu", "--dry_run", "--models", "mlp", "--threads", "1", "--json", str(path)]
    assert exit_code(bench.main, argv) == 0
    out, report = capsys.readouterr().out, json.loads(path.read_text())
    assert report["device"] == "cpu" and report["dry_run"] and report["passed"]
    rows = report["rows"]
    assert {c: [r["cell"] for r in rows if r["check"] == c] for c in CELLS} == CELLS
    skipped = {r["check"] for r in rows if r["status"] == "skip"}
    assert skipped == {"sync", "nccl"} and all(r["status"] == "pass" for r in rows if r["check"] not in skipped)
    assert "needs 2 CUDA GPUs, this machine has 0" in out and "sync detector only" in out
    for r in rows:  # each row printed
        assert f"{r['check']:<9} {r['cell']:<34} {r['status']}" in out
    measured = [r for r in rows if r["tokens_per_s"] is not None]  # the training cells
    assert [r["check"] for r in measured] == ["train", "compile"] + ["memory16"] * len(hardware.BIG_CELLS)
    assert all(r["tokens_per_s"] > 0 and r["peak_mb"] >= 0 and "params" in r["note"] for r in measured)
    assert "largest relative error 0.0e+00 (float64), against the CPU" in out
    assert f"{len(rows)} of {len(rows)} cells passed or skipped, 0 failed" in out


def test_a_failed_check_fails_the_run(tmp_path, monkeypatch, capsys):
    def broken():
        raise RuntimeError("wrong answer\nsecond line")
    monkeypatch.setitem(hardware.GPU_CHECKS, "scan", lambda args, dev: [("ok", dict), ("broken", broken)])
    path = tmp_path / "gpu.json"
    assert exit_code(bench.main, ["gpu", "--device", "cpu", "--dry_run", "--checks", "scan", "--json", str(path)]) == 1
    report = json.loads(path.read_text())
    assert not report["passed"] and [r["status"] for r in report["rows"]] == ["pass", "fail"]
    assert report["rows"][1]["note"] == "RuntimeError: wrong answer"
    assert "1 of 2 cells passed or skipped, 1 failed" in capsys.readouterr().out


@pytest.mark.skipif(torch.cuda.is_available() or torch.backends.mps.is_available(), reason="needs a machine without")
@pytest.mark.parametrize("argv", [[], ["--device", "cpu"]])
def test_without_a_gpu_or_mac_it_says_so_in_one_line(argv, capsys, tmp_path):
    assert exit_code(bench.main, ["gpu", *argv, "--json", str(tmp_path / "gpu.json")]) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and "no CUDA GPU or Apple MPS here; `--device cpu --dry_run`" in err, err
    assert not (tmp_path / "gpu.json").exists()


@pytest.mark.parametrize("argv, expect", [(["--checks", "train,speed"], "unknown check 'speed'; valid checks: train"),
                                          (["--models", "gpt"], "unknown model 'gpt'; valid models: transformer"),
                                          (["--steps", "-1"], "--steps must be >= 0")])
def test_bad_input_is_one_line(argv, expect, capsys):
    assert exit_code(bench.main, ["gpu", "--device", "cpu", "--dry_run", *argv]) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and expect in err, err


def test_the_16_gib_cap_names_the_gpu_by_index(monkeypatch):
    # torch.cuda.set_per_process_memory_fraction refuses torch.device("cuda"), which names no index: the first GPU
    # run of bench.py gpu failed every memory16 cell so
    calls = []

    def fraction(f, device):
        if not isinstance(device, int):
            raise ValueError(f"Expected a torch.device with a specified index or an integer, but got:{device}")
        calls.append((f, device))
    monkeypatch.setattr(torch.cuda, "set_per_process_memory_fraction", fraction)
    monkeypatch.setattr(torch.cuda, "current_device", lambda: 3)
    monkeypatch.setattr(torch.cuda, "get_device_properties", lambda i: type("P", (), dict(total_memory=64 * 2**30)))
    monkeypatch.setattr(torch.cuda, "empty_cache", lambda: None)
    monkeypatch.setattr(hardware, "train_cell", lambda *a, **k: dict(peak_mb=1.0, note="n"))
    row = hardware.capped_cell(None, torch.device("cuda"), "hmm", "paper", "mamba")
    assert calls == [(0.25, 3), (1.0, 3)] and row["note"] == "n, capped at 16 GiB"
    calls.clear()
    hardware.capped_cell(None, torch.device("cuda:1"), "hmm", "paper", "mamba")
    assert calls == [(0.25, 1), (1.0, 1)]


def test_train_times_the_quick_size_unless_asked_and_says_what_it_will_run(monkeypatch, capsys):
    said = []
    monkeypatch.setattr(bench, "machine", lambda threads: said.append(capsys.readouterr().out) or {})
    monkeypatch.setattr(bench, "describe", lambda cpu: "stub")
    monkeypatch.setattr(bench, "in_fresh_process", lambda kind, which, *a: (None, f"not timed: {which}"))
    assert exit_code(bench.main, ["train", "--models", "mlp,lstm"]) == 2  # every row failed: none was timed
    out = capsys.readouterr().out
    assert "to run: 2 rows, mlp, lstm at the quick size, 7 steps each in a process of its own" in said[0]  # first
    assert "not timed: ('mlp', 'quick')" in out and "not timed: ('lstm', 'quick')" in out and "paper" not in out
    assert exit_code(bench.main, ["train", "--models", "mlp", "--sizes", "quick,paper"]) == 2
    assert "to run: 2 rows, mlp at the quick and paper sizes" in said[1]


def test_a_slow_matmul_rate_is_not_rounded_to_zero(monkeypatch, capsys):
    # a contended CPU timed --n 64 at under 0.05 GFLOP/s: rounded to 0.0, it was the divisor of the rule of thumb
    # (ZeroDivisionError, a traceback)
    import hardware
    monkeypatch.setattr(hardware, "matmul_peak", lambda *a: 3.12e7)  # 0.0312 GFLOP/s
    assert hardware.bench_matmul(["--n", "64", "--reps", "1", "--threads", "1"]) == 0
    assert "0.0312 GFLOP/s fp32" in capsys.readouterr().out
