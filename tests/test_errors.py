"""Bad input to every script: one line naming what to change, exit 2 (usage) or 1 (fault), no traceback,
earlier files whole."""
import contextlib
import itertools
import json
import os
import subprocess
import sys
import time

import pytest
import torch

import checkpoints
import commandline
import evaluation
import runtime
import tasks
import train
from cli import exit_code


def test_an_old_empty_lock_is_taken_over(tmp_path, capsys):
    lock = tmp_path / ".lock"
    lock.write_text("")
    os.utime(lock, (1, 1))  # left by a run killed before it wrote its pid
    assert checkpoints.lock_out_dir(str(tmp_path)) == str(lock)
    assert lock.read_text().strip() == str(os.getpid())
    assert "empty lock" in capsys.readouterr().out


def test_a_fresh_empty_lock_still_refuses(tmp_path):
    (tmp_path / ".lock").write_text("")  # its owner may be writing its pid right now
    with pytest.raises(ValueError, match="in use by another run"):
        checkpoints.lock_out_dir(str(tmp_path))


@pytest.mark.parametrize("name", ["WORLD_SIZE", "LOCAL_RANK", "LOCAL_WORLD_SIZE"])
def test_a_torchrun_variable_that_is_not_an_integer_is_named(monkeypatch, name):
    monkeypatch.setenv(name, "abc")
    with pytest.raises(ValueError, match=f"{name}='abc' must be an integer"):
        runtime.env_int(name, 0)


def test_world_size_abc_is_named_by_init_distributed(monkeypatch):
    monkeypatch.setenv("WORLD_SIZE", "abc")
    with pytest.raises(ValueError, match="WORLD_SIZE"):
        runtime.init_distributed({"batch_size": 4}, None)


def test_world_size_zero_is_refused(monkeypatch):
    monkeypatch.setenv("WORLD_SIZE", "0")
    with pytest.raises(ValueError, match="WORLD_SIZE=0"):
        runtime.init_distributed({"batch_size": 4}, None)


def test_a_negative_max_iters_is_named_as_itself(capsys):
    assert exit_code(train.main, ["--max_iters", "-5", "--out_dir", "/nonexistent/never"]) == 2
    err = capsys.readouterr().err
    assert "--max_iters must be >= 0" in err and "lr_decay_iters" not in err, err


@pytest.mark.parametrize("spec", ["accuracy>=1e400", "kl<=-1e999"])
def test_stop_at_refuses_an_infinite_threshold(spec):
    with pytest.raises(ValueError, match="finite"):
        evaluation.parse_stop(spec, None)


# bench.py and hardware.py: refused at parse time, naming the flag (exit 2)

@pytest.mark.parametrize("argv, flag", [
    (["matmul", "--threads", "100000"], "--threads"), (["train", "--threads", "100000"], "--threads"),
    (["scan", "--threads", "100000"], "--threads"), (["gpu", "--threads", "100000"], "--threads"),
    (["matmul", "--n", "10000000"], "--n"), (["scan", "--seed", str(2**64)], "--seed"),
    (["memory", "--seed", "-1"], "--seed"), (["scan", "--B", "0"], "--B"), (["scan", "--L", "64", "0"], "--L"),
    (["memory", "--T", "0"], "--T"), (["memory", "--decay", "nan"], "--decay"),
     (["memory", "--decay", "1.5"], "--decay"),
])
def test_bench_refuses_bad_flags_naming_them(argv, flag, capsys):
    import bench
    assert exit_code(bench.main, argv) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) <= 2 and flag in err[-1] and "Traceback" not in err[-1]  # usage line, then the error


def run_cli(main, prog="x.py"):
    with pytest.raises(SystemExit) as e:
        commandline.cli(main, prog, "nothing was written")
    return e.value.code


def test_a_full_disk_under_bench_is_one_line(tmp_path, monkeypatch, capsys):
    import bench
    import errno
    import hardware

    def full(path, obj):
        raise OSError(errno.ENOSPC, "No space left on device", path)
    monkeypatch.setattr(checkpoints, "write_json", full)
    monkeypatch.setattr(hardware, "machine", lambda *a: dict(matmul_gflops=1.0, cpu="c", isa="i", bf16="", threads=1))
    monkeypatch.setattr(hardware, "matmul_peak", lambda *a: 1e9)
    argv = ["matmul", "--n", "8", "--reps", "1", "--threads", "1", "--json", str(tmp_path / "m.json")]
    assert run_cli(lambda: bench.main(argv), "bench.py") == 1
    err = capsys.readouterr().err.strip().splitlines()
    assert err == [f"bench.py: error: {tmp_path / 'm.json'}: No space left on device; the table above is the run's "
                   f"(nothing else was kept)"]


def test_out_of_memory_is_one_line(capsys):
    def oom():
        raise RuntimeError("[enforce fail at alloc_cpu.cpp:117] DefaultCPUAllocator: can't allocate memory: "
                           "you tried to allocate 40000000000 bytes.")
    assert run_cli(oom, "bench.py") == 1
    assert capsys.readouterr().err.startswith("bench.py: error: out of memory")


def test_another_runtime_error_is_not_swallowed():
    def bug():
        raise RuntimeError("a bug")
    with pytest.raises(RuntimeError):
        commandline.cli(bug, "x.py", "")


# conditioning.py

@pytest.mark.parametrize("argv, words", [
    (["drift", "--variants", "hebbian@nan"], "'hebbian@nan'"), (["drift", "--variants", "delta@inf"], "'delta@inf'"),
    (["drift", "--norm_every", "100", "--steps", "50"], "--norm_every"),
    (["drift", "--steps", "1", "--period", "1"], "--norm_every (10) must be less than --steps (1)"),
    (["drift", "--seed", str(2**64)], "--seed"), (["capacity", "--threads", "100000"], "--threads"),
    (["depth_width", "--seeds", "0", "-1"], "--seeds -1"),
])
def test_conditioning_refuses_bad_flags(tmp_path, argv, words, capsys):
    import conditioning
    assert exit_code(conditioning.main, argv + ["--results", str(tmp_path)]) == 2
    assert words in capsys.readouterr().err.strip().splitlines()[-1]


@pytest.mark.parametrize("text, words", [('{"wall_s": 1}', "lacks the key 'settings'"), ('{"wall', "not valid JSON")])
def test_conditioning_summary_names_a_bad_json(tmp_path, text, words, capsys):
    import conditioning
    (tmp_path / "drift.json").write_text(text)
    assert exit_code(conditioning.main, ["summary", "--results", str(tmp_path)]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and str(tmp_path / "drift.json") in err[0] and words in err[0]


# reproduce.py

def test_time_to_target_on_a_full_disk_is_one_line(monkeypatch, capsys):
    import errno
    import reproduce

    def full(argv):
        raise OSError(errno.ENOSPC, "No space left on device", "out/time_to_target/x.json")
    monkeypatch.setattr(reproduce, "time_to_target", full)
    assert reproduce.main(["time_to_target"]) == 1
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "x.json: No space left on device" in err[0]


def test_a_cell_without_metrics_is_unfinished(tmp_path):
    import reproduce
    (tmp_path / "results.json").write_text('{"config": {}}')
    assert reproduce.load_results(str(tmp_path)) is None
    (tmp_path / "results.json").write_text('[1]')
    assert reproduce.load_results(str(tmp_path)) is None


# geometry.py seeds

def seed_runs(tmp_path, *layers):
    runs = []
    for i, n in enumerate(layers):
        run = tmp_path / f"s{i}"
        run.mkdir()
        (run / "geometry_qk.json").write_text(json.dumps({"figures": {"entropy by layer": [0.5] * n}}))
        runs.append(str(run))
    return runs


def test_seeds_names_a_corrupt_json(tmp_path, capsys):
    import geometry
    runs = seed_runs(tmp_path, 2)
    (tmp_path / "s0" / "geometry_qk.json").write_text("{bad")
    assert exit_code(geometry.main, ["seeds", *runs, "--out", str(tmp_path / "out")]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "s0/geometry_qk.json" in err[0]


def test_seeds_refuses_an_out_that_is_a_file(tmp_path, capsys):
    import geometry
    (tmp_path / "file").write_text("")
    assert exit_code(geometry.main, ["seeds", *seed_runs(tmp_path, 2), "--out", str(tmp_path / "file")]) == 2
    assert "--out" in capsys.readouterr().err


def test_geometry_refuses_a_seed_past_torchs_range(tmp_path, capsys):
    import geometry
    assert exit_code(geometry.main, ["qk", "--ckpt", str(tmp_path), "--seed", str(2**64)]) == 2
    assert "--seed" in capsys.readouterr().err


# -----------------------------------------------------------------------------
# requests the machine cannot hold: refused before they allocate, naming the flag; long ones say how long

SMALL = ["--max_iters", "1", "--eval_samples", "4", "--eval_samples_during", "4", "--d_model", "16", "--n_layer", "1"]


@pytest.fixture(scope="module")
def hmm_run(tmp_path_factory):
    out = str(tmp_path_factory.mktemp("hmm") / "run")
    assert train.main(["--task", "hmm", "--model", "transformer", *SMALL, "--out_dir", out]) == 0
    return out


@pytest.mark.parametrize("argv, flag", [
    (["--task", "bijection", "--batch_size", "3000000"], "--batch_size 3000000"),
    (["--task", "hmm", "--K", "100000000"], "(--K 100000000)"),
    (["--task", "hmm", "--eval_K", "100000000"], "--eval_K 100000000")])
def test_train_refuses_what_memory_cannot_hold_before_allocating(tmp_path, monkeypatch, argv, flag, capsys):
    # before the fix each ran until the kernel ended it (8 GB in 23 s for --batch_size 3000000)
    monkeypatch.setattr(runtime, "machine_memory", lambda device: 16 * 2 ** 30)  # any machine: 16 GiB
    assert exit_code(train.main, ["--model", "transformer", *SMALL, *argv, "--out_dir", str(tmp_path / "r")]) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and flag in err and "GiB of memory" in err, err
    assert not os.path.exists(tmp_path / "r" / "ckpt.pt")


@pytest.mark.parametrize("argv, flag", [(["values", "--n_seq", "100000000"], "--n_seq 100000000"),
                                        (["values", "--K", "1000000"], "(--K 1000000)"),
                                        (["clusters", "--n_perm", "100000000000"], "--n_perm 100000000000")])
def test_geometry_refuses_what_memory_cannot_hold(hmm_run, monkeypatch, argv, flag, capsys):
    import geometry
    monkeypatch.setattr(runtime, "machine_memory", lambda device: 16 * 2 ** 30)
    assert exit_code(geometry.main, [*argv, "--ckpt", hmm_run, "--no_plot"]) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and flag in err and "GiB of memory" in err, err


def test_a_long_evaluation_says_how_long(monkeypatch, capsys):
    # --eval_samples 100000000 keeps one draw's memory (measured flat at 0.4 GB) but ran for hours unannounced
    clock = itertools.count(0, 10)  # every call to time.time() 10 s later: each draw "takes" 10 s
    monkeypatch.setattr(time, "time", lambda: next(clock))
    task = tasks.make_task("bijection", V=4)
    class Flat(torch.nn.Module):  # a uniform prediction: the metrics do not matter here
        def forward(self, x):
            return torch.zeros(*x.shape, task.V)
    model = Flat()
    evaluation.evaluate(model, task, 2000, 0, torch.device("cpu"), contextlib.nullcontext(),
                        flag="--eval_samples_during")
    assert "--eval_samples_during 2000: about" in capsys.readouterr().out


# -----------------------------------------------------------------------------
# unclear lines made clear: the cause and the way out

def test_a_run_set_aside_by_a_killed_overwrite_is_named_with_its_restore(tmp_path, capsys):
    # before: "no checkpoint at .../ckpt.pt (train first ...)", not a word of the old run in .replaced/
    import geometry
    (tmp_path / ".replaced").mkdir()
    (tmp_path / ".replaced" / "ckpt.pt").write_bytes(b"old run")
    for main, argv in [(train.main, ["--task", "hmm", "--resume", "--out_dir", str(tmp_path)]),
                       (train.main, ["--task", "hmm", "--eval_only", "--out_dir", str(tmp_path)]),
                       (geometry.main, ["values", "--ckpt", str(tmp_path)])]:
        assert exit_code(main, argv) == 2
        err = capsys.readouterr().err.strip()
        assert len(err.splitlines()) == 1 and f"`mv {tmp_path}/.replaced/* {tmp_path}/ && rmdir " in err, err


@pytest.mark.parametrize("target, words", [("loop", "a loop of links"), ("elsewhere", "which does not exist")])
def test_an_out_dir_that_is_a_link_to_nowhere_is_named(tmp_path, target, words, capsys):
    # before: "File exists at step 0"
    os.symlink(tmp_path / target, tmp_path / "loop")
    assert exit_code(train.main, ["--task", "bijection", "--max_iters", "0", "--out_dir", str(tmp_path / "loop")]) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and f"{tmp_path / 'loop'} is a symbolic link" in err and words in err, err


@pytest.mark.skipif(not os.path.exists("/dev/full"), reason="needs /dev/full")
def test_stdout_to_dev_full_is_named(tmp_path):
    # before: "[Errno 28] No space left on device", naming nothing
    here = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    code = "import sys, commandline; commandline.cli(lambda: print('x') or sys.stdout.flush() or 0, 'x.py', 'kept')"
    with open("/dev/full", "w") as full:
        p = subprocess.run([sys.executable, "-c", code], cwd=here, stdout=full, stderr=subprocess.PIPE, text=True)
    assert p.returncode == 1 and p.stderr.strip() == "x.py: error: stdout (/dev/full) is full: No space left on " \
                                                     "device; kept", p.stderr


def test_a_killed_writers_temporary_files_are_removed_by_the_next(tmp_path):
    # geometry.py killed mid-figure left geometry_values.png.<random>.tmp, which nothing removed
    old, live, other = (tmp_path / n for n in ("geometry_values.png.k2_x9abc.tmp", "ckpt.pt.a1b2c3d4.tmp", "my.tmp"))
    for f in (old, live, other):
        f.write_text("")
    os.utime(old, (time.time() - 120,) * 2)
    os.utime(other, (time.time() - 120,) * 2)
    checkpoints.write_text(str(tmp_path / "geometry_values.json"), "{}")
    assert not old.exists() and live.exists() and other.exists()  # a live writer's, and a file of the user's, kept


@pytest.mark.skipif(not hasattr(os, "mkfifo"), reason="needs named pipes")
def test_a_checkpoint_that_is_a_pipe_is_refused_not_waited_on(tmp_path, capsys):
    # before: torch.load opened the FIFO and waited for a writer for ever
    import geometry
    os.mkfifo(tmp_path / "ckpt.pt")
    for main, argv in [(train.main, ["--task", "bijection", "--resume", "--out_dir", str(tmp_path)]),
                       (geometry.main, ["values", "--ckpt", str(tmp_path)])]:
        assert exit_code(main, argv) == 2
        assert f"{tmp_path / 'ckpt.pt'} is not a regular file" in capsys.readouterr().err


def test_frame_seqs_beyond_the_authors_batch_is_refused(tmp_path, capsys):
    # before: trajectory used 256 of --frame_seqs 1000000000 silently, and dynamics drew all of them one by one
    import geometry
    assert exit_code(geometry.main, ["dynamics", "--ckpt", str(tmp_path), "--frame_seqs", "257"]) == 2
    assert "--frame_seqs in [0, 256]" in capsys.readouterr().err


def test_a_huge_max_iters_builds_no_dense_schedule_it_does_not_use():
    # before: --max_iters 10**23 (any --ckpt_schedule) built the dense schedule's list first: OverflowError, and
    # at 10**12 steps a list of 2e8 steps
    assert checkpoints.snapshot_steps("eval", 10 ** 23) == set() == checkpoints.snapshot_steps("last", 10 ** 23)
    assert {1, 2, 3, 6, 10, 18, 32, 56, 100} < checkpoints.snapshot_steps("log", 10 ** 23)
    assert checkpoints.snapshot_steps("dense", 12000) == {*range(100, 1000, 100), *range(1000, 5000, 500),
                                                          *range(5000, 10000, 1000), 10000}
