"""
Time to target: how long the default transformer takes to reach the paper's level on each wind tunnel, in
training steps, training sequences (steps x batch size, the same on any machine) and wall time on this one.

    python reproduce.py time_to_target                     # the quick preset with the FAST schedules
    python reproduce.py time_to_target --recipe preset     # the preset's own schedules
    python reproduce.py time_to_target --from_runs out/reproduce/quick    # read finished runs instead

`python reproduce.py time_to_target` (or `python time_to_target.py`) is the command line; what it measures,
its targets (TARGETS, and ALSO beside them) and its flags: time_to_target's docstring. Each task is one
train.py run in this process that stops at its target (train.py --stop_at); target_row reads the step of the
first evaluation that met it from the run's results.json.
"""
import json
import os
import signal
import sys

if __name__ == "__main__":  # Ctrl-C or SIGTERM while torch loads: one line and exit code 2, as runtime.cli later
    stop = lambda *_: os._exit(sys.stderr.write("time_to_target.py: error: interrupted; nothing was written\n") and 2)
    signal.signal(signal.SIGINT, stop), signal.signal(signal.SIGTERM, stop)

import torch

import checkpoints
from hardware import describe, machine
import presets
import runtime
from tasks import make_task
import train

TARGETS = {"bijection": "mae_curve<=0.01", "hmm": "mae_token<=0.025", "recall": "accuracy>=0.99",
           "regression": "mae_token<=0.05"}
# the other convention at the same bar, reported beside the target: the mean curve's error is never above the
# per-token one (over- and under-confident sequences cancel in it), so bijection's per-token crossing may come
# after the stop, hmm's and regression's mean-curve crossings at or before it
ALSO = {"bijection": "mae_token<=0.01", "hmm": "mae_curve<=0.025", "regression": "mae_curve<=0.05"}
FAST = {  # train.py flags on top of the quick preset; results/time_to_target.md has the runs that chose them
    "bijection": [],
    "hmm": ["--batch_size", "32", "--max_iters", "3000"],  # fewer sequences to the target, at half the step
    "recall": [],
    "regression": [],
}


def metric(spec):
    return spec.split("<")[0].split(">")[0]  # "mae_curve<=0.01" -> "mae_curve"


def first_reached(history, spec, task_name):
    """(the first history entry that meets spec or None, the best entry)."""
    stop, name = presets.parse_stop(spec, make_task(task_name)), metric(spec)
    best = (max if ">=" in spec else min)(history, key=lambda h: h[name]) if history else None
    return next((h for h in history if stop(h)), None), best


def target_row(task, r, out_dir, flags):
    """One task's row from its run's results.json (r): the step, training sequences (steps x batch size, which
    do not depend on the machine) and wall time of the first evaluation that met the target. KeyError,
    TypeError or ValueError: r is not a train.py run with evaluations during training."""
    if not r["history"]:
        raise ValueError("no evaluations during training (empty history)")
    hit, best = first_reached(r["history"], TARGETS[task], task)
    also = ALSO.get(task) if metric(ALSO.get(task, "")) in r["history"][0] else None  # None: not in this history
    also_hit = first_reached(r["history"], also, task)[0] if also else None
    batch = r["config"]["train"].get("batch_size")  # None: a results.json that does not say
    return dict(task=task, target=TARGETS[task], reached=hit is not None, steps=(hit or {}).get("iter"),
                also=also, also_steps=(also_hit or {}).get("iter"), also_time_s=(also_hit or {}).get("time"),
                sequences=hit["iter"] * batch if hit and batch else None, time_s=(hit or {}).get("time"),
                value=float((hit or best)[metric(TARGETS[task])]), batch_size=batch, run_steps=r["iters"],
                run_time_s=r["wall_time_s"], eval_interval=r["config"]["train"]["eval_interval"], device=r["device"],
                out_dir=out_dir, flags=flags)


def time_to_target(argv):
    """Time to target: the steps, training sequences and wall time the default transformer takes to reach the
    paper-level metric on each wind tunnel.

    Targets, the paper's level: bijection mean-curve entropy MAE <= 0.01 bits, hmm per-token MAE <= 0.025 bits
    at K = 20, recall accuracy >= 99%, regression per-token MAE <= 0.05 bits (not in the paper). The other
    convention's first crossing of the same bar (ALSO: per token for bijection, the mean curve for the others) is
    reported beside it.
    Each task runs `train.py --task T --model transformer` with its preset, evaluating on
    --eval_samples_during held-out sequences every --eval_interval steps, and stops at the first
    evaluation that meets the target (train.py --stop_at); anything after `--` goes to train.py
    (`-- --device cuda --compile`). The quick preset's schedules are sized for its final numbers
    (results/table.md); the fast recipe (FAST) keeps its model and changes only the schedule, so that
    the run is quick to the target rather than best at the end (hmm: half the batch over 3,000 steps);
    `--recipe preset` runs the preset's own schedule.

    Reported: the training steps and sequences (steps x batch size: the same on any machine) and the run's
    wall time (evaluations included) at that evaluation, with the CPU it was measured on (hardware.machine);
    a run whose schedule ends first is "not reached", with its best value. With --from_runs the
    histories of finished runs are read instead, at whatever evaluation interval they used (their wall times
    are their own machines'). Writes time_to_target_<fast, preset or from_runs>.md and .json to
    out/time_to_target (--results results: the committed ones). A run folder that already holds a run is not
    replaced: `-- --overwrite` replaces it.
    """
    args, extra, tasks, p = parse_args(argv)
    cpu = None if args.from_runs else machine(torch.get_num_threads())  # what the wall times below ran on
    rows = [w for w in (task_row(t, args, extra, p) for t in tasks) if w is not None]
    lines = table(rows) + ["", f"Wall times on: {describe(cpu)}" if cpu else "Wall times: each run's own machine."]
    print("\n".join(lines))
    name = "time_to_target_" + ("from_runs" if args.from_runs else args.recipe)
    checkpoints.write_text(os.path.join(args.results, name + ".md"), "\n".join(lines) + "\n")
    checkpoints.write_json(os.path.join(args.results, name + ".json"), [w | dict(machine=cpu) for w in rows])
    return 0


def parse_args(argv):
    """(time_to_target's flags, the train.py flags after `--`, the tasks, the parser), checked before any work."""
    extra = argv[argv.index("--") + 1:] if "--" in argv else []
    argv = argv[:argv.index("--")] if "--" in argv else argv
    p = presets.Parser(prog="reproduce.py time_to_target", description=time_to_target.__doc__.split("\n\n")[0].strip(),
                       allow_abbrev=False)
    p.add_argument("--tasks", default=",".join(TARGETS), help=f"comma-separated (default {','.join(TARGETS)})")
    p.add_argument("--preset", default="quick", choices=list(presets.PRESETS),
                   help="model sizes and schedules (default quick)")
    p.add_argument("--recipe", default="fast", choices=("fast", "preset"),
                   help="fast: the preset with the FAST schedule changes | preset: the preset as it is (default fast)")
    p.add_argument("--eval_interval", type=int, default=100, help="steps between held-out checks (default 100)")
    p.add_argument("--from_runs", default="", help="read DIR/<task>_transformer/results.json instead of training")
    p.add_argument("--out", default=os.path.join("out", "time_to_target"),
                   help="runs go to OUT/<preset>_<recipe>/<task>")
    p.add_argument("--results", default=os.path.join("out", "time_to_target"),
                   help="where time_to_target_<recipe>.md and .json go (`--results results`: the committed ones)")
    args = p.parse_args(argv)
    tasks = args.tasks.split(",")
    bad = [t for t in tasks if t not in TARGETS]
    if bad:
        p.error(f"unknown task {bad[0]!r}; valid tasks: {', '.join(TARGETS)}")
    if args.recipe == "fast" and args.preset != "quick" and not args.from_runs:
        p.error(f"the fast recipe changes the quick preset; with --preset {args.preset} use --recipe preset")
    if args.eval_interval < 1:
        p.error(f"--eval_interval must be >= 1, got {args.eval_interval}")
    try:  # before the work, not after it
        checkpoints.check_out_dir(args.results, "--results")
    except ValueError as e:
        p.error(str(e))
    return args, extra, tasks, p


def task_row(t, args, extra, p):
    """Task t's row (target_row): from its finished run under --from_runs, else from a train.py run in this
    process that stops at the target; None if that run failed (its exit code said)."""
    if args.from_runs:
        out_dir = os.path.join(args.from_runs, f"{t}_transformer")
        if not os.path.exists(os.path.join(out_dir, "results.json")):
            p.error(f"no finished run at {out_dir} (results.json missing)")
    else:
        out_dir = os.path.join(args.out, f"{args.preset}_{args.recipe}", t)
        cmd = ["--task", t, "--model", "transformer", "--preset", args.preset, "--stop_at", TARGETS[t],
               "--eval_interval", str(args.eval_interval), "--out_dir", out_dir]
        cmd += (FAST[t] if args.recipe == "fast" else []) + extra
        print(f"{t}: train.py {' '.join(cmd)}", flush=True)
        rc = train.main(cmd)
        if rc != 0:
            print(f"{t}: train.py failed (exit {rc})")
            return None
    try:
        with open(os.path.join(out_dir, "results.json"), encoding="utf-8") as f:
            r = json.load(f)
        if (r["task"], r["model"]) != (t, "transformer"):
            raise ValueError(f"it holds a {r['task']} x {r['model']} run, not {t} x transformer")
        return target_row(t, r, out_dir, " ".join(FAST[t]) if args.recipe == "fast" and not args.from_runs else "")
    except (KeyError, TypeError, ValueError) as e:  # a corrupt or foreign file, a run without evaluations
        p.error(f"{os.path.join(out_dir, 'results.json')}: not a train.py run to read a time to target from "
                f"({type(e).__name__}: {e})")


def table(rows):
    """The markdown table of the rows, one a task."""
    lines = ["| task | target | flags on the preset | reached at step | training sequences | wall time "
             "| value there (best if not reached) | the same bar, other convention | run | eval every |",
             "|---" * 10 + "|"]
    for w in rows:
        seqs = f"{w['sequences']:,} ({w['batch_size']} a step)" if w["sequences"] else "—"
        at = f"{w['steps']} | {seqs} | {runtime.fmt_time(w['time_s'])}" if w["reached"] else "not reached | — | —"
        also = (f"{w['also']}: step {w['also_steps']}, {runtime.fmt_time(w['also_time_s'])}" if w["also_steps"]
                else f"{w['also']}: not by step {w['run_steps']}" if w["also"] else "—")
        lines.append(f"| {w['task']} | {w['target']} | {w['flags'] or '—'} | {at} | {w['value']:.4f} | {also} "
                     f"| {w['run_steps']} steps, {runtime.fmt_time(w['run_time_s'])}, {w['device']} "
                     f"| {w['eval_interval']} |")
    return lines


if __name__ == "__main__":  # the same program as `python reproduce.py time_to_target`
    runtime.cli(lambda: time_to_target(sys.argv[1:]), "time_to_target.py", "each run keeps its last checkpoint")
