"""
Train any model on any wind tunnel, score it against the exact posterior, save a checkpoint.

    python train.py --task recall --model transformer               # quick CPU defaults
    python train.py --task hmm --model transformer --preset paper   # the paper's sizes (GPU)
    python train.py --task bijection --resume                       # continue out/bijection_transformer
    torchrun --nproc_per_node=N train.py ...                        # data-parallel: the same global batch

Settings: defaults < preset < flags, resolved once (settings.py; `--help` shows each flag's value, `--dry_run` the
whole run). Recipe: AdamW or Muon, warmup, cosine decay, clipping (optim.py); a fresh seeded batch every step, a
growing task under --curriculum (batches.py); held-out checks on sequences of their own end a run at its target or
plateau, --stop_at, --patience, and the final evaluation writes results.json (evaluation.py). Plumbing: runtime.py,
checkpoints.py.
"""
import json
import math
import os
import re
import sys
import time

if __name__ == "__main__":
    from commandline import before_torch
    before_torch("train.py")

import torch

from batches import Batches
from checkpoints import checkpoint, print0, resume
from commandline import cli, raised
from evaluation import StopRule, evaluate_during, final_eval, summary
from optim import get_lr, make_optimizer, update
from oracles import batch_mae
from runtime import (CompiledOrEager, autocast, check_run_memory, data_parallel, fmt_time, global_mean, guarded,
                     native_bf16, prepare_out_dir)
from settings import check_task, parse_args, start


def build(run, device):
    """The run's model on device, and its optimizer: refused first where a training step or an evaluation pass
    would not fit the machine's memory. An error raised in the model's own __init__ names its file and line."""
    check_run_memory(run, device)
    try:
        model = run.Model(run.Config(**run.model_config)).to(device)
    except Exception as e:
        if "model" not in run.files:  # a built-in's: a bug of ours, with its traceback
            raise
        raise ValueError(f"--model {run.model}: building it raised {raised(e, run.files['model'])}") from None
    ns_dtype = torch.bfloat16 if native_bf16(device) else torch.float32  # Muon's Newton-Schulz (optim.Muon)
    return model, make_optimizer(model, run.train, device, ns_dtype)


# -----------------------------------------------------------------------------
# the training loop: a step, now and then a progress line, now and then an evaluation and a checkpoint


def train_loop(run, proc, stop, resume_state=None, eval_only=False):
    """The run on this process (proc: its device, rank and checkpoints) until its schedule's end or its stop rule;
    exit code 0, or 1 if it diverged."""
    train, T, device, cfg = run.train, run.train["max_iters"], proc.device, run.record
    task = run.tasks["default"]
    torch.manual_seed(train["seed"])
    model, opt = build(run, device)
    use_bf16, ctx = autocast(train["dtype"], device)
    # the wrappers hold the model's own parameters: resume() below loads the checkpoint into them in place
    fwd = CompiledOrEager(data_parallel(model, device, proc.world), train["compile"], print0)
    eval_fwd = model if proc.world > 1 else fwd  # the bare model: no gradient hooks, no collectives
    out_dir = prepare_out_dir(train, resume_state is not None, proc)
    batches = Batches(run, device, proc.rank, proc.world)
    ckpts = proc.ckpts  # the checkpoints it keeps (checkpoints.Checkpoints)
    ckpts.record = run.description  # config.json, beside the first ckpt.pt
    it, elapsed, history = resume(resume_state, model, opt, batches, device, train)
    print0(f"{run.task} x {run.model} | {model.num_params():,} params | device {device}"
           f"{' bf16' * use_bf16} | out {out_dir} | preset {run.entries}")
    t_start = t_log = time.time()
    it_log = it
    state = lambda: checkpoint(cfg, run.model_config, model, opt, batches, device, it, elapsed + time.time() - t_start,
                               history)  # what ckpt.pt would hold now
    if resume_state and not all(torch.isfinite(p).all() for p in model.parameters()):  # a diverged run's last save
        print0(f"train.py: error: {out_dir}: its weights are not finite (step {it})", file=sys.stderr)
        return 1
    while it < T and not eval_only:
        batch, stage = batches.get(it)
        lr = get_lr(it, train)
        for group in opt.param_groups:
            group["lr"] = lr
        out, loss = update(fwd, model, stage, opt, batch, ctx, train["grad_clip"], run.files.get("model"), run.model)
        it = proc.step = it + 1
        at_log, at_eval = it % train["log_interval"] == 0 or it == T, it % train["eval_interval"] == 0 or it == T
        lossf = global_mean(loss, proc.world) if at_log or at_eval else None  # the one host sync between logs
        if at_log and not math.isfinite(lossf):
            return proc.diverged(f"loss is {lossf}", it)
        if at_log or it == it_log + 1 == 1:  # once in a while a progress line, and at once after the first step
            dt, left = time.time() - t_log, batches.steps_left(it, T)
            print0(f"step {it:>6}/{T} | loss {global_mean(loss, proc.world):.4f} | mae "
                   f"{batch_mae(stage, batch, out):.4f} bits (batch) "
                   f"| {(it - it_log) * train['batch_size'] * stage.seq_len / dt / 1e3:.1f}k tok/s | lr {lr:.2e} "
                   f"| eta {fmt_time(left * dt / (it - it_log))}{', or at ' + stop.what if stop.what else ''}")
            t_log, it_log = time.time(), it
        if not ckpts.due(it, at_eval):
            continue
        verdict = "go on"  # once in a while: evaluate and save, on rank 0, whose verdict every rank follows
        if proc.alone():
            verdict, r = evaluate_during(model, eval_fwd, task, train, proc, ctx, at_eval, state, stop)
            if verdict != "diverged":  # save: ckpt.pt at an evaluation, a snapshot ckpt_<step>.pt by --ckpt_schedule
                now = elapsed + time.time() - t_start
                if at_eval:
                    history.append(dict(iter=it, loss=lossf, time=now, **r))
                    print0(f"eval step {it}: {summary(r)}")
                ckpts.save(checkpoint(cfg, run.model_config, model, opt, batches, device, it, now, history), at_eval)
                t_log, it_log = time.time(), it  # progress rates exclude evaluation time
        verdict = proc.verdict(verdict)
        if verdict == "reached":
            print0(f"{stop.reason} at step {it}: stopping")
            break
        if verdict in ("diverged", "failed"):  # rank 0 said why
            return 1 if verdict == "diverged" else 2
    if proc.alone():
        final_eval(run, eval_fwd, proc, ctx, it, history, elapsed + time.time() - t_start, stop, eval_only)
    return 0


def main(argv=None):
    known, given, parser = parse_args(sys.argv[1:] if argv is None else argv, __doc__)
    try:
        run, state = start(known, given)
        if given.get("dry_run"):
            print(json.dumps(run.description, indent=1))
            return 0
        if state is None:
            check_task(run)
        # a resumed run's evaluations count towards its plateau; a --stop_at no run can meet is refused before anything
        stop = StopRule(run.train, run.tasks["default"], state["history"] if state else ())
        if run.note and os.environ.get("RANK", "0") == "0":
            print(run.note, file=sys.stderr)
        # the loop, with Ctrl-C, out of memory and a full disk reported in one line saying what was kept
        return guarded(lambda proc: train_loop(run, proc, stop, state, bool(given.get("eval_only"))), run.train,
                       state["iter"] if state else None)
    except ValueError as e:
        flag = re.match(r"--(curriculum|curriculum_hold) ", str(e))
        if flag and flag[1] not in given and not given.get("resume"):
            off = "''" if flag[1] == "curriculum" else "0"
            e = f"{e} (--{flag[1]} is the {known.preset} preset's: pass --{flag[1]} {off} to train without it)"
        parser.exit(2, f"{parser.prog}: error: {e}\n")


if __name__ == "__main__":
    cli(main, "train.py", "nothing was written (training had not started)")
