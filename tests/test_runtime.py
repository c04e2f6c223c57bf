"""runtime.py and checkpoints.py: the faults of a run (Ctrl-C, out of memory, a full disk, divergence) and its
messages, one line each, saying what was kept; files written whole; checkpoints that cannot be read; and which
modules may import what: the model files nothing of the project, the scripts their plumbing from runtime.py and
checkpoints.py, not train.py."""
import ast
from functools import partial
import json
import math
import os
import signal
import subprocess
import sys

import pytest
import torch

import commandline
import checkpoints
import tasks
import train
from cli import exit_code

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
TINY = ["--task", "bijection", "--V", "6", "--n_layer", "1", "--n_head", "2", "--d_model", "16",
        "--batch_size", "16", "--log_interval", "5", "--eval_samples", "50", "--eval_samples_during", "50"]
MODEL_FILES = ("transformer.py", "mamba.py", "lstm.py", "mlp.py", "linear_attn.py")
SCRIPTS = ("train.py", "geometry.py", "geometry_attention.py", "conditioning.py", "bench.py", "hardware.py",
           "reproduce.py", "time_to_target.py")
PLUMBING = ("runtime.py", "checkpoints.py", "commandline.py")


run_main = partial(exit_code, train.main)


def imports(path):
    """The top-level package of every module a file imports."""
    tree = ast.parse(open(os.path.join(ROOT, path)).read())
    return {a.name.split(".")[0] for n in ast.walk(tree) if isinstance(n, ast.Import) for a in n.names} | \
        {n.module.split(".")[0] for n in ast.walk(tree) if isinstance(n, ast.ImportFrom) and n.level == 0}


@pytest.mark.parametrize("path", MODEL_FILES)
def test_a_model_file_imports_only_torch_einops_and_the_standard_library(path):
    found = imports(path)
    assert "torch" in found
    assert found - {"torch", "einops"} <= set(sys.stdlib_module_names), found
    project = {f[:-3] for f in os.listdir(ROOT) if f.endswith(".py")}
    assert not found & project, found & project


def test_no_file_imports_one_that_imports_it_back():
    """The top level imports downwards only: following the project's imports from any file never comes back to it."""
    project = {f[:-3] for f in os.listdir(ROOT) if f.endswith(".py")}
    below = {m: imports(m + ".py") & project for m in project}
    for m in project:
        seen, todo = set(), list(below[m])
        while todo:
            n = todo.pop()
            assert n != m, f"{m}.py imports a file that imports it back"
            if n not in seen:
                seen.add(n)
                todo += below[n]


def test_the_import_check_sees_a_project_import(tmp_path):
    (tmp_path / "m.py").write_text("import math\nfrom torch import nn\nif True:\n    from tasks import make_task\n")
    assert imports(str(tmp_path / "m.py")) == {"math", "torch", "tasks"}


@pytest.mark.parametrize("path", SCRIPTS)
def test_no_script_takes_its_plumbing_from_train_py(path):
    tree = ast.parse(open(os.path.join(ROOT, path)).read())
    plumbing = {n.name for f in PLUMBING for n in ast.parse(open(os.path.join(ROOT, f)).read()).body
                if isinstance(n, (ast.FunctionDef, ast.ClassDef))}
    used = {n.attr for n in ast.walk(tree) if isinstance(n, ast.Attribute) and isinstance(n.value, ast.Name)
            and n.value.id == "train"} | \
        {a.name for n in ast.walk(tree) if isinstance(n, ast.ImportFrom) and n.module == "train" for a in n.names}
    assert not used & plumbing, used & plumbing
    assert {"pick_device", "CompiledOrEager", "guarded", "read_checkpoint", "write_file", "cli"} <= plumbing


def test_print0_speaks_on_rank_0_only(monkeypatch, capsys):
    checkpoints.print0("alone")
    monkeypatch.setattr(checkpoints.dist, "is_initialized", lambda: True)
    monkeypatch.setattr(checkpoints.dist, "get_rank", lambda: 1)
    checkpoints.print0("rank 1")
    monkeypatch.setattr(checkpoints.dist, "get_rank", lambda: 0)
    checkpoints.print0("rank 0", file=sys.stderr)
    out = capsys.readouterr()
    assert out.out == "alone\n" and out.err == "rank 0\n"


class NotATensor:
    pass


@pytest.mark.parametrize("bad", ["missing", "empty", "garbage", "random", "text", "truncated", "pickled_object",
                                 "not_train_py"])
def test_bad_checkpoints_are_clear_errors(tmp_path, capsys, bad):
    path = tmp_path / "ckpt.pt"
    if bad == "truncated":
        assert run_main(TINY + ["--max_iters", "2", "--eval_interval", "2", "--out_dir", str(tmp_path)]) == 0
        path.write_bytes(path.read_bytes()[:3000])
        capsys.readouterr()
    elif bad == "pickled_object":
        torch.save({"model": NotATensor()}, path)  # loading would need to run code
    elif bad == "not_train_py":
        torch.save({"weights": torch.zeros(2)}, path)
    elif bad != "missing":
        path.write_bytes(dict(empty=b"", garbage=b"not a checkpoint", text=b"epoch,loss\n1,0.5\n",
                              random=bytes(torch.randint(0, 256, (4096,), generator=torch.Generator().manual_seed(0),
                                                         dtype=torch.uint8).tolist()))[bad])
    assert run_main(["--task", "bijection", "--eval_only", "--out_dir", str(tmp_path)]) == 2
    err = capsys.readouterr().err.strip()
    want = "no checkpoint" if bad == "missing" else "not a readable train.py checkpoint (truncated or corrupt?)"
    assert len(err.splitlines()) == 1 and want in err and "weights_only" not in err, err


def test_the_scripts_and_a_resolved_run_leave_torch_dynamo_unimported():
    """Importing a script, and resolving a run (its model on the meta device: --dry_run, --help, a sweep's plan), load
    no torch._dynamo, a second of every start: torch.compile, a Mamba and an optimizer import it as they are made."""
    code = ("import sys, settings, train, reproduce, geometry, bench, conditioning\n"
            "for task, model in (('hmm', 'transformer'), ('regression', 'lstm'), ('bijection', 'mlp'), "
            "('recall', 'linear_attn')):\n"
            "    settings.run_of(task, model, 'paper')\n"
            "print('torch._dynamo' in sys.modules)")
    p = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True)
    assert p.returncode == 0 and p.stdout.strip() == "False", p.stdout + p.stderr


def test_a_reader_gone_before_the_output_is_no_error_line():
    """`train.py --dry_run | head`: a reader that stopped reading (here: before the first line) cuts the output
    short, exit code 1, with nothing on stderr (no "Broken pipe" line, no "Exception ignored" at exit)."""
    p = subprocess.Popen([sys.executable, "train.py", "--dry_run"], cwd=ROOT, stdout=subprocess.PIPE,
                         stderr=subprocess.PIPE, text=True)
    p.stdout.close()
    err = p.stderr.read()
    assert p.wait(timeout=120) == 1 and err == "", err


def test_cli_exit_code_and_no_traceback():
    p = subprocess.run([sys.executable, "train.py", "--task", "recall", "--n_pairs", "0"], cwd=ROOT,
                       capture_output=True, text=True, timeout=120)
    assert p.returncode == 2 and "Traceback" not in p.stderr and "n_pairs must be an int >= 1" in p.stderr


def test_a_fresh_run_refuses_an_existing_run_and_overwrite_replaces_it(tmp_path, capsys):
    argv = TINY + ["--max_iters", "4", "--eval_interval", "2", "--ckpt_schedule", "eval", "--out_dir", str(tmp_path)]
    assert run_main(argv) == 0
    before = {p: (tmp_path / p).read_bytes() for p in os.listdir(tmp_path)}
    capsys.readouterr()
    assert run_main(argv) == 2  # the same command twice
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and str(tmp_path) in err and "--resume" in err and "--overwrite" in err, err
    assert {p: (tmp_path / p).read_bytes() for p in os.listdir(tmp_path)} == before  # untouched
    argv = TINY + ["--max_iters", "3", "--eval_interval", "3", "--overwrite", "--out_dir", str(tmp_path)]
    assert run_main(argv) == 0
    assert sorted(os.listdir(tmp_path)) == ["ckpt.pt", "config.json", "results.json"]  # the old snapshots are gone
    assert json.load(open(tmp_path / "results.json"))["iters"] == 3


def test_diverging_run_names_a_last_good_checkpoint_that_exists(tmp_path, capsys):
    for i, (log, ev) in enumerate([("20", "5"), ("1", "1")]):  # no checkpoint before the blow-up; one every step
        out = tmp_path / str(i)
        argv = TINY + ["--lr", "1e6", "--grad_clip", "0", "--warmup_iters", "0", "--max_iters", "40",
                       "--log_interval", log, "--eval_interval", ev, "--out_dir", str(out)]
        assert run_main(argv) == 1
        err = capsys.readouterr().err.strip().splitlines()[-1]
        assert "stopping; last good checkpoint:" in err, err
        if "none was saved yet" not in err:
            state = torch.load(out / "ckpt.pt", weights_only=True)
            assert f"(step {state['iter']})" in err
            assert all(torch.isfinite(p).all() for p in state["model"].values())
            assert all(math.isfinite(v) for h in state["history"] for v in h.values())
        else:
            assert not (out / "ckpt.pt").exists()


def test_write_file_keeps_the_old_file_when_a_write_fails(tmp_path):
    path = str(tmp_path / "r.json")
    checkpoints.write_json(path, {"a": 1})

    def half(tmp):
        open(tmp, "w").write('{"a": ')
        raise OSError(28, "No space left on device")

    with pytest.raises(OSError, match="No space left on device") as e:
        checkpoints.write_file(path, half)
    assert e.value.filename == path  # named in the one-line report
    assert json.load(open(path)) == {"a": 1} and os.listdir(tmp_path) == ["r.json"]


@pytest.mark.parametrize("fault", ["disk_full", "out_of_memory", "ctrl_c"])
def test_faults_during_a_run_are_one_line_and_keep_the_last_checkpoint(tmp_path, capsys, monkeypatch, fault):
    assert run_main(TINY + ["--max_iters", "4", "--eval_interval", "4", "--out_dir", str(tmp_path)]) == 0
    good = (tmp_path / "ckpt.pt").read_bytes()
    real_sample = tasks.Bijection.sample

    def full_disk(path, data):
        open(path, "wb").write(b"partial")
        raise OSError(28, "No space left on device")

    def sample(self, n, g=None):
        if n < 50:  # a training batch, not the held-out set
            raise torch.OutOfMemoryError("CUDA out of memory") if fault == "out_of_memory" else KeyboardInterrupt
        return real_sample(self, n, g)

    monkeypatch.setattr(checkpoints, "write_bytes", full_disk) if fault == "disk_full" else \
        monkeypatch.setattr(tasks.Bijection, "sample", sample)
    (tmp_path / "ckpt.pt.tmp").write_bytes(b"left by a kill -9")  # removed when the run starts
    capsys.readouterr()
    argv = ["--task", "bijection", "--resume", "--max_iters", "8", "--out_dir", str(tmp_path)]
    if fault == "ctrl_c":  # said, then raised on, so that a sweep calling main() stops too
        with pytest.raises(KeyboardInterrupt):
            run_main(argv)
    else:
        assert run_main(argv) == 2
    err = capsys.readouterr().err.strip()
    want = dict(disk_full="ckpt.pt: No space left on device", out_of_memory="out of memory",
                ctrl_c="interrupted")[fault]
    assert len(err.splitlines()) == 1 and want in err and f"kept {tmp_path / 'ckpt.pt'} (step 4)" in err, err
    assert (tmp_path / "ckpt.pt").read_bytes() == good
    assert sorted(os.listdir(tmp_path)) == ["ckpt.pt", "config.json", "results.json"]


def test_out_of_memory_before_the_first_checkpoint_leaves_no_empty_folder(tmp_path, capsys, monkeypatch):
    monkeypatch.setattr(tasks.Bijection, "sample", lambda *a: (_ for _ in ()).throw(torch.OutOfMemoryError("oom")))
    assert run_main(TINY + ["--max_iters", "4", "--out_dir", str(tmp_path / "run")]) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and "out of memory" in err and "no checkpoint was saved" in err, err
    assert not (tmp_path / "run").exists()


@pytest.mark.parametrize("where", ["file", "under_file"])
def test_unusable_out_dir_is_a_one_line_error(tmp_path, capsys, where):
    (tmp_path / "f").write_text("x")
    out = tmp_path / "f" if where == "file" else tmp_path / "f" / "run"
    assert run_main(TINY + ["--max_iters", "2", "--out_dir", str(out)]) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and f"--out_dir {out}: cannot write there ({tmp_path / 'f'} is a file)" in err


@pytest.mark.parametrize("sig", [signal.SIGINT, signal.SIGTERM])
def test_ctrl_c_in_a_real_process_is_one_line_saying_what_was_kept(tmp_path, sig):
    argv = [sys.executable, "train.py"] + TINY + ["--max_iters", "100000", "--eval_interval", "5",
                                                  "--log_interval", "5", "--out_dir", str(tmp_path),
                                                  "--stop_at", "", "--patience", "0"]  # no early end
    p = subprocess.Popen(argv, cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                         env=os.environ | {"OMP_NUM_THREADS": "1"}, preexec_fn=ctrl_c_as_in_a_terminal)
    seen = False
    for line in p.stdout:  # wait for the first checkpoint: the progress line after the first evaluation
        if seen:
            break
        seen = line.startswith("eval step")
    p.send_signal(sig)  # SIGTERM (kill) ends it as Ctrl-C does
    _, err = p.communicate(timeout=60)
    assert p.returncode == 2 and "Traceback" not in err and len(err.strip().splitlines()) == 1, err
    assert "interrupted at step" in err and f"kept {tmp_path / 'ckpt.pt'} (step" in err
    assert not [f for f in os.listdir(tmp_path) if f.endswith(".tmp")]


def test_ctrl_c_outside_a_run_is_one_line_and_exit_2(capsys):
    def interrupted():
        raise KeyboardInterrupt

    with pytest.raises(SystemExit) as e:
        commandline.cli(interrupted, "x.py", "nothing was written")
    assert e.value.code == 2 and capsys.readouterr().err == "x.py: error: interrupted; nothing was written\n"


def test_a_run_owns_its_folder_a_second_is_refused_and_a_stale_lock_is_taken_over(tmp_path, capsys):
    owner = subprocess.Popen(["sleep", "60"])  # a live process holding the folder
    try:
        (tmp_path / ".lock").write_text(f"{owner.pid}\n")
        argv = TINY + ["--max_iters", "2", "--eval_interval", "2", "--out_dir", str(tmp_path)]
        assert run_main(argv) == 2
        err = capsys.readouterr().err.strip()
        assert len(err.splitlines()) == 1 and f"in use by another run (pid {owner.pid}" in err, err
        assert os.listdir(tmp_path) == [".lock"]  # nothing written, the owner's lock kept
        assert run_main(argv + ["--overwrite"]) == 2 and os.listdir(tmp_path) == [".lock"]
    finally:
        owner.kill()
        owner.wait()
    capsys.readouterr()
    assert run_main(argv) == 0  # the owner is gone: its lock is stale
    out = capsys.readouterr().out
    assert f"taking over the lock of pid {owner.pid}, which is no longer running" in out
    assert sorted(os.listdir(tmp_path)) == ["ckpt.pt", "config.json", "results.json"]  # released at the end


def test_overwrite_keeps_the_old_run_until_the_new_one_saves_a_checkpoint(tmp_path, capsys, monkeypatch):
    assert run_main(TINY + ["--max_iters", "4", "--eval_interval", "2", "--ckpt_schedule", "eval",
                            "--out_dir", str(tmp_path)]) == 0
    old = {p: (tmp_path / p).read_bytes() for p in os.listdir(tmp_path)}
    assert len(old) == 5  # ckpt.pt, config.json, results.json and two snapshots
    real_sample = tasks.Bijection.sample

    def sample(self, n, g=None):  # Ctrl-C at the first training batch
        if n < 50:
            raise KeyboardInterrupt
        return real_sample(self, n, g)

    monkeypatch.setattr(tasks.Bijection, "sample", sample)
    capsys.readouterr()
    with pytest.raises(KeyboardInterrupt):
        run_main(TINY + ["--max_iters", "4", "--overwrite", "--out_dir", str(tmp_path)])
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and "the run it was to replace is put back" in err, err
    assert {p: (tmp_path / p).read_bytes() for p in os.listdir(tmp_path)} == old
    monkeypatch.setattr(tasks.Bijection, "sample", real_sample)
    argv = TINY + ["--lr", "1e6", "--grad_clip", "0", "--warmup_iters", "0", "--max_iters", "40", "--log_interval",
                   "1", "--eval_interval", "100", "--ckpt_schedule", "log", "--overwrite", "--out_dir", str(tmp_path)]
    assert run_main(argv) == 1  # diverges before its first ckpt.pt (its log-spaced snapshots go too)
    assert "the run it was to replace is put back" in capsys.readouterr().err
    assert {p: (tmp_path / p).read_bytes() for p in os.listdir(tmp_path)} == old
    (tmp_path / ".replaced").mkdir()  # an --overwrite run killed (kill -9) before its first checkpoint
    for p in old:
        os.replace(tmp_path / p, tmp_path / ".replaced" / p)
    assert run_main(TINY + ["--max_iters", "2", "--out_dir", str(tmp_path)]) == 2  # put back, so refused
    assert "put back the run" in capsys.readouterr().out
    assert {p: (tmp_path / p).read_bytes() for p in old} == old and not (tmp_path / ".replaced").exists()


def test_an_empty_lock_is_held_by_a_run_writing_its_pid_not_taken_over(tmp_path, capsys):
    (tmp_path / ".lock").write_text("")  # created with O_EXCL, its pid not written yet
    argv = TINY + ["--max_iters", "2", "--eval_interval", "2", "--out_dir", str(tmp_path)]
    assert run_main(argv) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and "in use by another run (pid unknown" in err, err
    assert os.listdir(tmp_path) == [".lock"]


def test_a_run_removes_only_its_own_temporary_files(tmp_path):
    """A kill -9 mid-write leaves ckpt.pt.<random>.tmp (or an older run's ckpt.pt.tmp); another script may be
    writing geometry_qk.json.<random>.tmp right now."""
    argv = TINY + ["--max_iters", "2", "--eval_interval", "2", "--out_dir", str(tmp_path)]
    assert run_main(argv) == 0
    others = ["geometry_qk.json.x1y2.tmp", "train.log.tmp"]
    for name in ["ckpt.pt.tmp", "ckpt.pt.a8b_9.tmp", "ckpt_0000002.pt.k2j3.tmp", "results.json.q0.tmp"] + others:
        (tmp_path / name).write_text("x")
    assert run_main(["--task", "bijection", "--resume", "--max_iters", "4", "--out_dir", str(tmp_path)]) == 0
    assert sorted(os.listdir(tmp_path)) == ["ckpt.pt", "config.json"] + others[:1] + ["results.json"] + others[1:]


def test_a_lock_this_process_or_its_parent_holds_is_handed_over(tmp_path):
    """reproduce.py locks a cell before it writes the cell's log, then starts train.py (a child, or in-process)."""
    for owner in (os.getpid(), os.getppid()):
        (tmp_path / ".lock").write_text(f"{owner}\n")
        assert checkpoints.lock_out_dir(str(tmp_path)) == str(tmp_path / ".lock")
        assert (tmp_path / ".lock").read_text() == f"{os.getpid()}\n" and os.listdir(tmp_path) == [".lock"]
        checkpoints.unlock_out_dir(str(tmp_path / ".lock"))
        assert os.listdir(tmp_path) == []


RANK = """import sys
import runtime
train = dict(device="cpu", out_dir=sys.argv[1], batch_size=2, overwrite=False, ckpt_schedule="last", max_iters=1)
try:
    sys.exit(runtime.guarded(lambda proc: runtime.prepare_out_dir(train, False, proc) and 0, train))
except ValueError as e:
    sys.exit(f"error: {e}")
"""


def test_every_rank_stops_when_rank_0_cannot_take_the_folder(tmp_path):
    """Two gloo processes (as torchrun starts them) into a folder another run holds: rank 0 is refused, and rank 1
    stops too, each with one line, instead of waiting for rank 0 at the next collective."""
    import socket
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    owner = subprocess.Popen(["sleep", "120"])
    (tmp_path / "run").mkdir()
    (tmp_path / "run" / ".lock").write_text(f"{owner.pid}\n")
    env = lambda r: os.environ | dict(WORLD_SIZE="2", RANK=str(r), LOCAL_RANK=str(r), MASTER_ADDR="127.0.0.1",
                                      MASTER_PORT=str(port), OMP_NUM_THREADS="1", PYTHONPATH=ROOT)
    ranks = [subprocess.Popen([sys.executable, "-c", RANK, str(tmp_path / "run")], env=env(r), cwd=ROOT,
                              stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True) for r in (0, 1)]
    try:
        errs = [p.communicate(timeout=90)[1] for p in ranks]
    finally:
        for p in ranks + [owner]:
            p.kill()
            p.wait()
    assert [p.returncode for p in ranks] == [1, 1] and all(len(e.strip().splitlines()) == 1 for e in errs), errs
    assert f"in use by another run (pid {owner.pid}" in errs[0] and "rank 1 stops" in errs[1]
    assert os.listdir(tmp_path / "run") == [".lock"]


@pytest.mark.parametrize("key", ["optimizer", "gen_state"])
def test_a_checkpoint_without_its_training_state_is_a_one_line_error(tmp_path, capsys, key):
    assert run_main(TINY + ["--max_iters", "2", "--eval_interval", "2", "--out_dir", str(tmp_path)]) == 0
    state = torch.load(tmp_path / "ckpt.pt", weights_only=True)
    del state[key]
    torch.save(state, tmp_path / "ckpt.pt")
    capsys.readouterr()
    assert run_main(["--task", "bijection", "--resume", "--max_iters", "4", "--out_dir", str(tmp_path)]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and f"ckpt.pt has no {key}: train.py cannot resume it" in err, err
    assert json.load(open(tmp_path / "results.json"))["iters"] == 2


@pytest.mark.parametrize("error", [torch.OutOfMemoryError("CUDA out of memory. Tried to allocate 2.00 GiB"),
                                   RuntimeError("MPS backend out of memory (MPS allocated: 15.00 GB)")])
def test_out_of_memory_at_the_first_evaluation_keeps_a_checkpoint_and_names_the_flag(tmp_path, monkeypatch, capsys,
                                                                                      error):
    real = train.build

    def build(run, device):  # a model whose evaluation (no gradients) runs out of memory
        model, opt = real(run, device)
        forward = model.forward
        model.forward = lambda x: forward(x) if torch.is_grad_enabled() else (_ for _ in ()).throw(error)
        return model, opt

    monkeypatch.setattr(train, "build", build)
    argv = TINY + ["--max_iters", "4", "--eval_interval", "2", "--out_dir", str(tmp_path)]
    assert run_main(argv) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1, err
    assert err == (f"train.py: error: out of memory at evaluation (try a smaller --eval_batch_size; it was 250) at "
                   f"step 2; kept {tmp_path / 'ckpt.pt'} (step 2)")
    assert torch.load(tmp_path / "ckpt.pt", weights_only=True)["iter"] == 2
    monkeypatch.setattr(train, "build", real)  # with the memory to evaluate, it resumes from there
    assert run_main(["--resume", "--out_dir", str(tmp_path), "--eval_batch_size", "4"]) == 0
    r = json.load(open(tmp_path / "results.json"))
    assert r["iters"] == 4 and [h["iter"] for h in r["history"]] == [4]



def ctrl_c_as_in_a_terminal():
    """SIGINT's default action in the child, as a terminal gives it: a test run started in the background (`cmd &`)
    ignores SIGINT, which the child, and so Python's KeyboardInterrupt, would inherit."""
    signal.signal(signal.SIGINT, signal.SIG_DFL)


def test_a_c_or_latin_1_locale_gets_no_traceback(tmp_path):
    """"−" and "—" on a stdout that cannot encode them come out escaped; the tables are written in UTF-8."""
    env = os.environ | {"LC_ALL": "C", "PYTHONUTF8": "0", "OMP_NUM_THREADS": "1"}
    say = "import commandline; commandline.cli(lambda: print('0.5 \\u2212 1 \\u2014 ok') or 0, 'x', '')"
    for codec in ("ascii", "latin-1"):
        p = subprocess.run([sys.executable, "-c", say], cwd=ROOT, capture_output=True, env=env | {
            "PYTHONIOENCODING": codec})
        assert (p.returncode, p.stdout, p.stderr) == (0, b"0.5 \\u2212 1 \\u2014 ok\n", b"")
    p = subprocess.run([sys.executable, "reproduce.py", "--preset", "tiny", "--tasks", "recall", "--models",
                        "transformer", "--out", str(tmp_path / "out"), "--results", str(tmp_path / "r")], cwd=ROOT,
                       capture_output=True, text=True, env=env)
    assert p.returncode == 0 and p.stderr == "", p.stderr
    assert "−" in (tmp_path / "r" / "table.md").read_text(encoding="utf-8")
