"""reproduce.py: the tiny matrix makes a table with every cell, a rerun skips finished cells and resumes
a cell that stopped after its checkpoint, parallel cells get one GPU each, bad input is a one-line error."""
from functools import partial
import json
import os
import signal
import subprocess
import sys
import time

import pytest

import reproduce
import presets
import settings
import time_to_target
import train
from cli import exit_code


run = partial(exit_code, reproduce.main)
ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def test_tiny_matrix_table_then_skip_then_resume(tmp_path, capsys):
    out, res = tmp_path / "out", tmp_path / "results"
    # in this process, one cell after another (a child process a cell: test_own_model's sweep, --jobs 2 below)
    argv = ["--preset", "tiny", "--out", str(out), "--results", str(res), "--jobs", "1"]
    assert run(argv) == 0
    table = (res / "table.md").read_text()
    models = [m for m in reproduce.MODEL_ORDER if m in reproduce.row_models()]
    assert "mlp_pos" in models
    for task in reproduce.TASK_ORDER:
        assert f"## {task}" in table
        for model in models:
            r = json.load(open(out / "tiny" / f"{task}_{model}" / "results.json"))
            assert r["iters"] == 4 and (out / "tiny" / f"{task}_{model}" / "train.log").exists()
            assert f"| {model} | {r['n_params']:,} | {r['metrics']['default']['mae_curve']:.4f} |" in table
    assert "| 0.007 |" in table and "| ≈0.409 |" in table  # the paper's numbers beside ours
    recall = json.load(open(out / "tiny" / "recall_transformer" / "results.json"))
    acc = recall["metrics"]["default"]["accuracy_by_slot"]
    assert "Accuracy by the queried pair's place in the store" in table
    assert "| transformer | " + " | ".join(f"{a:.2f}" for a in acc) + " |" in table
    n = len(reproduce.TASK_ORDER) * len(models)
    assert f"{n} cells, preset tiny: 0 finished before" in capsys.readouterr().out

    cell = out / "tiny" / "hmm_lstm"
    stamps = {p: p.stat().st_mtime_ns for p in (out / "tiny").glob("*/results.json") if p.parent != cell}
    os.remove(cell / "results.json")  # as if the sweep had stopped after this cell's last checkpoint
    assert run(argv) == 0
    said = capsys.readouterr().out
    assert f"{n} cells, preset tiny: {n - 1} finished before (skipped), 1 to run" in said and "hmm x lstm: done" in said
    assert json.load(open(cell / "results.json"))["iters"] == 4
    assert all(p.stat().st_mtime_ns == t for p, t in stamps.items())


def test_the_per_position_mlp_is_its_own_row_beside_the_mlp(tmp_path):
    out, res = tmp_path / "out", tmp_path / "results"
    assert run(["--preset", "tiny", "--tasks", "bijection", "--models", "mlp_pos,mlp", "--out", str(out),
                "--results", str(res)]) == 0
    r = {m: json.load(open(out / "tiny" / f"bijection_{m}" / "results.json")) for m in ("mlp", "mlp_pos")}
    assert r["mlp_pos"]["model"] == "mlp" and r["mlp_pos"]["model_config"]["per_position"]
    assert not r["mlp"]["model_config"]["per_position"] and r["mlp_pos"]["n_params"] < r["mlp"]["n_params"]
    lines = (res / "table.md").read_text().splitlines()
    rows = [i for i, line in enumerate(lines) if line.startswith(("| mlp |", "| mlp_pos |"))]
    assert len(rows) == 2 and rows[1] == rows[0] + 1  # mlp_pos beside mlp, both with the paper's figure
    assert all("| ≈1.85 |" in lines[i] for i in rows)
    assert any("`mlp_pos` only the current token" in line for line in lines)


def n_params(task, model, preset, opts):
    run = settings.run_of(task, model, preset, opts)
    return presets.count_params(run.Config, run.Model, run.model_config)  # shapes only


@pytest.mark.parametrize("preset", ["quick", "paper"])
def test_the_per_position_mlp_is_capacity_matched(preset):
    for task in reproduce.TASK_ORDER:
        argv = reproduce.cell_argv(task, "mlp_pos", preset, "x", [])
        assert argv[argv.index("--model") + 1] == "mlp" and argv[argv.index("--per_position") + 1] == "True"
        opts = presets.PRESETS[preset][task]["mlp_pos"]
        assert abs(n_params(task, "mlp", preset, opts) / n_params(task, "transformer", preset, {}) - 1) < 0.01


def test_table_without_matplotlib(tmp_path, monkeypatch):
    assert run(["--preset", "tiny", "--tasks", "bijection", "--models", "mlp", "--out", str(tmp_path / "o"),
                "--results", str(tmp_path / "r")]) == 0
    monkeypatch.setitem(sys.modules, "matplotlib", None)  # import matplotlib now raises ImportError
    assert run(["--preset", "tiny", "--tasks", "bijection,hmm", "--models", "mlp", "--out", str(tmp_path / "o"),
                "--results", str(tmp_path / "r"), "--table_only"]) == 0
    table = (tmp_path / "r" / "table.md").read_text()
    assert "| mlp | not run |" in table and ".png" not in table


def test_parallel_cells_get_one_gpu_each(monkeypatch, tmp_path):
    started = []

    class FakeProcess:
        returncode = 0

        def __init__(self, cmd, stdout, stderr, env):
            started.append((cmd, env["CUDA_VISIBLE_DEVICES"]))

        def poll(self):
            return 0

    monkeypatch.setattr(reproduce.subprocess, "Popen", FakeProcess)
    todo = [((f"t{i}", "m"), ["--task", f"t{i}"], str(tmp_path / f"{i}.log")) for i in range(5)]
    done = list(reproduce.run_cells(todo, jobs=3, n_gpus=3))
    assert sorted(label for label, _, _ in done) == [label for label, _, _ in todo]
    assert [gpu for _, gpu in started[:3]] == ["0", "1", "2"] and all(cmd[1].endswith("train.py") for cmd, _ in started)


@pytest.mark.parametrize("argv, expect", [
    (["--models", "rnn"], "unknown model 'rnn'; valid models: transformer, mamba, lstm, mlp"),
    (["--tasks", "bijection,nope"], "unknown task 'nope'; valid tasks: bijection, hmm, regression, recall"),
    (["--preset", "huge"], "unknown preset 'huge'; valid presets: quick, paper, cpu_paper_task, authors, tiny"),
    (["--jobs", "-1"], "--jobs must be >= 0"),
    (["--taks", "hmm"], "did you mean --tasks"),
    (["--", "--lrr", "1"], "did you mean --lr"),
    (["--", "--out_dir=x"], "--out_dir is set per cell"),
])
def test_bad_input_is_a_one_line_error_before_anything_runs(tmp_path, capsys, argv, expect):
    assert run(argv + ["--out", str(tmp_path / "out"), "--results", str(tmp_path / "res")]) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and expect in err, err
    assert not (tmp_path / "out").exists() and not (tmp_path / "res").exists()


def test_the_table_goes_beside_the_cells_unless_told_to_write_results(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)  # the defaults are relative: out/reproduce
    assert run(["--preset", "tiny", "--tasks", "bijection", "--models", "mlp", "--table_only"]) == 1  # no cell yet
    assert not (tmp_path / "out" / "reproduce" / "tiny" / "table.md").exists()
    assert run(["--preset", "tiny", "--tasks", "bijection", "--models", "mlp", "--jobs", "1"]) == 0
    assert (tmp_path / "out" / "reproduce" / "tiny" / "table.md").exists() and not (tmp_path / "results").exists()
    assert run(["--preset", "tiny", "--tasks", "bijection", "--models", "mlp", "--table_only",
                "--results", "results"]) == 0
    assert (tmp_path / "results" / "table.md").exists()


def test_unusable_results_is_a_one_line_error_before_any_cell_runs(tmp_path, capsys):
    (tmp_path / "f").write_text("x")
    assert run(["--preset", "tiny", "--out", str(tmp_path / "o"), "--results", str(tmp_path / "f" / "r")]) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and "--results" in err and "is a file" in err, err
    assert not (tmp_path / "o").exists()


def test_ctrl_c_stops_the_sweep_with_one_line_on_the_console(tmp_path):
    """The cell's own line goes to its train.log; the console gets the sweep's."""
    p = subprocess.Popen([sys.executable, "reproduce.py", "--preset", "tiny", "--tasks", "bijection", "--models",
                          "transformer,mlp", "--out", str(tmp_path / "o"), "--jobs", "1",
                           "--", "--max_iters", "100000", "--stop_at", "", "--patience", "0"],  # no early end
                         cwd=ROOT,
                         stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                         env=os.environ | {"OMP_NUM_THREADS": "1"}, preexec_fn=ctrl_c_as_in_a_terminal)
    log = tmp_path / "o" / "tiny+max_iters=100000+stop_at=+patience=0" / "bijection_transformer" / "train.log"
    while p.poll() is None and not (log.exists() and "eval step" in log.read_text()):  # the first checkpoint
        time.sleep(0.1)
    p.send_signal(signal.SIGINT)
    out, err = p.communicate(timeout=60)
    assert p.returncode == 2 and "Traceback" not in err and len(err.strip().splitlines()) == 1, err
    assert "interrupted; finished cells are kept" in err and "mlp" not in out  # the sweep stopped
    assert "interrupted at step" in log.read_text()


def test_ctrl_c_with_several_jobs_stops_the_running_cells_and_waits_for_them(tmp_path, monkeypatch):
    procs = []

    class FakeProcess:
        def __init__(self, cmd, stdout, stderr, env):
            self.signals, self.waited, self.returncode = [], False, None
            procs.append(self)

        def poll(self):
            return self.returncode

        def send_signal(self, sig):
            self.signals.append(sig)

        def wait(self, timeout=None):
            self.waited, self.returncode = True, 2

    def interrupt(_):
        raise KeyboardInterrupt

    monkeypatch.setattr(reproduce.subprocess, "Popen", FakeProcess)
    monkeypatch.setattr(reproduce.time, "sleep", interrupt)  # Ctrl-C while both cells train
    todo = [((f"t{i}", "m"), ["--task", f"t{i}"], str(tmp_path / f"{i}.log")) for i in range(3)]
    with pytest.raises(KeyboardInterrupt):
        list(reproduce.run_cells(todo, jobs=2, n_gpus=0))
    assert len(procs) == 2 and all(p.signals == [signal.SIGINT] and p.waited for p in procs)


@pytest.mark.parametrize("jobs", ["1", "2"])
def test_a_cell_another_run_holds_is_not_run_and_its_log_left_alone(tmp_path, capsys, jobs):
    """The sweep locks a cell's folder before it writes the cell's log; train.py (in-process, or a child process
    with --jobs 2) takes the lock over from it. A folder another run holds: not run, its train.log untouched."""
    out = tmp_path / "o" / "tiny"
    held = out / "bijection_mlp"
    held.mkdir(parents=True)
    (held / "train.log").write_text("the other run's log\n")
    owner = subprocess.Popen(["sleep", "120"])
    try:
        (held / ".lock").write_text(f"{owner.pid}\n")
        assert run(["--preset", "tiny", "--tasks", "bijection", "--models", "mlp,lstm", "--jobs", jobs,
                    "--out", str(tmp_path / "o")]) == 1
    finally:
        owner.kill()
        owner.wait()
    said = capsys.readouterr().out
    assert f"bijection x mlp: not run: {held} is in use by another run (pid {owner.pid}" in said
    assert "bijection x mlp: FAILED: its folder is in use by another run" in said and "see" not in said
    assert (held / "train.log").read_text() == "the other run's log\n"
    assert sorted(os.listdir(held)) == [".lock", "train.log"]
    # the lock released
    assert sorted(os.listdir(out / "bijection_lstm")) == ["ckpt.pt", "config.json", "results.json", "train.log"]


def test_a_full_disk_is_one_line_and_keeps_the_table_written_before(tmp_path, monkeypatch, capsys):
    argv = ["--preset", "tiny", "--tasks", "bijection", "--models", "mlp", "--out", str(tmp_path / "o"),
            "--results", str(tmp_path / "r")]
    assert run(argv + ["--jobs", "1"]) == 0
    argv.append("--table_only")
    table = (tmp_path / "r" / "table.md").read_text()

    def full(src, dst):
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(os, "replace", full)  # checkpoints.write_file's rename: the new table never lands
    capsys.readouterr()
    assert run(argv) == 1
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "No space left on device" in err and str(tmp_path / "r") in err, err
    assert (tmp_path / "r" / "table.md").read_text() == table and "table.md" in os.listdir(tmp_path / "r")


def test_a_cell_stopped_by_its_rule_says_so_in_the_table():
    r = dict(iters=400, history=[dict(iter=300), dict(iter=400, stopped="reached accuracy>=0.999")])
    assert time_to_target.steps(r) == "400 (reached accuracy>=0.999)"
    plateau = "plateau: KL not 1% below 0.5 in 4 evaluations"
    assert time_to_target.steps(dict(iters=900, history=[dict(iter=900, stopped=plateau)])) == f"900 ({plateau})"
    assert time_to_target.steps(dict(iters=1500, history=[dict(iter=1500)])) == "1500"  # its schedule's end
    assert time_to_target.steps(dict(iters=1500, history=[])) == "1500"


def ctrl_c_as_in_a_terminal():
    """SIGINT's default action in the child, as a terminal gives it: a test run started in the background (`cmd &`)
    ignores SIGINT, which the child, and so Python's KeyboardInterrupt, would inherit."""
    signal.signal(signal.SIGINT, signal.SIG_DFL)


def test_a_table_of_fewer_finished_cells_goes_beside_the_one_there(tmp_path, capsys):
    """A partial sweep never replaces a table that holds more finished cells; --replace_table does, heading it with
    the sweep it holds and removing the table that stood beside; --table_only over no finished cell says so."""
    res = tmp_path / "r"
    res.mkdir()
    held = ("| model | params |\n|---|---|\n| transformer | 604,928 | 0.0077 |\n| lstm | 608,064 | 0.0103 |\n\n"
            "| model | 1 | 2 |\n|---|---|---|\n| lstm | 0.03 | 0.04 |\n")  # recall's store places: not cells
    (res / "table.md").write_text(held)
    argv = ["--preset", "tiny", "--tasks", "bijection", "--models", "mlp", "--out", str(tmp_path / "o"),
            "--results", str(res)]
    assert run(argv + ["--table_only"]) == 1
    assert "holds no finished cell" in capsys.readouterr().err and not (res / "table.new.md").exists()
    assert run(argv + ["--jobs", "1"]) == 0
    assert (res / "table.md").read_text() == held and "| mlp | " in (res / "table.new.md").read_text()
    assert "holds 2 finished cells, this table 1: it goes beside it" in capsys.readouterr().out
    assert run(argv + ["--table_only", "--replace_table"]) == 0
    table = (res / "table.md").read_text()
    assert "| mlp | " in table and "**One sweep**: `" in table and not (res / "table.new.md").exists()


def test_a_second_sweep_on_one_out_is_refused_before_it_starts_naming_the_first(tmp_path, capsys):
    first = subprocess.Popen(["sleep", "60"])  # a live process holding the sweep's lock
    try:
        (tmp_path / "o" / "tiny").mkdir(parents=True)
        (tmp_path / "o" / "tiny" / ".lock").write_text(f"{first.pid}\n")
        assert run(["--preset", "tiny", "--tasks", "bijection", "--models", "mlp", "--out", str(tmp_path / "o")]) == 2
    finally:
        first.kill()
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and f"in use by another reproduce.py sweep (pid {first.pid}" in err, err
    assert "--out" in err and not (tmp_path / "o" / "tiny" / "bijection_mlp").exists()


def test_the_plan_times_each_cell_and_trains_none(tmp_path, capsys):
    assert run(["--preset", "tiny", "--tasks", "bijection,recall", "--models", "transformer,mlp", "--out",
                str(tmp_path / "o"), "--jobs", "2", "--plan"]) == 0
    out = capsys.readouterr().out
    cells = [line for line in out.splitlines() if "ms/step" in line]
    assert len(cells) == 4 and all("at step 4: <= " in line for line in cells), out
    assert "stops at accuracy>=0.999 or at a plateau (4 x 4 steps) or at step 4" in out and "wall at 2 at a time" in out
    assert not (tmp_path / "o" / "tiny" / "bijection_mlp" / "results.json").exists()
    assert time_to_target.makespan([5, 3, 3, 1], 2) == 6 and time_to_target.makespan([5, 3, 3, 1], 1) == 12


def test_a_sweep_says_its_command_machine_and_wall_time_atop_its_table(tmp_path, monkeypatch):
    monkeypatch.delenv("OMP_NUM_THREADS", raising=False)
    monkeypatch.setattr(reproduce.os, "sched_getaffinity", lambda _: {0, 1, 2, 3}, raising=False)
    assert reproduce.threads(2) == 2 and reproduce.threads(1) == 4 and reproduce.threads(8) == 1
    monkeypatch.setenv("OMP_NUM_THREADS", "3")
    assert reproduce.threads(2) == 3 and reproduce.cores() == 4  # the user's own threads; as many cells as cores
    out, res = tmp_path / "o", tmp_path / "r"
    assert run(["--preset", "tiny", "--tasks", "bijection", "--models", "mlp", "--out", str(out), "--results",
                str(res), "--jobs", "1"]) == 0
    sweep = json.load(open(out / "tiny" / "sweep.json"))
    assert sweep["cells"] == ["bijection_mlp"] and sweep["jobs"] == 1 and sweep["wall_s"] > 0
    table = (res / "table.md").read_text()
    assert f"started {sweep['started']} on {sweep['machine']}, cells 1 at a time; total wall time" in table
    assert "*" not in table.split("| mlp |")[1].split("\n")[0]  # this sweep's cell
    assert run(["--preset", "tiny", "--tasks", "bijection", "--models", "mlp,lstm", "--out", str(out), "--results",
                str(res), "--jobs", "1"]) == 0  # a second sweep runs the lstm: the mlp is an earlier sweep's
    table = (res / "table.md").read_text()
    assert " * |" in table.split("| mlp |")[1].split("\n")[0] and " * |" not in table.split("| lstm |")[1]


def test_one_preset_name_across_train_and_reproduce(tmp_path):
    """tiny is a preset of train.py too, and a cell of it is a tiny run in OUT/tiny (its results.json says so)."""
    assert reproduce.parse_args(["--preset", "tiny"])[0].preset == "tiny"
    assert run(["--preset", "tiny", "--tasks", "recall", "--models", "lstm", "--out", str(tmp_path / "o"),
                "--jobs", "1"]) == 0
    r = json.load(open(tmp_path / "o" / "tiny" / "recall_lstm" / "results.json"))
    assert r["preset"] == "tiny" and r["iters"] == 4 and r["config"]["task_opts"]["n_pairs"] == 4
    assert exit_code(train.main, ["--task", "recall", "--model", "lstm", "--preset", "tiny", "--out_dir",
                                  str(tmp_path / "t")]) == 0
    assert json.load(open(tmp_path / "t" / "results.json"))["metrics"] == r["metrics"]  # the same run


def test_a_cells_folder_names_the_flags_that_change_what_it_trains():
    assert reproduce.budget("quick", []) == "quick"
    assert reproduce.budget("quick", ["--max_iters", "50"]) == "quick+max_iters=50"
    assert reproduce.budget("quick", ["--max_iters=50", "--device", "cpu", "--compile"]) == "quick+max_iters=50"
    assert reproduce.budget("tiny", ["--eval_K", "30", "50", "--per_position"]) == "tiny+eval_K=30,50+per_position"
    assert reproduce.budget("quick", ["--out_name", "a/b"]) == "quick+out_name=a_b"  # never a path


def test_a_cell_the_plan_cannot_build_is_one_line(tmp_path, capsys):
    assert run(["--preset", "tiny", "--tasks", "bijection", "--models", "mlp", "--out", str(tmp_path), "--plan",
                "--", "--batch_size", "300000000"]) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and "--batch_size 300000000" in err and "GiB" in err, err
