"""
The paper's architecture comparison: every task x model, one train.py run per cell, one table.

    python reproduce.py                                # the quick preset, every task and model
    python reproduce.py --results results              # the same, and update the committed table
    python reproduce.py --plan                         # each cell's steps and projected time; nothing trained
    python reproduce.py --preset paper                 # the paper's sizes; with GPUs, one cell per GPU
    python reproduce.py --tasks hmm --models lstm,mlp  # a part of the matrix
    python reproduce.py --table_only                   # rebuild the table from the finished cells
    python reproduce.py -- --max_iters 50              # flags after -- go to every cell, in quick+max_iters=50/
    python reproduce.py time_to_target --recipe preset # per task: steps, sequences and time to the paper's level

A cell is `train.py --task T --model M --preset P --out_dir OUT/B/T_M`, B the preset and the flags after `--`
(budget); its console output goes to train.log beside results.json. A cell with a results.json is finished and
skipped, and one with only a ckpt.pt is resumed from it, so an interrupted sweep picks up where it stopped; a
second sweep into OUT/B is refused while one runs (claim_sweep). The cells run one after another in this process
(commandline.run_in_process, its output to the cell's log), or several at once, one per GPU or per CPU core
(run_cells); their sizes and stop rules come from the presets (cell_argv); the MLP has two rows (row_models).
`--plan` times a few steps of each (time_to_target.plan).

Output: table.md beside the cells (OUT/B; --results DIR elsewhere), headed by the sweep's command, machine and wall
time (sweep.json), and a figure per task (time_to_target.write_table). Only `--results results` writes the
committed results/, and a table of fewer finished cells goes beside the one there (table.new.md).
`time_to_target` is time_to_target.py's program, dispatched from here (main).
"""
import json
import os
import re
import shlex
import signal
import subprocess
import sys
import time

if __name__ == "__main__":
    from commandline import before_torch
    before_torch("reproduce.py")

import torch

import checkpoints
from commandline import Parser, cli, is_spec, log_error, run_in_process
import evaluation
from hardware import describe, machine
import presets
import runtime
import settings
from tasks import TASKS, make_task
from time_to_target import cell_dir, finished_rows, load_results, plan, time_to_target, write_table
import train

HERE = os.path.dirname(os.path.abspath(__file__))
TASK_ORDER = ("bijection", "hmm", "regression", "recall")  # the default matrix: the paper's wind tunnels
MODEL_ORDER = ("transformer", "mamba", "lstm", "mlp", "mlp_pos", "linear_attn")  # those train.py has
VARIANTS = {"mlp_pos": "mlp"}  # row: the train.py model it runs, with the row's preset entry as flags

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
    LSTM is the authors' unmatched one); a variant row (mlp_pos) passes its preset entry as flags."""
    entry = presets.PRESETS[preset].get(task, presets.PRESETS[preset].get("any task", {}))
    opts = dict(entry.get(model, {})) if model in VARIANTS else {}
    opts |= opts.pop("train", {})
    return ["--task", task, "--model", VARIANTS.get(model, model), "--preset", preset, *flags(opts),
            "--out_dir", out_dir, *extra]


def refusal(task, model):
    """Why a row's model cannot take the task's inputs or give its outputs (presets.fill_io's line), or None: such a
    cell is n/a, and is not run. Their kind (tokens or reals, classes or a Gaussian) is the same at any options."""
    try:
        presets.fill_io(VARIANTS.get(model, model), make_task(task), {})
    except ValueError as e:
        return str(e)


def flags(opts):
    """{"K": 4, "eval_K": [6]} -> ["--K", "4", "--eval_K", "6"]"""
    return [a for k, v in opts.items() for a in (f"--{k}", *map(str, v if isinstance(v, list) else [v]))]


def cell_run(argv):
    """The run train.py would run a cell's argv as, each value checked (settings.check_train) before any cell
    runs: a bad value after `--` stops the sweep at once, not once in every cell's log."""
    known, given, _ = settings.parse_args(argv)
    return settings.resolve(known, given)


def recorded(run):
    return json.loads(json.dumps(run.record))  # as results.json holds it: lists, not tuples


def other_run(r, cfg):
    """Why a cell's results.json (r) is not the run its command line (cfg) asks for, or None: another task's or
    model's run, or one whose settings differ beyond where and how it ran (a flag after `--` changed since)."""
    run = (r["config"] if isinstance(r.get("config"), dict) else {}) | dict(task=r.get("task"), model=r.get("model"))
    differs = checkpoints.setting_differs(run, cfg)
    if differs and differs[0] in ("task", "model"):
        return f"a {r.get('task')} x {r.get('model')} run"
    return differs and f"a run with {differs[0]} {differs[1]} (the command line gives {differs[2]})"


def note_command(log, argv):
    with open(log, "a", encoding="utf-8") as f:
        f.write(f"=== {time.strftime('%Y-%m-%d %H:%M:%S')} train.py {' '.join(argv)}\n")


def cores():  # the CPU cores this process may use
    return len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count() or 1


def threads(jobs):
    """CPU threads of each of `jobs` cells at once: the cores shared out (OMP_NUM_THREADS, if set, is each cell's).
    On 2 cores, two quick cells on one thread each ran 4-11% slower each than alone, where one cell on 2 threads
    ran 1.6-1.8x faster than on one: two at a time does more (results/sweep.md)."""
    return int(os.environ.get("OMP_NUM_THREADS", "0").split(",")[0] or 0) or max(1, cores() // jobs)


def visible_gpus(n_gpus):
    """The names of this process's n_gpus GPUs for a child's CUDA_VISIBLE_DEVICES: those of an inherited
    CUDA_VISIBLE_DEVICES (indices or UUIDs), else 0..n_gpus-1."""
    inherited = [g.strip() for g in os.environ.get("CUDA_VISIBLE_DEVICES", "").split(",") if g.strip()]
    return inherited[:n_gpus] if len(inherited) >= n_gpus else [str(i) for i in range(n_gpus)]


def cell_name(label):  # (task, model) -> "hmm x mamba", a file's task and model by their names
    return f"{presets.task_name(label[0])} x {presets.model_name(label[1])}"


def claim(label, log):
    """The lock of the cell's folder, taken before its log is written to (train.py, started by this process, takes
    it over), or None, said in one line, where another run holds the folder: that run's log is left alone."""
    try:
        return checkpoints.lock_out_dir(os.path.dirname(log))
    except ValueError as e:
        print(f"{cell_name(label)}: not run: {e}", flush=True)
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
            print(f"{cell_name(label)}: running, log {log}", flush=True)
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
                    if not n_gpus:  # the CPU's cores shared out: one thread each on 2 cores at 2 at a time
                        env.setdefault("OMP_NUM_THREADS", str(threads(jobs)))
                    if n_gpus:
                        env["CUDA_VISIBLE_DEVICES"] = gpus[slot % n_gpus]
                        where = f" on GPU {gpus[slot % n_gpus]}"
                    note_command(log, argv)
                    f = open(log, "a", encoding="utf-8")
                    p = subprocess.Popen([sys.executable, os.path.join(HERE, "train.py"), *argv],
                                         stdout=f, stderr=subprocess.STDOUT, env=env)
                    running[slot] = (label, p, f, time.time())
                    print(f"{cell_name(label)}: started{where}, log {log}", flush=True)
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
# the command line


def parse_args(argv):
    extra = argv[argv.index("--") + 1:] if "--" in argv else []
    argv = argv[:argv.index("--")] if "--" in argv else argv
    names = list(presets.PRESETS)
    p = Parser(prog="reproduce.py", description=__doc__.split("\n\n")[0].strip(), allow_abbrev=False,
               epilog="`reproduce.py time_to_target --help`: the steps and time to the paper's level")
    p.add_argument("--preset", default="quick", help=f"{' | '.join(names)} (default quick)")
    p.add_argument("--tasks", default=None, help=f"comma-separated tasks: {', '.join(TASKS)}, or a task from a file, "
                                                 f"PATH.py:Class, or a module, module:Class (default "
                                                 f"{','.join(TASK_ORDER)})")
    p.add_argument("--models", default=None, help="comma-separated models (default: those of "
                                                  f"{', '.join(MODEL_ORDER)} that train.py has; "
                                                  "mlp_pos is the mlp with --per_position), or a model from a "
                                                  "file, PATH.py:Class, or a module, module:Class")
    p.add_argument("--out", default=os.path.join("out", "reproduce"), help="cells go to OUT/<preset>/<task>_<model> "
                   "(OUT/<preset>+<flag>=<value>/... with flags after --)")
    p.add_argument("--results", default=None, help="where table.md and the figures go (default OUT/<preset>; "
                                                   "`--results results` updates the committed table)")
    p.add_argument("--jobs", type=int, default=0, help="cells at a time (default: one per visible GPU, else one per "
                                                       "CPU core, the cores shared out among them; never more than "
                                                       "the cells to run)")
    p.add_argument("--plan", action="store_true", help="only print each cell's steps, stop rule and time on this "
                                                       "machine, projected from a few timed steps, and the total")
    p.add_argument("--commands", action="store_true", help="only print each cell still to run as one train.py "
                                                           "command line, for a scheduler of your own (a job array, "
                                                           "GNU parallel); --table_only then makes the table")
    p.add_argument("--table_only", action="store_true", help="only rebuild the table from finished cells")
    p.add_argument("--replace_table", action="store_true", help="let a table of fewer finished cells replace "
                                                                "the table.md there (else it goes beside it)")
    p.add_argument("--linked", default="", help="comma-separated sweeps under --out (e.g. quick+seed=1338, "
                                                "quick+match_params=-1) whose cells of these tasks and models the "
                                                "table sets beside this one's")
    args = p.parse_args(argv)
    if sum([args.plan, args.table_only, args.commands]) > 1:
        p.error("--plan, --commands and --table_only: give one")
    if args.preset not in names:
        p.error(f"unknown preset {args.preset!r}; valid presets: {', '.join(names)}")
    base = presets.PRESETS[args.preset]
    default = [t for t in TASK_ORDER if t in base] or [t for t in base if t != "any task"]
    args.tasks = args.tasks if args.tasks is not None else ",".join(default)
    args.models = args.models if args.models is not None else ",".join(m for m in MODEL_ORDER if m in row_models())
    for kind in ("tasks", "models"):
        given = [x.strip() for x in getattr(args, kind).split(",")]
        if not all(given):
            p.error(f"--{kind} {getattr(args, kind)!r}: an empty name; give comma-separated names")
        setattr(args, kind, list(dict.fromkeys(given)))  # a name given twice runs once
    bad = [m for m in args.models if m not in row_models() and not is_spec(m)]
    if bad:
        p.error(f"unknown model {bad[0]!r}; valid models: {', '.join(row_models())}, or PATH.py:Class or module:Class")
    where = {"task": lambda t: t if t in TASKS else settings.task_spec(t), "model": presets.model_spec}
    try:  # a task or model from a file: found now, its path made absolute
        args.tasks = [where["task"](t) for t in args.tasks]
        args.models = [m if m in row_models() else where["model"](m) for m in args.models]
    except ValueError as e:
        p.error(str(e) if str(e).startswith("unknown") else f"--tasks or --models {e}")
    if args.jobs < 0:
        p.error(f"--jobs must be >= 0, got {args.jobs}")
    per_cell = ("--task", "--model", "--preset", "--out_dir", "--resume", "--eval_only")
    fixed = [a for a in extra if a.split("=")[0] in per_cell]
    if fixed:
        p.error(f"{fixed[0].split('=')[0]} is set per cell; use --tasks, --models, --preset or --out instead")
    args.linked = [b for b in args.linked.split(",") if b]
    args.budget = budget(args.preset, extra)
    args.results = args.results or os.path.join(args.out, args.budget)
    return args, extra


def budget(preset, extra):
    """The cells' folder under --out: the preset, and each flag after `--` that changes what a cell trains, e.g.
    quick+max_iters=50 (where and how it runs, e.g. --device, leaves the name as it is)."""
    name, flag = preset, None
    for a in extra:
        if a.startswith("--"):
            flag, _, value = a[2:].partition("=")
            if flag not in checkpoints.HOW_IT_RAN:
                name += f"+{flag}" + (f"={value}" if value else "")
        elif flag is not None and flag not in checkpoints.HOW_IT_RAN:
            name += ("=" if name.endswith(f"+{flag}") else ",") + a
    return re.sub(r"[^\w.,=+-]", "_", name)


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
    out_root = os.path.join(args.out, args.budget)
    cells = [(t, m) for t in args.tasks for m in args.models]
    n_gpus = torch.cuda.device_count() if args.preset != "tiny" else 0
    todo, status = [], {}
    notes = []  # why each n/a cell is
    try:  # before any cell runs: a bad flag or value in `extra` (presets.parse_args: its own one line, exit 2)
        for task, model in cells:
            out_dir = cell_dir(out_root, task, model)
            argv = cell_argv(task, model, args.preset, out_dir, extra)
            why = refusal(task, model)
            if why:  # e.g. a model with token inputs only, on regression
                status[(task, model)] = "n/a"
                notes.append(f"{cell_name((task, model))}: n/a, {why}.")
                continue
            run, r = cell_run(argv), load_results(out_dir)
            other = r and other_run(r, recorded(run))
            if other and not args.table_only:
                raise ValueError(f"{out_dir} holds {other}: pass another --out for this command line, or move "
                                 f"that folder away to run the cell again")
            elif other:
                status[(task, model)] = f"holds {other}"
            elif r is not None:
                status[(task, model)] = "finished before"
            elif not args.table_only:
                resume = ["--resume"] if os.path.exists(os.path.join(out_dir, "ckpt.pt")) else []
                todo.append(((task, model), argv + resume, os.path.join(out_dir, "train.log"), run))
            elif os.path.exists(os.path.join(out_dir, "results.json")):
                status[(task, model)] = "results.json unreadable or unfinished"
        for flag, path in (("--out", out_root), ("--results", args.results)):
            checkpoints.check_out_dir(path, flag)
        lock = None if args.table_only or args.plan else claim_sweep(out_root)
    except ValueError as e:
        print(f"reproduce.py: error: {e}", file=sys.stderr)
        return 2
    n_done = len(cells) - len(todo) - len(notes)
    # by default one per GPU, else per core, and no more than the cells to run: a sweep of one cell runs it in this
    # process, on every core, not in a child on half of them
    jobs = args.jobs or max(1, min(n_gpus or cores(), len(todo)))
    if args.commands:  # one line a cell, as this sweep would start it (its log: the cell's train.log)
        for _, argv, log, _ in todo:
            print(f"python {os.path.join(HERE, 'train.py')} {shlex.join(argv)} >> {shlex.quote(log)} 2>&1")
        return 0
    if args.plan:
        print(f"{len(cells)} cells, preset {args.preset}: {n_done} finished before (skipped), {len(todo)} to run")
        try:  # a cell that cannot be built here (a device, its memory): its line, as its run would say it
            plan([(label, run) for label, _, _, run in todo], jobs, threads(jobs) if not n_gpus else 1)
        except ValueError as e:
            print(f"reproduce.py: error: {e}", file=sys.stderr)
            return 2
        return 0
    if args.table_only and not any(s.startswith("finished") for s in status.values()):
        print(f"reproduce.py: error: {out_root} holds no finished cell of these tasks and models: no table written "
              f"(run the sweep, or its --commands, first)", file=sys.stderr)
        return 1
    try:
        return run_sweep(args, extra, out_root, [t[:3] for t in todo], status, notes, jobs, n_gpus)
    finally:
        if lock:
            checkpoints.unlock_out_dir(lock)


def claim_sweep(out_root):
    """The lock of OUT/<preset> for this sweep's lifetime: a second sweep there is refused before it starts."""
    os.makedirs(out_root, exist_ok=True)
    try:
        return checkpoints.lock_out_dir(out_root)
    except ValueError as e:
        raise ValueError(str(e).replace("another run", "another reproduce.py sweep").replace("--out_dir", "--out"))


def run_sweep(args, extra, out_root, todo, status, notes, jobs, n_gpus):
    """Run the cells in todo, then write the table; the sweep's command, machine and wall time go to sweep.json."""
    n_cells, t0 = len(args.tasks) * len(args.models), time.time()
    n_done = n_cells - len(todo) - len(notes)
    meta = None
    if todo:
        where = (f"{n_gpus} x {torch.cuda.get_device_name(0)}" if n_gpus else describe(machine(threads(jobs))))
        meta = dict(command=" ".join(["python reproduce.py", *sys.argv[1:]]) if sys.argv[0].endswith("reproduce.py")
                    else "reproduce.main", started=time.strftime("%Y-%m-%d %H:%M %Z"), machine=where, jobs=jobs,
                    cells=[presets.run_name(t, m) for (t, m), _, _ in todo])
        checkpoints.write_json(os.path.join(out_root, "sweep.json"), meta)
    if not args.table_only:
        print(f"{n_cells} cells, preset {args.preset}: {n_done} finished before (skipped), {len(todo)} to run, "
              f"{f'{len(notes)} n/a, ' if notes else ''}{jobs} at a time{f' on {n_gpus} GPUs' if n_gpus else ''}")
    for note in notes:
        print(note)
    for _, _, log in todo:
        os.makedirs(os.path.dirname(log), exist_ok=True)
    cells_run = run_cells(todo, jobs, n_gpus)
    try:
        for i, ((task, model), rc, secs) in enumerate(cells_run, 1):
            out_dir, label = cell_dir(out_root, task, model), cell_name((task, model))
            r = load_results(out_dir)
            if rc == 0 and r is not None:
                status[(task, model)] = "finished"
                m = r["metrics"]["default"]
                print(f"[{i}/{len(todo)}] {label}: done in {runtime.fmt_time(secs)} | {evaluation.summary(m)}")
            elif rc is None:  # its folder is another run's (said when it was to start)
                status[(task, model)] = "failed: its folder is in use by another run"
                print(f"[{i}/{len(todo)}] {label}: FAILED: its folder is in use by another run")
            else:
                status[(task, model)] = f"failed (exit {rc}), see train.log"
                log = os.path.join(out_dir, "train.log")
                print(f"[{i}/{len(todo)}] {label}: FAILED (exit {rc}): {log_error(log)}; see {log}",
                      file=sys.stderr)
    finally:
        cells_run.close()  # an interrupt stops the running cells and waits for them
    if meta:
        checkpoints.write_json(os.path.join(out_root, "sweep.json"), meta | dict(wall_s=time.time() - t0))
    held = finished_rows(os.path.join(args.results, "table.md"))
    now = sum(s.startswith("finished") for s in status.values())
    file = "table.md" if now >= held or args.replace_table else "table.new.md"
    if file != "table.md":
        print(f"{os.path.join(args.results, 'table.md')} holds {held} finished cells, this table {now}: it goes "
              f"beside it, without figures (--replace_table to replace it)")
    path = write_table(args.preset, args.tasks, args.models, out_root, args.results, status, notes, file,
                       args.linked)
    beside = os.path.join(args.results, "table.new.md")
    if file == "table.md" and os.path.exists(beside):  # the table it stood beside is replaced: it goes
        os.remove(beside)
    failed = [c for c, s in status.items() if s.startswith("failed")]
    print(f"wrote {path}" + (f" | {len(failed)} cells failed" if failed else ""))
    return 1 if failed else 0


if __name__ == "__main__":
    cli(main, "reproduce.py", "each run keeps its last checkpoint" if sys.argv[1:2] == ["time_to_target"]
                else "finished cells are kept and a rerun resumes the others")
