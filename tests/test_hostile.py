"""Hostile input, and what the scripts do with it: every bad value, file, environment or signal ends in one line
naming what to change, exit code 2 (usage) or 1 (a fault), with no traceback and the files written before kept
whole."""
from functools import partial
import json
import os
import warnings

import pytest
import torch

from cli import exit_code
import evaluation
import settings
import commandline
import mamba
from mamba import Mamba, MambaConfig
import tasks
import train

run_main = partial(exit_code, train.main)
NOWHERE = ["--max_iters", "0", "--out_dir", "/nonexistent/never"]  # refused before anything is written


def one_line(capsys, want):
    """stderr is one line holding `want`, and no traceback."""
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and want in err and "Traceback" not in err, err


def cpp_compiler():
    """The C++ compiler inductor would use on a CPU, or None (then torch.compile's default backend cannot run)."""
    try:
        from torch._inductor.cpp_builder import get_cpp_compiler
        return get_cpp_compiler()
    except Exception:
        return None


# -----------------------------------------------------------------------------
# torch.compile (inductor) takes new lengths without a graph per length


@pytest.mark.skipif(cpp_compiler() is None, reason="inductor needs a C++ compiler on the CPU")
def test_compiled_mamba_takes_five_lengths_under_inductor(monkeypatch):
    # `bench.py gpu --device cpu --dry_run`'s cell `compile mamba, 5 lengths` with the backend users get: the
    # model under torch.compile (inductor) and its scan step compiled by the "compiled" mode, trained at five
    # lengths with dynamo's recompile limit at 2. Before the fix the conv's backward (inductor fixed the length)
    # and the scan's adjoint step (gy[t]'s strides changed with the length) compiled a graph per length.
    monkeypatch.setitem(mamba.OPS, "compiled", {k: mamba.Fused(f) for k, f in mamba.OPS["sequential"].items()})
    torch.manual_seed(0)
    model = Mamba(MambaConfig(vocab_size=8, n_classes=4, n_layer=1, d_model=8, d_state=2, scan="compiled"))
    torch._dynamo.reset()
    fwd = torch.compile(model)
    try:
        with torch._dynamo.config.patch(recompile_limit=2, fail_on_recompile_limit_hit=True), \
                warnings.catch_warnings(record=True) as said:
            warnings.simplefilter("always")
            for T in range(9, 14):
                x = torch.randint(8, (2, T), generator=torch.Generator().manual_seed(T))
                fwd(x).float().logsumexp(-1).mean().backward()
    finally:
        torch._dynamo.reset()
    eager = [str(w.message) for w in said if "running it eager" in str(w.message)]
    assert not eager, eager  # Fused fell back: its step hit the limit
    assert all(f.compiled not in (None, f.fn) for f in mamba.OPS["compiled"].values()
               if f.fn in (mamba.scan_step, mamba.adjoint_step))


# -----------------------------------------------------------------------------
# train.py's settings: refused in one line naming what to change (presets.py, tasks.py, the model files)


@pytest.mark.parametrize("argv, want", [
    # --train_all_queries queries every stored key: a curriculum on n_queries or query_gap was silently cancelled
    (["--task", "recall", "--n_queries", "2", "--train_all_queries", "--curriculum", "n_queries=1"],
     "so n_queries cannot grow; a curriculum can grow n_pairs"),
    (["--task", "recall", "--train_all_queries", "--curriculum", "query_gap=1", "--query_gap", "3"],
     "so query_gap cannot grow"),
    # V sets the vocabulary: said so, not "L must be <= V=3, got L=19" about the L that V's default set
    (["--task", "bijection", "--curriculum", "V=3"], "V changes the model's inputs or outputs"),
    (["--seed", "18446744073709551616"], "--seed must be an integer in [0, 2**63)"),
    (["--seed", "-3"], "--seed must be an integer in [0, 2**63)"),
    (["--eval_seed", str(2 ** 64)], "--eval_seed must be an integer in [0, 2**63)"),
    (["--eval_seed_during", str(2 ** 64)], "--eval_seed_during must be -1"),
    (["--n_head", "0"], "n_head, d_model and block_size must be >= 1"),  # was a ZeroDivisionError
    (["--mlp_ratio", "-1"], "mlp_ratio >= 0"),
    (["--dropout", "nan"], "dropout must be in [0, 1)"),
    (["--model", "linear_attn", "--beta", "nan"], "beta must be a finite number > 0"),
    (["--model", "linear_attn", "--beta", "inf"], "beta must be a finite number > 0"),
    (["--task", "regression", "--noise_std", "inf"], "noise_std and prior_std must be in [1e-6, 1e6]"),
    (["--task", "regression", "--prior_std", "1e300"], "noise_std and prior_std must be in [1e-6, 1e6]"),
])
def test_bad_settings_are_one_line(capsys, argv, want):
    assert run_main(argv + NOWHERE) == 2
    one_line(capsys, want)


def test_stop_at_refuses_a_bound_that_overflows_to_infinity(capsys):
    # float("1e400") is inf: accepted, the run could never stop early (while mae_curve<=inf was refused)
    with pytest.raises(ValueError, match="a finite number"):
        evaluation.parse_stop("accuracy>=1e400", tasks.make_task("recall"))
    assert run_main(["--stop_at", "accuracy>=1e400"] + NOWHERE) == 2
    one_line(capsys, "--stop_at 'accuracy>=1e400'")


def test_a_curriculum_longer_than_the_run_is_said():
    run = settings.run_of("regression", "transformer", "quick", dict(curriculum_iters=100, max_iters=4))
    note = run.curriculum.note(run.train)  # train.py says it as the run starts
    assert "note: --curriculum d_active=2 grows d_active until step 100 (--curriculum_iters), past the run's 4" in note
    # meant (a schedule --resume continues), nothing trained, and the preset's own: no note
    for given in (dict(curriculum_iters=100, max_iters=4, lr_decay_iters=100), dict(max_iters=0), {}):
        run = settings.run_of("regression", "transformer", "quick", given)
        assert run.curriculum.note(run.train) is None


def test_train_all_queries_still_grows_n_pairs():
    task = tasks.make_task("recall", n_pairs=6, n_queries=3, key_vocab=8, value_vocab=8, filler=2)
    stage = task.all_queries(n_pairs=2)
    assert (stage.n_pairs, stage.n_queries, stage.query_gap) == (2, 2, 0)


def test_resume_below_the_checkpoints_step_is_refused(tmp_path, capsys):
    # it trained nothing and replaced results.json with an evaluation under a config that says --max_iters 2
    argv = ["--task", "bijection", "--V", "6", "--n_layer", "1", "--n_head", "2", "--d_model", "16", "--device", "cpu",
            "--eval_samples", "20", "--eval_samples_during", "20", "--out_dir", str(tmp_path)]
    assert run_main(argv + ["--max_iters", "4", "--eval_interval", "4"]) == 0
    before = (tmp_path / "results.json").read_bytes()
    capsys.readouterr()
    assert run_main(["--resume", "--out_dir", str(tmp_path), "--max_iters", "2"]) == 2
    one_line(capsys, "is at step 4 already; pass a larger --max_iters")
    assert (tmp_path / "results.json").read_bytes() == before
    assert run_main(["--resume", "--out_dir", str(tmp_path), "--max_iters", "4"]) == 0  # at its end: evaluates again


# -----------------------------------------------------------------------------
# the analysis scripts: geometry, conditioning, bench, reproduce; the files they write

import errno
import signal
import time

import bench
import checkpoints
import conditioning
import geometry
import hardware
import reproduce
import runtime

TINY_RUN = ["--task", "bijection", "--V", "6", "--n_layer", "1", "--n_head", "2", "--d_model", "16", "--device", "cpu",
            "--max_iters", "2", "--eval_interval", "2", "--eval_samples", "10", "--eval_samples_during", "10"]


def fault_line(capsys, want):
    """A fault's one line on stderr (exit code 1): names `want` and says what was kept."""
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and want in err and "kept" in err and "Traceback" not in err, err


def test_an_empty_lock_left_by_a_killed_run_is_taken_over(tmp_path):
    lock = tmp_path / ".lock"
    lock.write_text("")
    old = time.time() - 60
    os.utime(lock, (old, old))
    assert checkpoints.lock_out_dir(str(tmp_path)) == str(lock)
    assert lock.read_text().strip() == str(os.getpid())
    checkpoints.unlock_out_dir(str(lock))


@pytest.mark.parametrize("env, name", [(dict(WORLD_SIZE="abc"), "WORLD_SIZE"),
                                       (dict(WORLD_SIZE="2", LOCAL_RANK="x"), "LOCAL_RANK")])
def test_garbage_in_the_torchrun_environment_is_named(monkeypatch, capsys, tmp_path, env, name):
    for k, v in env.items():
        monkeypatch.setenv(k, v)
    assert run_main(TINY_RUN + ["--out_dir", str(tmp_path)]) == 2
    one_line(capsys, name)


def test_a_failed_write_names_the_file_not_its_temporary(tmp_path):
    path = str(tmp_path / "a.json")

    def read_only(tmp):
        raise OSError(errno.EROFS, "Read-only file system", tmp)
    with pytest.raises(OSError) as e:
        checkpoints.write_file(path, read_only)
    assert e.value.filename == path


def test_two_writers_of_one_file_leave_it_whole(tmp_path):
    path = str(tmp_path / "a.json")

    def outer(tmp):  # a second writer of the same file starts and finishes while this one writes
        with open(tmp, "w") as f:
            f.write('{"who": "outer", "pad": "' + "x" * 100)
            f.flush()
            checkpoints.write_text(path, '{"who": "inner"}')
            f.write('"}')
    try:
        checkpoints.write_file(path, outer)
    except OSError:  # now: its temporary file was renamed away by the other writer
        pass
    with open(path) as f:
        json.load(f)  # whole: one writer's or the other's


def geometry_run(path, layers):
    """A run folder with only what geometry.py seeds reads: a qk diagnostic of `layers` layers."""
    os.makedirs(path)
    with open(os.path.join(path, "geometry_qk.json"), "w") as f:
        json.dump(dict(layers=[dict(att_entropy_bits=1.0 + i) for i in range(layers)]), f)
    return str(path)


def test_seeds_on_a_corrupt_json_is_one_line(tmp_path, capsys):
    a, b = geometry_run(tmp_path / "a", 1), geometry_run(tmp_path / "b", 1)
    with open(os.path.join(b, "geometry_qk.json"), "w") as f:
        f.write("{garbage")
    assert exit_code(geometry.main, ["seeds", a, b, "--out", str(tmp_path / "out")]) == 2
    one_line(capsys, "geometry_qk.json")


def test_seeds_out_a_file_is_one_line(tmp_path, capsys):
    a = geometry_run(tmp_path / "a", 1)
    (tmp_path / "afile").write_text("")
    assert exit_code(geometry.main, ["seeds", a, a, "--out", str(tmp_path / "afile")]) == 2
    one_line(capsys, "--out")


def test_seeds_of_different_depths_are_refused(tmp_path, capsys):
    a, b = geometry_run(tmp_path / "a", 1), geometry_run(tmp_path / "b", 2)
    assert exit_code(geometry.main, ["seeds", a, b, "--out", str(tmp_path / "out")]) == 2
    one_line(capsys, "layers")


def test_dynamics_refuses_another_runs_snapshot(tmp_path, capsys):
    run, other = tmp_path / "run", tmp_path / "other"
    assert run_main(TINY_RUN + ["--ckpt_schedule", "log", "--out_dir", str(run)]) == 0
    assert run_main(TINY_RUN[:2] + ["--V", "5"] + TINY_RUN[4:] + ["--out_dir", str(other)]) == 0
    os.replace(other / "ckpt.pt", run / "ckpt_0000005.pt")
    capsys.readouterr()
    assert exit_code(geometry.main, ["dynamics", "--ckpt", str(run), "--n_seq", "8", "--no_plot"]) == 2
    one_line(capsys, "ckpt_0000005.pt")


def test_geometry_names_a_seed_out_of_range(capsys):
    assert exit_code(geometry.main, ["keys", "--ckpt", "/nonexistent", "--seed", str(2 ** 64)]) == 2
    one_line(capsys, "--seed")


@pytest.mark.parametrize("argv", [["drift", "--variants", "hebbian@nan"], ["drift", "--variants", "delta@inf"],
                                  ["drift", "--variants", "oja@-1"], ["drift", "--variants", "hebbian@0"],
                                  ["drift", "--variants", "delta@1.5"]])
def test_conditioning_refuses_a_variant_out_of_range_at_parse(argv):
    with pytest.raises(SystemExit) as e:
        conditioning.parse_args(argv + ["--results", "/tmp"])
    assert e.value.code == 2


@pytest.mark.parametrize("argv", [["drift", "--steps", "40", "--norm_every", "100"],  # was 'max() arg is an empty ...'
                                  ["capacity", "--eps", "5"], ["capacity", "--eps", "1"],  # a probability below 1
                                  ["capacity", "--threads", "100000"],  # torch.set_num_threads segfaulted
                                  ["capacity", "--seed", str(2 ** 64)],  # 'Overflow when unpacking long long'
                                  ["depth_width", "--seeds", "0", str(2 ** 64)]])  # exit 2, the reason in a log only
def test_conditioning_checks_its_ranges_at_parse(argv):
    with pytest.raises(SystemExit) as e:
        conditioning.parse_args(argv + ["--results", "/tmp"])
    assert e.value.code == 2


def test_conditioning_summary_of_a_foreign_json_is_one_line(tmp_path, capsys):
    (tmp_path / "capacity.json").write_text('{"wall_s": 1}')
    assert exit_code(conditioning.main, ["summary", "--results", str(tmp_path)]) == 2
    one_line(capsys, "capacity.json")


@pytest.mark.parametrize("argv", [["matmul", "--n", "8", "--reps", "1", "--threads", "1"],
                                  ["train", "--task", "recall", "--models", "mlp", "--sizes", "quick"]])
def test_bench_on_a_full_disk_is_one_line(monkeypatch, tmp_path, capsys, argv):
    def full(path, obj):
        raise OSError(errno.ENOSPC, "No space left on device", path)
    monkeypatch.setattr(checkpoints, "write_json", full)
    for module in (bench, hardware):
        monkeypatch.setattr(module, "machine", lambda *a, **k: dict(matmul_gflops=1.0))
        monkeypatch.setattr(module, "describe", lambda m: "a CPU")
        monkeypatch.setattr(module, "matmul_peak", lambda *a: 1e9)
    monkeypatch.setattr(bench, "in_fresh_process", lambda *a, **k: (dict(matmul_peak=1e9), None))
    monkeypatch.setattr(bench, "row", lambda m: "a row")
    path = str(tmp_path / "b.json")
    assert exit_code(bench.main, argv + ["--json", path]) == 1
    fault_line(capsys, path)


def test_bench_refuses_more_threads_than_cpus(monkeypatch):
    def set_num_threads(n):  # torch's would segfault this process
        raise AssertionError(f"torch.set_num_threads({n}) was called")
    monkeypatch.setattr(torch, "set_num_threads", set_num_threads)
    assert exit_code(bench.main, ["matmul", "--n", "8", "--reps", "1", "--threads", "100000"]) == 2


def test_time_to_target_on_a_full_disk_is_one_line(monkeypatch, tmp_path, capsys):
    run = tmp_path / "runs" / "recall_transformer"
    run.mkdir(parents=True)
    (run / "results.json").write_text(json.dumps(dict(
        task="recall", model="transformer", iters=50,
        history=[dict(iter=50, time=1.0, accuracy=1.0, mae_curve=0.0, mae_token=0.0, kl=0.0)],
        wall_time_s=1.0, device="cpu", config=dict(train=dict(batch_size=8, eval_interval=50)))))

    def full(path, text):
        raise OSError(errno.ENOSPC, "No space left on device", path)
    monkeypatch.setattr(checkpoints, "write_text", full)
    argv = ["time_to_target", "--tasks", "recall", "--from_runs", str(tmp_path / "runs"), "--results", str(tmp_path)]
    assert exit_code(reproduce.main, argv) == 1
    fault_line(capsys, "time_to_target_from_runs.md")


def test_the_table_skips_a_foreign_results_json(tmp_path):
    cell = tmp_path / "tiny" / "recall_mlp"
    cell.mkdir(parents=True)
    (cell / "results.json").write_text('{"a": 1}')
    assert reproduce.main(["--preset", "tiny", "--tasks", "recall", "--models", "mlp", "--out", str(tmp_path),
                           "--table_only"]) == 1  # no finished cell: said, no table of none
    assert not (tmp_path / "tiny" / "table.md").exists()


@pytest.mark.parametrize("argv", [["memory", "--decay", "nan"], ["memory", "--decay", "2"],
                                  ["scan", "--seed", str(2 ** 64)], ["memory", "--seed", "-1"],
                                  ["memory", "--chunk_size", "16", "-3"]])
def test_bench_checks_seed_and_decay_before_measuring(monkeypatch, argv):
    def started(*a, **k):
        raise AssertionError("a measurement started")
    monkeypatch.setattr(bench, "in_fresh_process", started)
    monkeypatch.setattr(bench, "machine", lambda *a, **k: dict(matmul_gflops=1.0))
    monkeypatch.setattr(bench, "describe", lambda m: "a CPU")
    assert exit_code(bench.main, argv) == 2


def test_out_of_memory_in_any_script_is_one_line(capsys):
    def main():
        raise RuntimeError("[enforce fail at alloc_cpu.cpp:127] DefaultCPUAllocator: can't allocate memory")
    with pytest.raises(SystemExit) as e:
        commandline.cli(main, "bench.py", "nothing was written")
    assert e.value.code == 1  # a fault, not a usage error
    one_line(capsys, "bench.py: error: out of memory (try smaller sizes); nothing was written")


def test_a_checkpoint_whose_weights_do_not_fit_its_config_is_one_line(tmp_path, capsys):
    run = tmp_path / "run"
    assert run_main(TINY_RUN + ["--out_dir", str(run)]) == 0
    state = torch.load(run / "ckpt.pt", weights_only=True)
    state["model_config"]["n_layer"] = 2  # the weights are a 1-layer model's
    torch.save(state, run / "ckpt.pt")
    capsys.readouterr()
    assert run_main(["--resume", "--out_dir", str(run), "--max_iters", "4"]) == 2
    one_line(capsys, f"{run / 'ckpt.pt'}: its weights do not fit its model_config (Missing key(s)")
    assert exit_code(geometry.main, ["keys", "--ckpt", str(run)]) == 2
    one_line(capsys, "its weights do not fit its model_config")


def seed_of(path, seed, task="bijection", V=6, lr=3e-3):
    """A run's results.json as train.py writes it, with what seeds compares: task, model, settings, flags, seed."""
    with open(os.path.join(path, "results.json"), "w") as f:
        json.dump(dict(task=task, model="transformer", seed=seed, config=dict(
            task=task, model="transformer", task_opts=dict(V=V), model_opts=dict(n_layer=1),
            train=dict(lr=lr, seed=seed, out_dir=str(path), eval_interval=seed + 1, device=f"cuda:{seed}"))), f)
    return path


@pytest.mark.parametrize("b, want", [
    (dict(seed=1), "both ran with --seed 1: one run twice?"),
    (dict(seed=2, V=7), "are not seeds of one recipe: --V 6 vs 7"),
    (dict(seed=2, lr=1e-3), "are not seeds of one recipe: --lr 0.003 vs 0.001"),
    (dict(seed=2, task="recall"), "are not seeds of one recipe: task bijection vs recall"),
])
def test_seeds_refuses_runs_of_different_recipes_or_one_seed(tmp_path, capsys, b, want):
    a = seed_of(geometry_run(tmp_path / "a", 1), 1)
    other = seed_of(geometry_run(tmp_path / "b", 1), **b)
    assert exit_code(geometry.main, ["seeds", a, other, "--out", str(tmp_path / "out")]) == 2
    one_line(capsys, want)
    assert exit_code(geometry.main, ["seeds", a, seed_of(other, 2), "--out", str(tmp_path / "out")]) == 0


def test_seeds_refuses_a_run_given_twice(tmp_path, capsys):
    a = geometry_run(tmp_path / "a", 1)
    assert exit_code(geometry.main, ["seeds", a, a + "/", "--out", str(tmp_path / "out")]) == 2
    one_line(capsys, "is given twice")


def test_seeds_refuses_diagnostics_of_another_task(tmp_path, capsys):
    a, b = geometry_run(tmp_path / "a", 1), geometry_run(tmp_path / "b", 1)
    for run, task in ((a, "bijection"), (b, "recall")):
        qk = json.load(open(os.path.join(run, "geometry_qk.json")))
        json.dump(qk | dict(task=task, model="transformer"), open(os.path.join(run, "geometry_qk.json"), "w"))
    assert exit_code(geometry.main, ["seeds", a, b, "--out", str(tmp_path / "out")]) == 2
    one_line(capsys, "are not seeds of one recipe: task bijection vs recall")


def test_conditioning_summary_of_a_folder_without_results_is_refused(tmp_path, capsys):
    assert exit_code(conditioning.main, ["summary", "--results", str(tmp_path)]) == 2
    one_line(capsys, f"no experiment's JSON in {tmp_path} (capacity.json")
    assert not (tmp_path / "summary.md").exists()


def test_a_checkpoint_past_the_file_size_limit_is_named_as_such(tmp_path):
    import resource
    import subprocess
    import sys
    run = tmp_path / "run"
    assert run_main(TINY_RUN + ["--out_dir", str(run)]) == 0
    good = (run / "ckpt.pt").read_bytes()
    limit = len(good) // 2  # the checkpoint cannot be written whole; the log and the lock can
    root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    p = subprocess.run([sys.executable, "train.py", "--resume", "--out_dir", str(run), "--max_iters", "4",
                        "--eval_interval", "4"], cwd=root, capture_output=True, text=True,
                       env=dict(os.environ, OMP_NUM_THREADS="1"),
                       preexec_fn=lambda: resource.setrlimit(resource.RLIMIT_FSIZE, (limit, limit)))
    err = p.stderr.strip()
    assert p.returncode == 2 and len(err.splitlines()) == 1 and "Traceback" not in err, err
    assert f"{run / 'ckpt.pt'}: File too large at step 4; kept {run / 'ckpt.pt'} (step 2)" in err, err
    assert (run / "ckpt.pt").read_bytes() == good and not list(run.glob("*.tmp"))


def test_a_lock_that_cannot_be_written_is_named_and_removed(tmp_path, monkeypatch):
    class Full:  # the disk fills between creating the lock and writing its pid
        def __init__(self, fd, mode):
            os.close(fd)

        def __enter__(self):
            return self

        def __exit__(self, *a):
            return False

        def write(self, text):
            raise OSError(errno.ENOSPC, "No space left on device")
    monkeypatch.setattr(checkpoints.os, "fdopen", Full)
    with pytest.raises(OSError) as e:
        checkpoints.lock_out_dir(str(tmp_path))
    assert e.value.filename == str(tmp_path / ".lock") and e.value.errno == errno.ENOSPC
    assert not (tmp_path / ".lock").exists()  # an empty lock would refuse the next run into the folder


CELL = ["--preset", "tiny", "--tasks", "bijection", "--models", "mlp"]


def test_reproduce_checks_the_values_after_dashes_before_any_cell(tmp_path, capsys):
    assert reproduce.main(CELL + ["--out", str(tmp_path), "--", "--lr", "nan"]) == 2
    one_line(capsys, "--lr must be a finite number, got nan")
    assert os.listdir(tmp_path) == []


def test_reproduce_does_not_keep_a_finished_cell_under_other_flags(tmp_path, capsys):
    assert reproduce.main(CELL + ["--out", str(tmp_path)]) == 0
    capsys.readouterr()
    r = json.load(open(tmp_path / "tiny" / "bijection_mlp" / "results.json"))
    assert reproduce.main(CELL + ["--out", str(tmp_path), "--", "--lr", "1e-3"]) == 0  # a folder named for its flags
    other = json.load(open(tmp_path / "tiny+lr=1e-3" / "bijection_mlp" / "results.json"))
    assert other["config"]["train"]["lr"] == 1e-3 and json.load(open(tmp_path / "tiny" / "bijection_mlp" /
                                                                     "results.json")) == r
    assert reproduce.main(CELL + ["--out", str(tmp_path), "--", "--device", "cpu"]) == 0  # where, not what
    assert "1 finished before (skipped), 0 to run" in capsys.readouterr().out
    r["config"]["train"]["lr"] = 0.5  # a folder holding a run of other settings (a preset changed since)
    json.dump(r, open(tmp_path / "tiny" / "bijection_mlp" / "results.json", "w"))
    assert reproduce.main(CELL + ["--out", str(tmp_path)]) == 2
    one_line(capsys, "bijection_mlp holds a run with --lr 0.5 (the command line gives 0.002): pass another --out")


def test_reproduce_does_not_tabulate_another_cells_run(tmp_path, capsys):
    assert reproduce.main(CELL + ["--out", str(tmp_path)]) == 0
    cell = tmp_path / "tiny" / "bijection_mlp" / "results.json"
    cell.write_text(cell.read_text().replace('"task": "bijection"', '"task": "hmm"'))
    capsys.readouterr()
    assert reproduce.main(CELL + ["--out", str(tmp_path)]) == 2
    one_line(capsys, "bijection_mlp holds a hmm x mlp run")
    assert reproduce.main(CELL + ["--out", str(tmp_path), "--table_only"]) == 1  # no cell of its own: none tabled
    assert "holds no finished cell" in capsys.readouterr().err
    cell.write_text("{garbage")
    assert reproduce.main(CELL + ["--out", str(tmp_path), "--table_only", "--replace_table"]) == 1
    table = (tmp_path / "tiny" / "table.md").read_text()  # the table of the finished cell, kept
    assert "| mlp |" in table and "holds a" not in table


def test_time_to_target_refuses_another_tasks_run(tmp_path, capsys):
    run = tmp_path / "runs" / "bijection_transformer"
    run.mkdir(parents=True)
    (run / "results.json").write_text(json.dumps(dict(task="recall", model="transformer", history=[])))
    argv = ["time_to_target", "--tasks", "bijection", "--from_runs", str(tmp_path / "runs"), "--results",
            str(tmp_path)]
    assert exit_code(reproduce.main, argv) == 2
    one_line(capsys, "it holds a recall x transformer run, not bijection x transformer")


def test_time_to_target_py_is_the_same_program():
    import subprocess
    import sys
    root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    p = subprocess.run([sys.executable, "time_to_target.py", "--tasks", "nope"], cwd=root, capture_output=True,
                       text=True)
    assert p.returncode == 2 and p.stderr.strip().splitlines()[-1] == ("reproduce.py time_to_target: error: unknown "
                                                                       "task 'nope'; valid tasks: bijection, hmm, "
                                                                       "recall, regression"), p.stderr


def listening(port):
    """Whether a socket listens on port (Linux's /proc/net/tcp and tcp6); None where that cannot be read."""
    try:
        rows = [line.split() for f in ("/proc/net/tcp", "/proc/net/tcp6") for line in open(f).readlines()[1:]]
    except OSError:
        return None
    return any(r[1].endswith(f":{port:04X}") and r[3] == "0A" for r in rows)  # 0A: LISTEN


def wait_for(ready, p, fallback=5.0):
    """Until ready() (or p ends, or a minute passes); where ready() cannot tell (None), fallback seconds."""
    deadline = time.time() + 60
    while p.poll() is None and time.time() < deadline:
        now = ready()
        if now is None:
            time.sleep(fallback)
            return
        if now:
            return
        time.sleep(0.05)


def free_port():
    import socket
    try:
        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            return s.getsockname()[1]
    except OSError:
        pytest.skip("no socket on 127.0.0.1 here")


def test_a_rank_whose_partners_never_start_ends_with_a_line(monkeypatch, tmp_path, capsys):
    monkeypatch.setattr(runtime, "RENDEZVOUS_S", 1)
    for k, v in dict(WORLD_SIZE="2", RANK="0", LOCAL_RANK="0", MASTER_ADDR="127.0.0.1",
                     MASTER_PORT=str(free_port())).items():
        monkeypatch.setenv(k, v)
    assert run_main(TINY_RUN + ["--out_dir", str(tmp_path / "run")]) == 2
    one_line(capsys, "1 of WORLD_SIZE=2 processes joined at MASTER_ADDR:MASTER_PORT 127.0.0.1:")
    assert not (tmp_path / "run").exists()


@pytest.mark.parametrize("env, want", [(dict(WORLD_SIZE="2", RANK="2"), "RANK=2 and WORLD_SIZE=2: a run has"),
                                       (dict(WORLD_SIZE="2", RANK="0", MASTER_ADDR="no.such.host.invalid",
                                             MASTER_PORT="29500"), "MASTER_ADDR names no host"),
                                       (dict(WORLD_SIZE="1", RANK="5"), "RANK=5 and WORLD_SIZE=1: a run has"),
                                       (dict(WORLD_SIZE="2", RANK="0"), "needs MASTER_ADDR and a MASTER_PORT")])
def test_a_torchrun_environment_without_its_rank_or_master_is_named(monkeypatch, tmp_path, capsys, env, want):
    monkeypatch.delenv("MASTER_ADDR", raising=False)
    for k, v in env.items():
        monkeypatch.setenv(k, v)
    assert run_main(TINY_RUN + ["--out_dir", str(tmp_path / "run")]) == 2
    one_line(capsys, want)


@pytest.mark.parametrize("sig, rank", [(signal.SIGTERM, "0"), (signal.SIGINT, "0"), (signal.SIGTERM, "1")])
def test_a_signal_ends_a_rank_waiting_for_its_partners(tmp_path, sig, rank):
    import subprocess
    import sys
    root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    port = free_port()
    env = dict(os.environ, WORLD_SIZE="2", RANK=rank, LOCAL_RANK=rank, MASTER_ADDR="127.0.0.1",
               MASTER_PORT=str(port), OMP_NUM_THREADS="1")  # rank 1: no rank 0 to reach
    p = subprocess.Popen([sys.executable, "train.py", *TINY_RUN, "--out_dir", str(tmp_path / "run")], cwd=root,
                         env=env, stderr=subprocess.PIPE, text=True)
    # imported, and waiting for its partner (300 s before it gives up): rank 0 once its store listens on the port;
    # rank 1, which only tries to connect, after a wait that covers its start
    if rank == "0":
        wait_for(lambda: listening(port), p)
    else:
        time.sleep(5)
    p.send_signal(sig)
    err = p.communicate(timeout=10)[1].strip()
    assert p.returncode == 2 and err == "train.py: error: interrupted; nothing was written (training had not started)"


def start(argv, tmp_path):
    import subprocess
    import sys
    root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    return subprocess.Popen([sys.executable, "train.py", *argv, "--out_dir", str(tmp_path / "run")], cwd=root,
                            env=dict(os.environ, OMP_NUM_THREADS="1"), stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True)


@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGINT])
def test_a_signal_while_torch_loads_is_one_line(tmp_path, sig):
    p = start(TINY_RUN, tmp_path)
    time.sleep(0.5)  # python is up, torch is not
    p.send_signal(sig)
    err = p.communicate(timeout=10)[1].strip()
    assert p.returncode == 2 and err == "train.py: error: interrupted; nothing was written", err
    assert not (tmp_path / "run").exists()


def test_two_quick_ctrl_cs_are_one_report_and_exit_code_2(tmp_path):
    p = start(TINY_RUN[:-8] + ["--max_iters", "1000000", "--eval_interval", "20", "--eval_samples_during", "10",
                               "--stop_at", "", "--patience", "0"],  # no early end
              tmp_path)
    while not (tmp_path / "run" / "ckpt.pt").exists():  # training, past its first checkpoint
        time.sleep(0.05)
    p.send_signal(signal.SIGINT)
    time.sleep(0.01)
    p.send_signal(signal.SIGINT)
    err = p.communicate(timeout=20)[1].strip()
    assert p.returncode == 2 and len(err.splitlines()) == 1 and "interrupted at step" in err, err
    assert torch.load(tmp_path / "run" / "ckpt.pt", weights_only=True)["iter"] >= 20


def test_a_bad_environment_under_a_sweep_is_said_on_stderr(tmp_path, monkeypatch, capsys):
    monkeypatch.setenv("WORLD_SIZE", "abc")
    assert reproduce.main(CELL + ["--out", str(tmp_path)]) == 1
    err = capsys.readouterr().err.strip().splitlines()
    want = "bijection x mlp: FAILED (exit 2): train.py: error: environment variable WORLD_SIZE='abc'"
    assert len(err) == 1 and want in err[0] and "train.log" in err[0], err
    argv = ["depth_width", "--results", str(tmp_path / "r"), "--scratch", str(tmp_path / "s"), "--twin", "false",
            "--n_facts", "2", "--facts_per_chain", "2", "--n_entities", "4", "--ws", "1", "2", "8", "--nd", "2", "1",
            "--seeds", "0", "--max_iters", "2", "--batch_size", "4", "--eval_samples", "10"]
    assert exit_code(conditioning.main, argv) == 2
    one_line(capsys, "conditioning.py: error: a depth_width run stopped (exit code 2): train.py: error: environment "
                     "variable WORLD_SIZE='abc'")


@pytest.mark.parametrize("value", ["abc", "0", "-2", "4,x", "", " "])
def test_omp_num_threads_that_is_not_a_count_is_refused(monkeypatch, capsys, value):
    monkeypatch.setenv("OMP_NUM_THREADS", value)
    with pytest.raises(SystemExit) as e:
        commandline.cli(lambda: pytest.fail("main ran"), "train.py", "nothing was written")
    assert e.value.code == 2
    one_line(capsys, f"train.py: error: environment variable OMP_NUM_THREADS={value!r} must be a number of threads")


def test_omp_num_threads_of_a_count_runs(monkeypatch):
    monkeypatch.setenv("OMP_NUM_THREADS", "2")
    with pytest.raises(SystemExit) as e:
        commandline.cli(lambda: 0, "train.py", "nothing was written")
    assert e.value.code == 0


def test_bench_matmul_refuses_a_json_that_is_a_folder_before_measuring(monkeypatch, tmp_path, capsys):
    monkeypatch.setattr(hardware, "machine", lambda *a, **k: pytest.fail("measured first"))
    assert exit_code(bench.main, ["matmul", "--n", "8", "--reps", "1", "--json", str(tmp_path)]) == 2
    assert f"--json {tmp_path}: is a folder; give a file name" in capsys.readouterr().err


def test_geometry_on_a_read_only_run_says_so_before_the_work(tmp_path, monkeypatch, capsys):
    run = tmp_path / "run"
    assert run_main(TINY_RUN + ["--out_dir", str(run)]) == 0
    monkeypatch.setattr(os, "access", lambda path, mode: os.path.realpath(path) != os.path.realpath(run))
    monkeypatch.setitem(geometry.RUN, "keys", lambda *a: pytest.fail("analysed first"))
    capsys.readouterr()
    assert exit_code(geometry.main, ["keys", "--ckpt", str(run)]) == 2
    one_line(capsys, f"--ckpt {run}: cannot write there ({run} is not writable)")


LATE_SIGNAL = """
import atexit, os, signal, sys, time
signal.signal(signal.SIGINT, lambda *a: os._exit(9))  # a script's own handler while torch loads
import runtime
import commandline
atexit.register(lambda: (os.kill(os.getpid(), signal.SIGINT), time.sleep(0.5)))  # Ctrl-C while the process exits
commandline.cli(lambda: 0, "x.py", "nothing was written")
"""


def test_a_signal_after_the_work_is_done_is_ignored():
    import subprocess
    import sys
    root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    p = subprocess.run([sys.executable, "-c", LATE_SIGNAL], cwd=root, capture_output=True, text=True, timeout=60)
    assert p.returncode == 0 and p.stderr == "", p.stderr


EDITS = dict(  # a checkpoint edited by hand: what each edit does to it
    extra_field=lambda s: s["model_config"].update(bogus=1), other_model=lambda s: s["config"].update(model="mamba"),
    config_text=lambda s: s.update(config="notadict"), no_model_config=lambda s: s.update(model_config=None),
    step_text=lambda s: s.update(iter="x"), no_train=lambda s: s["config"].pop("train"),
    other_vocabulary=lambda s: s["config"]["task_opts"].update(V=9), width_text=lambda s: s["model_config"].update(
        d_model="x"), generator_text=lambda s: s.update(gen_state="garbage"),
    rng_floats=lambda s: s.update(torch_rng=torch.zeros(3)), elapsed_text=lambda s: s.update(elapsed="x"),
    history_text=lambda s: s.update(history="notalist"), step_negative=lambda s: s.update(iter=-5))


@pytest.mark.parametrize("edit", list(EDITS))
def test_a_hand_edited_checkpoint_is_one_line(tmp_path, capsys, edit):
    run = tmp_path / "run"
    assert run_main(TINY_RUN + ["--out_dir", str(run)]) == 0
    state = torch.load(run / "ckpt.pt", weights_only=True)
    EDITS[edit](state)
    torch.save(state, run / "ckpt.pt")
    capsys.readouterr()
    assert run_main(["--resume", "--out_dir", str(run), "--max_iters", "4"]) == 2
    one_line(capsys, f"{run / 'ckpt.pt'}: not a readable train.py checkpoint (")
    assert exit_code(geometry.main, ["keys", "--ckpt", str(run), "--n_seq", "8", "--no_plot"]) == 2
    one_line(capsys, "not a readable train.py checkpoint (")


def test_seeds_reads_a_runs_settings_from_its_checkpoint_without_results_json(tmp_path, capsys):
    runs = []
    for name, flags in (("a", ["--seed", "1"]), ("b", ["--seed", "1", "--lr", "1e-3"]), ("c", ["--seed", "1"])):
        assert run_main(TINY_RUN + flags + ["--out_dir", str(tmp_path / name)]) == 0
        os.remove(tmp_path / name / "results.json")
        (tmp_path / name / "geometry_qk.json").write_text(json.dumps(dict(layers=[dict(att_entropy_bits=1.0)])))
        runs.append(str(tmp_path / name))
    capsys.readouterr()
    assert exit_code(geometry.main, ["seeds", runs[0], runs[1], "--out", str(tmp_path / "out")]) == 2
    one_line(capsys, "are not seeds of one recipe: --lr 0.004 vs 0.001")
    assert exit_code(geometry.main, ["seeds", runs[0], runs[2], "--out", str(tmp_path / "out")]) == 2
    one_line(capsys, "both ran with --seed 1")
    for name in "ac":
        os.remove(tmp_path / name / "ckpt.pt")  # copied diagnostics only: nothing to compare, and said so
    assert exit_code(geometry.main, ["seeds", runs[0], runs[2], "--out", str(tmp_path / "out")]) == 0
    assert f"unchecked: {runs[0]} has no results.json or ckpt.pt" in capsys.readouterr().out


def test_a_rank_whose_port_another_kind_of_server_holds_ends_on_a_signal(tmp_path):
    import socket
    import subprocess
    import sys
    import threading
    server = socket.socket()  # listens and accepts, and never answers: not a store
    try:
        server.bind(("127.0.0.1", 0))
    except OSError:
        pytest.skip("no socket on 127.0.0.1 here")
    server.listen()
    held = []
    threading.Thread(target=lambda: held.append(server.accept()), daemon=True).start()
    root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    env = dict(os.environ, WORLD_SIZE="2", RANK="1", LOCAL_RANK="1", MASTER_ADDR="127.0.0.1",
               MASTER_PORT=str(server.getsockname()[1]), OMP_NUM_THREADS="1")
    p = subprocess.Popen([sys.executable, "train.py", *TINY_RUN, "--out_dir", str(tmp_path / "run")], cwd=root,
                         env=env, stderr=subprocess.PIPE, text=True)
    try:
        wait_for(lambda: bool(held), p)  # imported, connected, and waiting for an answer that never comes
        p.send_signal(signal.SIGTERM)
        err = p.communicate(timeout=10)[1].strip()
    finally:
        p.kill()
        server.close()
    assert p.returncode == 2 and err == "train.py: error: interrupted; nothing was written (training had not started)"


# -----------------------------------------------------------------------------
# PYTHONWARNINGS=error: torch's own warnings while it compiles Mamba's scan step are not a traceback

@pytest.mark.skipif(cpp_compiler() is None, reason="inductor needs a C++ compiler on the CPU")
def test_mambas_compiled_scan_step_under_pythonwarnings_error():
    # before: torch.compile imported torch.utils.mkldnn, whose torch.jit.script_method deprecation (torch's own)
    # became a traceback; and dynamo reading .grad as it traced made compiling "fail", then mamba's own warning
    import subprocess
    import sys
    code = ("import torch, mamba; f = mamba.Fused(lambda a, b: a * b + 1); x = torch.ones(3, requires_grad=True); "
            "f(x, x.detach()).sum().backward(); print(f.compiled is not f.fn, x.grad.tolist())")
    here = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    p = subprocess.run([sys.executable, "-c", code], cwd=here, capture_output=True, text=True, timeout=300,
                       env=os.environ | {"PYTHONWARNINGS": "error", "OMP_NUM_THREADS": "1"})
    assert p.returncode == 0 and p.stdout.split() == ["True", "[1.0,", "1.0,", "1.0]"], p.stderr[-2000:]


def test_geometry_figures_under_warnings_as_errors(tmp_path):
    # matplotlib's warnings (a legend with nothing to label, a log scale over no positive value) as errors
    import geometry
    out = str(tmp_path / "run")
    assert train.main(["--task", "bijection", "--model", "transformer", "--V", "6", "--d_model", "16", "--n_layer",
                       "2", "--n_head", "2", "--max_iters", "4", "--eval_interval", "2", "--ckpt_schedule", "log",
                       "--eval_samples", "8", "--eval_samples_during", "8", "--out_dir", out]) == 0
    matplotlib = pytest.importorskip("matplotlib")  # figures are optional: without matplotlib there are none
    import matplotlib.pyplot as plt
    was = matplotlib.rcParams["figure.constrained_layout.use"]
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        assert geometry.main(["all", "--ckpt", out, "--n_seq", "8"]) == 0
        # before: geometry.py turned constrained layout on for the whole process, so a later figure's tight_layout
        # (conditioning.py's, reproduce.py's, in one test session) warned "The figure layout has changed to tight"
        assert matplotlib.rcParams["figure.constrained_layout.use"] == was
        fig = plt.figure()
        fig.tight_layout()
        plt.close(fig)
