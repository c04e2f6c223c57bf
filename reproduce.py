"""
The paper's architecture comparison: every task x model, one train.py run per cell, one table.

    python reproduce.py                                # the quick preset, every task and model
    python reproduce.py --results results              # the same, and update the committed table
    python reproduce.py --preset paper                 # the paper's sizes; with GPUs, one cell per GPU
    python reproduce.py --tasks hmm --models lstm,mlp  # a part of the matrix
    python reproduce.py --table_only                   # rebuild the table from the finished cells
    python reproduce.py -- --device cpu                # anything after -- goes to every train.py run
    python reproduce.py time_to_target --recipe preset # per task: steps, sequences and time to the paper's level

A cell is `train.py --task T --model M --preset P --out_dir out/reproduce/P/T_M`; its console
output goes to train.log beside results.json. A cell with a results.json is finished and
skipped, and one with only a ckpt.pt is resumed from it, so an interrupted sweep picks up
where it stopped. The cells run one after another in this process (run_in_process, its output to the
cell's log, which conditioning.py's depth_width uses too), or one per GPU (run_cells);
their sizes come from the presets (cell_argv); the MLP has two rows (row_models).

Output: table.md beside the cells (out/reproduce/P; --results DIR elsewhere) and a figure per task
(write_table). Only `--results results` writes the committed results/, so a partial sweep never
replaces that table. `time_to_target` is time_to_target.py's program, dispatched from here (main).
"""
from contextlib import redirect_stderr, redirect_stdout
from dataclasses import fields
import io
import json
import os
import signal
import subprocess
import sys
import time
import traceback

if __name__ == "__main__":  # Ctrl-C or SIGTERM while torch loads: one line and exit code 2, as runtime.cli later
    stop = lambda *_: os._exit(sys.stderr.write("reproduce.py: error: interrupted; nothing was written\n") and 2)
    signal.signal(signal.SIGINT, stop), signal.signal(signal.SIGTERM, stop)

import torch

import checkpoints
import presets
import runtime
from tasks import make_task
from time_to_target import time_to_target
import train

HERE = os.path.dirname(os.path.abspath(__file__))
TASK_ORDER = ("bijection", "hmm", "regression", "recall")  # the default matrix: the wind tunnels
MODEL_ORDER = ("transformer", "mamba", "lstm", "mlp", "mlp_pos", "linear_attn")  # those train.py has
VARIANTS = {"mlp_pos": "mlp"}  # row: the train.py model it runs, with the row's preset entry as flags

# the paper's numbers (v3 architecture table unless noted); MAE in bits, recall as accuracy
PAPER = {
    "bijection": dict(transformer="0.007", mamba="0.010", lstm="0.009", mlp="≈1.85", mlp_pos="≈1.85"),
    "hmm": dict(transformer="0.049", mamba="0.024", lstm="0.411", mlp="≈0.409", mlp_pos="≈0.409"),
    "recall": dict(transformer="acc. 100%", mamba="acc. 97.8%", lstm="acc. 0.5%"),
}
PAPER_NOTES = """Paper numbers (second-hand transcriptions of arXiv 2512.22471) are the v3 architecture table \
unless noted.
Bijection: the authors' evaluation averages over sequences first (our mean-curve convention); the v1 transformer
figure is 3e-3 and the MLP's ≈1.85 is from v1. HMM: the v3 table (0.049 for the transformer, against 7.5e-5 in v1,
an unresolved discrepancy); the authors' HMM scripts score per token; the transformer's K=50 figure is 0.029.
Recall: accuracy; the LSTM's 0.5% is chance. Regression is not in the paper. The paper's MLP figures stand beside
both MLP rows: which of the two readings it ran is not stated."""

def row_models():
    """The table's rows that can run: train.py's models, and the variants of them. The MLP has two rows, since the
    paper does not say how its MLP saw the context: `mlp` sees the flattened causal prefix, `mlp_pos` (train.py
    `--model mlp --per_position`, with its own capacity-matched widths, presets.py) only the current token and
    its position."""
    return [m for m in MODEL_ORDER if VARIANTS.get(m, m) in presets.MODELS] + \
           [m for m in presets.MODELS if m not in MODEL_ORDER]


def cell_argv(task, model, preset, out_dir, extra):
    """The train.py command line of one cell. Model sizes come from presets.py's PRESETS (the quick preset's LSTM
    and MLP are matched to within 1% of its transformer's parameters; in the paper preset the MLP is matched, the
    LSTM is the authors' unmatched one). `tiny` runs the quick cells for a few steps at toy sizes, for tests."""
    base, opts = VARIANTS.get(model, model), {}
    if model in VARIANTS:  # e.g. mlp_pos: the mlp with its own options and widths
        opts = presets.PRESETS["quick" if preset == "tiny" else preset][task][model]
    argv = ["--task", task, "--model", base, "--preset", "quick" if preset == "tiny" else preset]
    if preset == "tiny":  # the quick cell, shrunk (presets.py)
        tiny, names = presets.TINY[task], {f.name for f in fields(presets.resolve_model(base)[0])}
        opts = opts | {k: v for k, v in tiny["model"].items() if k in names}
        argv += flags(tiny["train"] | tiny["task"])
    return argv + flags(opts) + ["--out_dir", out_dir] + extra


def refusal(task, model):
    """Why a row's model cannot take the task's inputs or give its outputs (presets.fill_io's line), or None: such a
    cell is n/a, and is not run. Their kind (tokens or reals, classes or a Gaussian) is the same at any options."""
    try:
        presets.fill_io(VARIANTS.get(model, model), make_task(task), {})
    except ValueError as e:
        return str(e)


def cell_dir(out_root, task, model):
    return os.path.join(out_root, f"{task}_{presets.model_name(model)}")


def flags(opts):
    """{"K": 4, "eval_K": [6]} -> ["--K", "4", "--eval_K", "6"]"""
    return [a for k, v in opts.items() for a in (f"--{k}", *map(str, v if isinstance(v, list) else [v]))]


def cell_config(argv):
    """The config train.py would run a cell's argv with, each value checked (presets.check_train) before any
    cell runs: a bad value after `--` stops the sweep at once, not once in every cell's log."""
    known, given, _ = presets.parse_args(argv)
    cfg = presets.build_config(known.task, known.model, known.preset, given)
    with redirect_stderr(io.StringIO()):  # a curriculum's note: the cell's own run says it, in its log
        presets.check_train(cfg["train"])
    return json.loads(json.dumps(cfg))  # as results.json holds it: lists, not tuples


def other_run(r, cfg):
    """Why a cell's results.json (r) is not the run its command line (cfg) asks for, or None: another task's or
    model's run, or one whose settings differ beyond where and how it ran (a flag after `--` changed since)."""
    run = (r["config"] if isinstance(r.get("config"), dict) else {}) | dict(task=r.get("task"), model=r.get("model"))
    differs = checkpoints.setting_differs(run, cfg)
    if differs and differs[0] in ("task", "model"):
        return f"a {r.get('task')} x {r.get('model')} run"
    return differs and f"a run with {differs[0]} {differs[1]} (the command line gives {differs[2]})"


def load_results(out_dir):
    """A cell's results.json; None where it is missing, corrupt or lacks its metrics (an unfinished cell)."""
    try:
        with open(os.path.join(out_dir, "results.json"), encoding="utf-8") as f:
            r = json.load(f)
    except (OSError, ValueError):
        return None
    ok = isinstance(r, dict) and isinstance(r.get("metrics"), dict) and isinstance(r["metrics"].get("default"), dict)
    return r if ok else None


def log_error(log):
    """The line of a run's log that says why it stopped: its last "error:" line, else its last line."""
    try:
        with open(log, encoding="utf-8", errors="replace") as f:
            lines = [line.strip() for line in f if line.strip()]
    except OSError:
        return f"{log} cannot be read"
    return next((line for line in reversed(lines) if ": error: " in line), lines[-1] if lines else "its log is empty")


def run_in_process(main, argv, log, mode="a", contain=True):
    """main(argv), a script's (train.main), in this process with its output to the file log (mode "a" adds to it,
    "w" starts it afresh); returns its exit code. contain: a crash is its traceback in the log and exit code 1, and
    an argument error's SystemExit its code, so that a sweep goes on (reproduce.py); else both reach the caller."""
    with open(log, mode, buffering=1, encoding="utf-8") as f, redirect_stdout(f), redirect_stderr(f):
        if not contain:
            return main(argv)
        try:
            return main(argv)
        except SystemExit as e:
            return e.code
        except Exception:  # a crashed cell must not stop the sweep
            traceback.print_exc()
            return 1


def note_command(log, argv):
    with open(log, "a", encoding="utf-8") as f:
        f.write(f"=== {time.strftime('%Y-%m-%d %H:%M:%S')} train.py {' '.join(argv)}\n")


def visible_gpus(n_gpus):
    """The names of this process's n_gpus GPUs for a child's CUDA_VISIBLE_DEVICES: those of an inherited
    CUDA_VISIBLE_DEVICES (indices or UUIDs), else 0..n_gpus-1."""
    inherited = [g.strip() for g in os.environ.get("CUDA_VISIBLE_DEVICES", "").split(",") if g.strip()]
    return inherited[:n_gpus] if len(inherited) >= n_gpus else [str(i) for i in range(n_gpus)]


def claim(label, log):
    """The lock of the cell's folder, taken before its log is written to (train.py, started by this process, takes
    it over), or None, said in one line, where another run holds the folder: that run's log is left alone."""
    try:
        return checkpoints.lock_out_dir(os.path.dirname(log))
    except ValueError as e:
        print(f"{label[0]} x {label[1]}: not run: {e}", flush=True)
        return None


def run_cells(todo, jobs, n_gpus):
    """Run (label, argv, log) cells, `jobs` at a time; yields (label, exit code, seconds) as they end (exit code
    None at once for a cell whose folder another run holds). With one job (the default without GPUs, or with one)
    the cells run one after another in this process; with several (default: one per visible GPU) each runs as a
    subprocess that sees one GPU (CUDA_VISIBLE_DEVICES: one of those this process was given, an inherited
    CUDA_VISIBLE_DEVICES respected)."""
    if jobs == 1:
        for label, argv, log in todo:
            lock = claim(label, log)
            if lock is None:
                yield label, None, 0.0
                continue
            print(f"{label[0]} x {label[1]}: running, log {log}", flush=True)
            note_command(log, argv)
            t0 = time.time()
            try:
                rc = run_in_process(train.main, argv, log)  # a crash is a failed cell
            finally:
                checkpoints.unlock_out_dir(lock)  # train.py's by now, and released: nothing left to do
            yield label, rc, time.time() - t0
        return
    queue, running, gpus = list(todo), {}, visible_gpus(n_gpus)  # slot -> (label, process, log file, start)
    locks = {}  # slot -> the lock taken for its cell
    try:
        while queue or running:
            for slot in range(jobs):
                if slot not in running and queue:
                    label, argv, log = queue.pop(0)
                    locks[slot] = claim(label, log)
                    if locks[slot] is None:
                        yield label, None, 0.0
                        continue
                    env, where = dict(os.environ), ""
                    if n_gpus:
                        env["CUDA_VISIBLE_DEVICES"] = gpus[slot % n_gpus]
                        where = f" on GPU {gpus[slot % n_gpus]}"
                    note_command(log, argv)
                    f = open(log, "a", encoding="utf-8")
                    p = subprocess.Popen([sys.executable, os.path.join(HERE, "train.py"), *argv],
                                         stdout=f, stderr=subprocess.STDOUT, env=env)
                    running[slot] = (label, p, f, time.time())
                    print(f"{label[0]} x {label[1]}: started{where}, log {log}", flush=True)
            time.sleep(0.2)
            for slot, (label, p, f, t0) in list(running.items()):
                if p.poll() is not None:
                    f.close()
                    del running[slot]
                    checkpoints.unlock_out_dir(locks.pop(slot))  # still this process's if train.py never took it
                    yield label, p.returncode, time.time() - t0
    finally:  # interrupted (or the caller stopped): the cells still training stop too, and are waited for
        stop(running.values())
        for lock in locks.values():
            if lock:
                checkpoints.unlock_out_dir(lock)


def stop(running, grace=60):
    """Ctrl-C to each (label, process, log file, start), as a terminal's would: each saves what it has and exits;
    one that is still running after `grace` seconds is killed. None is left behind training."""
    for _, p, _, _ in running:
        if p.poll() is None:
            p.send_signal(signal.SIGINT)
    for _, p, f, _ in running:
        try:
            p.wait(timeout=grace)
        except subprocess.TimeoutExpired:
            p.kill()
            p.wait()
        f.close()

# -----------------------------------------------------------------------------
# the table and the figures


def fmt(x):
    return f"{x:.4f}"


def fmt_acc(m):
    return f"{100 * m['accuracy']:.2f}% ({100 * m['oracle_accuracy']:.2f}%)" if "accuracy" in m else "—"


def figure(task, rows, path):
    """Per-position model entropy of every model against the oracle's; False without matplotlib."""
    plt = runtime.pyplot()
    if plt is None:
        return False
    fig, ax = plt.subplots(figsize=(6, 4))
    oracle = None
    for model, r in rows:
        m = r["metrics"]["default"]
        pos = range(1, len(m["curve_model"]) + 1)
        ax.plot(pos, m["curve_model"], marker=".", label=f"{model} (mean-curve MAE {m['mae_curve']:.3g})")
        oracle = oracle or (pos, m["curve_oracle"])
    ax.plot(*oracle, "k--", label="Bayes oracle")
    ax.set(xlabel="query position", ylabel="mean entropy (bits)", title=f"{task}: model vs exact posterior entropy")
    ax.legend(fontsize=8)
    fig.tight_layout()
    checkpoints.write_file(path, lambda tmp: fig.savefig(tmp, dpi=120, format="png"))
    plt.close(fig)
    return True


def steps(r):
    """A cell's steps, saying so where its stop rule ended it before its schedule (a cell is a full schedule or
    labelled as stopped)."""
    train = r.get("config", {}).get("train", {})
    stopped = train.get("stop_at") and r["iters"] < train.get("max_iters", r["iters"])
    return f"{r['iters']} (stopped at {train['stop_at']})" if stopped else str(r["iters"])


def write_table(preset, tasks, models, out_root, results_dir, status, notes=()):
    """results_dir/table.md from every cell's results.json; returns its path. Per task, each model's entropy MAE
    in both conventions, KL, accuracy, parameters and training time beside the paper's numbers, and a figure of
    per-position model entropy against the oracle's for every model (entropy_<task>.png; needs matplotlib,
    without it the table still comes out). notes: lines for the Notes, e.g. why a cell is n/a."""
    lines = [f"# Wind tunnels: architecture comparison, preset `{preset}`", "",
             "Entropy MAE in bits: *mean-curve* averages model and oracle entropy over sequences at each position "
             "first (the paper's convention), *per token* is the mean of |H_model − H_oracle| over every scored "
             "position (stricter). KL(oracle ‖ model) in bits per scored position. Accuracy: argmax against the "
             "true answer (hmm: the hidden state), the Bayes decision's in brackets. Time: training wall time. "
             f"Each cell is `{os.path.join(out_root, '<task>_<model>')}`.", "",
             "Two readings of the paper's MLP: `mlp` sees the flattened causal prefix (each earlier token in its own "
             "input slot), `mlp_pos` only the current token and its position.", ""]
    if preset != "paper":
        lines += [f"The `{preset}` preset's models and schedules are far smaller than the paper's (and its recall "
                  "task is shrunk): compare the ordering of the architectures with the paper's, not the digits.", ""]
    for task in tasks:
        lines += [f"## {task}", "",
                  "| model | params | MAE mean-curve | MAE per token | paper | KL | accuracy (Bayes) "
                  "| other lengths, MAE per token | steps | time | device |", "|---" * 11 + "|"]
        rows = []
        for model in models:
            held = status.get((task, model), "").startswith("holds")  # another run's results: not this cell's
            r = None if held else load_results(cell_dir(out_root, task, model))
            paper = PAPER.get(task, {}).get(model, "—")
            name = presets.model_name(model)  # a model from a file: its class
            if r is None:
                lines.append(f"| {name} | {status.get((task, model), 'not run')} |" + " |" * 9)
                continue
            rows.append((name, r))
            m = r["metrics"]["default"]
            other = ", ".join(f"{k}: {fmt(v['mae_token'])}" for k, v in r["metrics"].items() if k != "default")
            lines.append(f"| {name} | {r['n_params']:,} | {fmt(m['mae_curve'])} | {fmt(m['mae_token'])} | {paper} "
                         f"| {fmt(m['kl'])} | {fmt_acc(m)} | {other or '—'} | {steps(r)} "
                         f"| {runtime.fmt_time(r['wall_time_s'])} | {r['device']} |")
        slots = [(model, r["metrics"]["default"]["accuracy_by_slot"]) for model, r in rows
                 if "accuracy_by_slot" in r["metrics"]["default"]]
        if slots:  # recall: is a miss a pair stored early (forgotten) or any pair (never bound)?
            n = len(slots[0][1])
            lines += ["", "Accuracy by the queried pair's place in the store (1 = stored first):", "",
                      "| model | " + " | ".join(str(i + 1) for i in range(n)) + " |", "|---" * (n + 1) + "|"]
            lines += [f"| {model} | " + " | ".join(f"{a:.2f}" for a in acc) + " |" for model, acc in slots]
        if rows and figure(task, rows, os.path.join(results_dir, f"entropy_{task}.png")):
            lines += ["", f"![{task}: per-position entropy](entropy_{task}.png)"]
        lines.append("")
    lines += ["## Notes", "", PAPER_NOTES, ""] + ([*notes, ""] if notes else [])
    path = os.path.join(results_dir, "table.md")
    checkpoints.write_text(path, "\n".join(lines))
    return path

# -----------------------------------------------------------------------------
# the command line


def parse_args(argv):
    extra = argv[argv.index("--") + 1:] if "--" in argv else []
    argv = argv[:argv.index("--")] if "--" in argv else argv
    names = [*presets.PRESETS, "tiny"]
    p = presets.Parser(prog="reproduce.py", description=__doc__.split("\n\n")[0].strip(), allow_abbrev=False,
                       epilog="`reproduce.py time_to_target --help`: the steps and time to the paper's level")
    p.add_argument("--preset", default="quick", help=f"{' | '.join(names)} (default quick)")
    p.add_argument("--tasks", default=None, help=f"comma-separated tasks (default {','.join(TASK_ORDER)})")
    p.add_argument("--models", default=None, help="comma-separated models (default: those of "
                                                  f"{', '.join(MODEL_ORDER)} that train.py has; "
                                                  "mlp_pos is the mlp with --per_position), or a model from a "
                                                  "file, PATH.py:Class, or a module, module:Class")
    p.add_argument("--out", default=os.path.join("out", "reproduce"), help="cells go to OUT/<preset>/<task>_<model>")
    p.add_argument("--results", default=None, help="where table.md and the figures go (default OUT/<preset>; "
                                                   "`--results results` updates the committed table)")
    p.add_argument("--jobs", type=int, default=0, help="cells at a time (default: one per visible GPU, else 1)")
    p.add_argument("--table_only", action="store_true", help="only rebuild the table from finished cells")
    args = p.parse_args(argv)
    if args.preset not in names:
        p.error(f"unknown preset {args.preset!r}; valid presets: {', '.join(names)}")
    base = presets.PRESETS["quick" if args.preset == "tiny" else args.preset]
    valid_tasks = [t for t in presets.TASKS if t in base]  # a cell needs the task's preset entry
    args.tasks = args.tasks or ",".join(t for t in TASK_ORDER if t in valid_tasks)
    args.models = args.models or ",".join(m for m in MODEL_ORDER if m in row_models())
    for kind, given, valid in (("task", args.tasks, valid_tasks), ("model", args.models, row_models())):
        bad = [x for x in given.split(",") if x not in valid and (kind == "task" or ":" not in x)]
        if bad:
            p.error(f"unknown {kind} {bad[0]!r}; valid {kind}s: {', '.join(valid)}"
                    + (", or PATH.py:Class or module:Class" if kind == "model" else ""))
    try:  # a model from a file: found now, its path made absolute (presets.model_spec)
        args.models = ",".join(presets.model_spec(m) if ":" in m else m for m in args.models.split(","))
    except ValueError as e:
        p.error(f"--models {e}")
    if args.jobs < 0:
        p.error(f"--jobs must be >= 0, got {args.jobs}")
    per_cell = ("--task", "--model", "--preset", "--out_dir", "--resume", "--eval_only")
    fixed = [a for a in extra if a.split("=")[0] in per_cell]
    if fixed:
        p.error(f"{fixed[0].split('=')[0]} is set per cell; use --tasks, --models, --preset or --out instead")
    args.tasks, args.models = args.tasks.split(","), args.models.split(",")
    args.results = args.results or os.path.join(args.out, args.preset)
    return args, extra


def main(argv=None):
    argv = sys.argv[1:] if argv is None else argv
    ttt = argv[:1] == ["time_to_target"]
    try:
        if ttt:
            return time_to_target(argv[1:])
        args, extra = parse_args(argv)
        return sweep(args, extra)
    except OSError as e:  # a full or read-only disk: every file is written whole or not at all (checkpoints.write_file)
        kept = "the runs keep their checkpoints" if ttt else "finished cells"
        print(f"reproduce.py: error: {f'{e.filename}: {e.strerror}' if e.filename else e}; {kept} and the "
              f"files written before are kept", file=sys.stderr)
        return 1


def sweep(args, extra):
    """The cells still to run, then the table."""
    out_root = os.path.join(args.out, args.preset)
    cells = [(t, m) for t in args.tasks for m in args.models]
    n_gpus = torch.cuda.device_count() if args.preset != "tiny" else 0
    jobs = args.jobs or max(n_gpus, 1)
    todo, status = [], {}
    notes = []  # why each n/a cell is
    try:  # before any cell runs: a bad flag or value in `extra` (presets.parse_args: its own one line, exit 2)
        for task, model in cells:
            out_dir = cell_dir(out_root, task, model)
            argv = cell_argv(task, model, args.preset, out_dir, extra)
            why = refusal(task, model)
            if why:  # e.g. a model with token inputs only, on regression
                status[(task, model)] = "n/a"
                notes.append(f"{task} x {presets.model_name(model)}: n/a, {why}.")
                continue
            cfg, r = cell_config(argv), load_results(out_dir)
            other = r and other_run(r, cfg)
            if other and not args.table_only:
                raise ValueError(f"{out_dir} holds {other}: pass another --out for this command line, or move "
                                 f"that folder away to run the cell again")
            elif other:
                status[(task, model)] = f"holds {other}"
            elif r is not None:
                status[(task, model)] = "finished before"
            elif not args.table_only:
                resume = ["--resume"] if os.path.exists(os.path.join(out_dir, "ckpt.pt")) else []
                todo.append(((task, model), argv + resume, os.path.join(out_dir, "train.log")))
            elif os.path.exists(os.path.join(out_dir, "results.json")):
                status[(task, model)] = "results.json unreadable or unfinished"
        for flag, path in (("--out", out_root), ("--results", args.results)):
            checkpoints.check_out_dir(path, flag)
    except ValueError as e:
        print(f"reproduce.py: error: {e}", file=sys.stderr)
        return 2
    n_done = len(cells) - len(todo) - len(notes)
    if not args.table_only:
        print(f"{len(cells)} cells, preset {args.preset}: {n_done} finished before (skipped), {len(todo)} to run, "
              f"{f'{len(notes)} n/a, ' if notes else ''}{jobs} at a time{f' on {n_gpus} GPUs' if n_gpus else ''}")
    for note in notes:
        print(note)
    for _, _, log in todo:
        os.makedirs(os.path.dirname(log), exist_ok=True)
    cells_run = run_cells(todo, jobs, n_gpus)
    try:
        for i, ((task, model), rc, secs) in enumerate(cells_run, 1):
            out_dir = cell_dir(out_root, task, model)
            r = load_results(out_dir)
            if rc == 0 and r is not None:
                status[(task, model)] = "finished"
                m = r["metrics"]["default"]
                print(f"[{i}/{len(todo)}] {task} x {model}: done in {runtime.fmt_time(secs)} | {train.summary(m)}")
            elif rc is None:  # its folder is another run's (said when it was to start)
                status[(task, model)] = "failed: its folder is in use by another run"
                print(f"[{i}/{len(todo)}] {task} x {model}: FAILED: its folder is in use by another run")
            else:
                status[(task, model)] = f"failed (exit {rc}), see train.log"
                log = os.path.join(out_dir, "train.log")
                print(f"[{i}/{len(todo)}] {task} x {model}: FAILED (exit {rc}): {log_error(log)}; see {log}",
                      file=sys.stderr)
    finally:
        cells_run.close()  # an interrupt stops the running cells and waits for them
    path = write_table(args.preset, args.tasks, args.models, out_root, args.results, status, notes)
    failed = [c for c, s in status.items() if s.startswith("failed")]
    print(f"wrote {path}" + (f" | {len(failed)} cells failed" if failed else ""))
    return 1 if failed else 0


if __name__ == "__main__":
    runtime.cli(main, "reproduce.py", "each run keeps its last checkpoint" if sys.argv[1:2] == ["time_to_target"]
                else "finished cells are kept and a rerun resumes the others")
