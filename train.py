"""
Train any model on any wind tunnel, score it against the exact posterior, save a checkpoint.

    python train.py --task recall --model transformer               # quick CPU defaults
    python train.py --task hmm --model transformer --preset paper   # the paper's sizes (GPU)
    python train.py --task bijection --resume                       # continue out/bijection_transformer
    torchrun --nproc_per_node=N train.py ...                        # data-parallel: the same global batch

Settings: defaults < preset < flags (presets.py; `--help` shows their values). Recipe: AdamW or Muon; warmup, cosine
decay, clipping; a fresh seeded batch every step (a growing task under --curriculum); held-out checks on sequences of
their own end a run at its target or plateau (--stop_at, --patience); checkpoints; results.json. Plumbing: runtime.py.
"""
from dataclasses import asdict, fields, replace
import math
import os
import re
import signal
import sys
import time

if __name__ == "__main__":  # Ctrl-C or SIGTERM while torch loads: one line and exit code 2, as runtime.cli later
    stop = lambda *_: os._exit(sys.stderr.write("train.py: error: interrupted; nothing was written\n") and 2)
    signal.signal(signal.SIGINT, stop), signal.signal(signal.SIGTERM, stop)

import torch

from checkpoints import (check_run_memory, checkpoint, code_version, load_checkpoint, print0, resume, say_eta,
                         write_json)
from oracles import Metrics, StopRule, batch_mae
from presets import (IO_FIELDS, build_config, check_train, during_seed, fill_io, fit_block_size, match_width,
                     model_name, parse_args, resolve_model, resume_config)
from runtime import (CompiledOrEager, Optimizers, autocast, cli, data_parallel, data_source, fmt_time, global_mean,
                     guarded, oom_hint, prepare_out_dir)
from tasks import make_task


def build(cfg, device, saved=None):
    """Tasks (training + evaluation lengths), model and optimizer from a config; saved: a checkpoint's model
    config, which the model is rebuilt from (its width is not matched again, its table not resized)."""
    train = cfg["train"]
    task = make_task(cfg["task"], **cfg["task_opts"])
    eval_tasks = {"default": task}
    for K in train["eval_K"]:
        if "K" not in cfg["task_opts"] | task.options():
            raise ValueError(f"--eval_K needs a task with a K option (hmm, regression), not {cfg['task']!r}")
        eval_tasks[f"K{K}"] = make_task(cfg["task"], **(cfg["task_opts"] | {"K": K}))
    if train["train_all_queries"] and cfg["task"] != "recall":
        raise ValueError(f"--train_all_queries is an option of --task recall, not {cfg['task']!r}")
    Config, Model = resolve_model(cfg["model"])
    # training sequences (every key queried) can be longer than the evaluation's: the context fits both
    train_tasks = [task.all_queries()] if train["train_all_queries"] else []
    longest = max(t.seq_len for t in [*eval_tasks.values(), *train_tasks])
    # the options, and the task's I/O fields that the config has: a model that lacks one it needs is refused here
    mc = dict(saved) if saved else fill_io(cfg["model"], task, cfg["model_opts"], longest)
    if train["match_params"] and not saved:
        mc = match_width(cfg, Config, Model, mc, fill_io("transformer", task, {}, longest))
    config = Config(**fit_block_size(Config, Model, mc, longest))
    check_run_memory(cfg, asdict(config), max(t.seq_len for t in [task, *train_tasks]), eval_tasks, device)
    model = Model(config).to(device)
    return task, eval_tasks, model, make_optimizer(model, train, device), asdict(config)


def make_optimizer(model, train, device):
    """AdamW with decoupled weight decay on matrices and embeddings, or (--optimizer muon) Muon on the linear maps'
    weights inside the blocks (muon_params), AdamW on the rest. Muon's update is rescaled to AdamW's RMS (Moonshot's
    rule): both take one --lr and schedule. `_no_weight_decay` (Mamba's A_log, D): never decayed, never in Muon."""
    named = list(model.named_parameters())
    hidden = muon_params(model) if train["optimizer"] == "muon" else set()
    decays = lambda p: train["weight_decay_on"] == "all" or p.dim() >= 2 and not getattr(p, "_no_weight_decay", False)
    rest = [p for n, p in named if n not in hidden]
    groups = [dict(params=[p for p in rest if decays(p)], weight_decay=train["weight_decay"]),
              dict(params=[p for p in rest if not decays(p)], weight_decay=0.0)]
    betas = (train["beta1"], train["beta2"])
    try:  # the fused kernel on CUDA, the plain loop elsewhere
        adamw = torch.optim.AdamW(groups, lr=train["lr"], betas=betas, fused=device.type == "cuda")
    except (RuntimeError, TypeError):
        adamw = torch.optim.AdamW(groups, lr=train["lr"], betas=betas)
    if train["optimizer"] == "adamw":
        return Optimizers(adamw)
    if not hasattr(torch.optim, "Muon"):
        raise ValueError(f"--optimizer muon needs torch >= 2.9 (torch.optim.Muon); this is torch {torch.__version__}")
    muon = torch.optim.Muon([p for n, p in named if n in hidden], lr=train["lr"],
                            weight_decay=train["weight_decay"], adjust_lr_fn="match_rms_adamw")
    return Optimizers(adamw, muon)


def muon_params(model):
    """The names of the parameters Muon takes: the 2-D weights of the linear maps (nn.Linear, nn.LSTM) inside the
    blocks (transformer c_attn, c_proj, c_fc; Mamba in_proj, x_proj, dt_proj, out_proj; LSTM weight_ih, weight_hh;
    MLP c_fc, c_proj; linear attention c_attn, c_beta, c_proj, c_fc). AdamW keeps embeddings, position tables,
    read-ins, heads, gains, biases, convolutions, per-head scalars, and Mamba's A_log and D (_no_weight_decay)."""
    return {f"{mn}.{pn}" for mn, m in model.named_modules()
            if mn.startswith(("blocks.", "layers.")) and isinstance(m, (torch.nn.Linear, torch.nn.LSTM))
            for pn, p in m.named_parameters(recurse=False)
            if p.dim() == 2 and pn.startswith("weight") and not getattr(p, "_no_weight_decay", False)}


def get_lr(it, train):
    """Linear warmup to --lr, cosine down to min_lr_ratio * lr at lr_decay_iters, then flat. `authors`: their
    scripts' rate, which counts steps from 1 (s = it + 1): s / w of --lr, then the cosine at (s - w) / (T - w)."""
    w, T = train["warmup_iters"], train["lr_decay_iters"] or train["max_iters"]
    s, w1 = (it + 1, w) if train.get("lr_schedule") == "authors" else (it, w + 1)
    if s < w:
        return train["lr"] * (it + 1) / w1
    decay = 0.5 * (1 + math.cos(math.pi * min(1.0, (s - w) / max(1, T - w))))
    return train["lr"] * (train["min_lr_ratio"] + (1 - train["min_lr_ratio"]) * decay)


class Batches:
    """The global batch of step `it` is slice it % chunk of one draw of `chunk` batches; every rank draws
    the same and trains on its 1/world slice. state(it) is the generator state that redraws step it's batch."""

    def __init__(self, task, train, device, rank, world):
        self.gen, self.n = data_source(train, device, task)
        self.B, self.device, self.rank, self.world = train["batch_size"], device, rank, world
        grow = (lambda t, **kw: t.all_queries(**kw)) if train["train_all_queries"] else replace
        one = grow(task)
        self.stage = parse_curriculum(train["curriculum"], task, train, grow) or (lambda it: one)
        self.chunk = self.chunk_state = None

    def steps_left(self, it, T):
        """The steps from it to T in units of step it's cost, its sequence length (the ETA): T - it, or more
        under a curriculum."""
        return sum(self.stage(s).seq_len for s in range(it, T)) / self.stage(it).seq_len

    def get(self, it):
        """Step it's batch, and the task it was drawn from (under a curriculum, that step's stage)."""
        k, B = it % self.n, self.B
        if k == 0 or self.chunk is None:  # None: resumed mid-chunk, with the generator at the chunk's start
            self.chunk_state = self.gen.get_state()
            self.chunk_task = self.stage(it - k)
            self.chunk = self.chunk_task.sample(B * self.n, self.gen)
        batch = self.chunk.map(lambda t: t[k * B:(k + 1) * B]) if self.n > 1 else self.chunk
        if self.world > 1:
            per = B // self.world
            batch = batch.map(lambda t: t[self.rank * per:(self.rank + 1) * per])
        if batch.x.device.type == "cpu" and self.device.type == "cuda":  # from pinned memory the copy is asynchronous
            batch = batch.map(lambda t: t.pin_memory().to(self.device, non_blocking=True), latent=False)
        # the oracle's float64 latents stay on the CPU (MPS has no float64)
        return batch.to(self.device, latent=False), self.chunk_task

    def state(self, it):
        return self.gen.get_state() if it % self.n == 0 else self.chunk_state


def parse_curriculum(spec, task, train, grow=replace):
    """--curriculum NAME=START -> stage(it), the task of training step `it`, grow(task, NAME=value); '' -> None.
    The option is START for the first curriculum_hold steps, then grows linearly, one integer stage at a time, to
    the task's own value at step curriculum_iters. grow makes a stage (--train_all_queries: every key queried)."""
    if not spec:
        if train.get("curriculum_hold"):
            raise ValueError(f"--curriculum_hold {train['curriculum_hold']} needs a --curriculum to hold")
        return None
    m = re.fullmatch(r"(\w+)=(\d+)", spec.replace(" ", ""))
    options = [f.name for f in fields(task) if isinstance(getattr(task, f.name), int)
               and not isinstance(getattr(task, f.name), bool)]
    if m is None or m.group(1) not in options:
        raise ValueError(f"--curriculum {spec!r}: expected NAME=START with NAME an integer option of {task.name}: "
                         f"{', '.join(options)}")
    name, start, end = m.group(1), int(m.group(2)), getattr(task, m.group(1))
    if not 1 <= start <= end:
        raise ValueError(f"--curriculum {spec!r}: START must be in [1, {end}] ({task.name}'s {name})")
    io, stages = (lambda t: [getattr(t, k, None) for k in IO_FIELDS]), {}  # value -> task, every stage checked now
    for value in range(start, end + 1):
        try:
            stages[value] = grow(task, **{name: value})
        except ValueError as e:
            which = "its first stage" if value == start else f"the stage {name}={value}"
            raise ValueError(f"--curriculum {spec!r}: the task refuses {which}: {e}") from None
        if io(stages[value]) != io(task):
            raise ValueError(f"--curriculum {spec!r}: {name} changes the model's inputs or outputs; grow an option "
                             f"that only changes the sequences")
    iters, hold = train["curriculum_iters"] or train["max_iters"] // 2, train.get("curriculum_hold", 0)
    if hold >= iters:
        raise ValueError(f"--curriculum_hold {hold} must be below --curriculum_iters ({iters}), the step from which "
                         f"{name} is the task's own")

    def stage(it):  # after the hold, end - start + 1 stages of equal length
        grown = (end - start + 1) * max(it - hold, 0) // (iters - hold)
        return stages[end if it >= iters else start + grown]
    return stage


@torch.no_grad()
def evaluate(model, task, n_samples, seed, device, ctx, per_pass=250, batch_size=250, flag="--eval_samples"):
    """Metrics on n_samples held-out sequences drawn from a fixed seed, batch_size at a time; the forward pass
    takes at most per_pass of them (--eval_batch_size), which changes the memory, not the sequences. Its memory
    stays that of one draw however many there are; an evaluation of more than a minute says how long, naming flag."""
    model.eval()
    g, m, t0 = torch.Generator().manual_seed(seed), Metrics(), time.time()
    for i in range(0, n_samples, batch_size):
        if i == batch_size:
            say_eta(flag, n_samples, i, n_samples, t0)
        batch = task.sample(min(batch_size, n_samples - i), g)
        with ctx, oom_hint(f"at evaluation (try a smaller --eval_batch_size; it was {per_pass})"):
            out = torch.cat([model(x.to(device)).float() for x in batch.x.tensor_split(-(-len(batch.x) // per_pass))])
        m.update(task, batch, out)
    model.train()
    return m.result(task)


def summary(r):
    s = f"mae_curve {r['mae_curve']:.4f} | mae_token {r['mae_token']:.4f} | kl {r['kl']:.4f}"
    return s + (f" | acc {r['accuracy']:.4f} (bayes {r['oracle_accuracy']:.4f})" if "accuracy" in r else "")


def held_out(model, fwd, task, train, proc, ctx, at_eval, state, stop):
    """Rank 0's verdict at a step that saves (proc.due), and the held-out metrics (without curves) it rests on:
    ("diverged", None) if the parameters or metrics are not finite (said), ("reached", metrics, why under "stopped")
    where the stop rule ends the run, else ("go on", metrics; None at a snapshot). state(): ckpt.pt, saved first."""
    if not all(torch.isfinite(p).all() for p in model.parameters()):
        proc.diverged("parameters are not finite", proc.step)
        return "diverged", None
    if not at_eval:
        return "go on", None
    proc.save_first(state)
    r = evaluate(fwd, task, train["eval_samples_during"], during_seed(train), proc.device, ctx, proc.eval_batch,
                 flag="--eval_samples_during")
    if not all(math.isfinite(v) for v in r.values() if isinstance(v, float)):
        proc.diverged("held-out metrics are not finite", proc.step)
        return "diverged", None
    r = {k: v for k, v in r.items() if not isinstance(v, list)}
    return ("reached", r | {"stopped": stop.reason}) if stop(r) else ("go on", r)


# -----------------------------------------------------------------------------
# the training loop: a step, now and then a progress line, now and then an evaluation and a checkpoint


def train_loop(cfg, proc, resume_state=None, eval_only=False):
    """The run on this process (proc: its device, rank and checkpoints); exit code 0, or 1 if it diverged."""
    train, T, device = cfg["train"], cfg["train"]["max_iters"], proc.device
    torch.manual_seed(train["seed"])
    task, eval_tasks, model, opt, model_config = build(cfg, device, resume_state and resume_state["model_config"])
    use_bf16, ctx = autocast(train["dtype"], device)
    batches = Batches(task, train, device, proc.rank, proc.world)
    out_dir = prepare_out_dir(train, resume_state is not None, proc)
    it, elapsed, history = resume(resume_state, model, opt, batches, device, train)
    stop = StopRule(train, task, history)  # a resumed run's evaluations count towards its plateau
    fwd = CompiledOrEager(data_parallel(model, device, proc.world), train["compile"], print0)
    eval_fwd = model if proc.world > 1 else fwd  # the bare model: no gradient hooks, no collectives
    print0(f"{cfg['task']} x {cfg['model']} | {model.num_params():,} params | device {device}"
           f"{' bf16' * use_bf16} | out {out_dir}")
    t_start = t_log = time.time()
    it_log = it
    state = lambda: checkpoint(cfg, model_config, model, opt, batches, device, it, elapsed + time.time() - t_start,
                               history)  # what ckpt.pt would hold now
    if resume_state and not all(torch.isfinite(p).all() for p in model.parameters()):  # a diverged run's last save
        print0(f"train.py: error: {out_dir}: its weights are not finite (step {it})", file=sys.stderr)
        return 1
    while it < T and not eval_only:
        lr = get_lr(it, train)
        for group in opt.param_groups:
            group["lr"] = lr
        batch, stage = batches.get(it)
        out, loss = update(fwd, model, stage, opt, batch, ctx, train["grad_clip"])
        it = proc.step = it + 1
        at_log, at_eval = it % train["log_interval"] == 0 or it == T, it % train["eval_interval"] == 0 or it == T
        lossf = global_mean(loss, proc.world) if at_log or at_eval else None  # the one host sync between logs
        if at_log and not math.isfinite(lossf):
            return proc.diverged(f"loss is {lossf}", it)
        if at_log:  # once in a while: a progress line
            dt, left = time.time() - t_log, batches.steps_left(it, T)
            print0(f"step {it:>6}/{T} | loss {lossf:.4f} | mae {batch_mae(stage, batch, out):.4f} bits (batch) "
                   f"| {(it - it_log) * train['batch_size'] * stage.seq_len / dt / 1e3:.1f}k tok/s | lr {lr:.2e} "
                   f"| eta {fmt_time(left * dt / (it - it_log))}{', or at ' + stop.what if stop.what else ''}")
            t_log, it_log = time.time(), it
        if not proc.due(it, at_eval):
            continue
        verdict = "go on"  # once in a while: evaluate and save, on rank 0, whose verdict every rank follows
        if proc.alone():
            verdict, r = held_out(model, eval_fwd, task, train, proc, ctx, at_eval, state, stop)
            if verdict != "diverged":  # save: ckpt.pt at an evaluation, a snapshot ckpt_<step>.pt by --ckpt_schedule
                now = elapsed + time.time() - t_start
                if at_eval:
                    history.append(dict(iter=it, loss=lossf, time=now, **r))
                    print0(f"eval step {it}: {summary(r)}")
                proc.save(checkpoint(cfg, model_config, model, opt, batches, device, it, now, history), at_eval)
                t_log, it_log = time.time(), it  # progress rates exclude evaluation time
        verdict = proc.verdict(verdict)
        if verdict == "reached":
            print0(f"{stop.reason} at step {it}: stopping")
            break
        if verdict in ("diverged", "failed"):  # rank 0 said why
            return 1 if verdict == "diverged" else 2
    if proc.alone():
        final_eval(cfg, eval_tasks, eval_fwd, proc, ctx, it, history, elapsed + time.time() - t_start,
                   model_config, eval_only)
    return 0


def step(fwd, task, opt, batch, ctx):
    """Forward, loss and backward: the compiled backward graph is built, and may fail, at the first backward."""
    with ctx:
        loss = task.loss(out := fwd(batch.x), batch)
    opt.zero_grad(set_to_none=True)
    loss.backward()
    return out, loss


def update(fwd, model, task, opt, batch, ctx, grad_clip):
    """One training step: step() (once more eager if compiling failed), the gradient clipped to grad_clip
    (0 = off), the optimizer's update. fwd: the model as called (compiled, data-parallel); model: its parameters."""
    out, loss = fwd.retry(lambda: step(fwd, task, opt, batch, ctx))
    if grad_clip > 0:
        torch.nn.utils.clip_grad_norm_(model.parameters(), grad_clip)
    opt.step()
    return out, loss


def final_eval(cfg, eval_tasks, model, proc, ctx, it, history, wall, model_config, eval_only):
    """The held-out metrics at every evaluated length, into results.json (eval.json for --eval_only)."""
    train, metrics, device = cfg["train"], {}, proc.device
    for name, t in eval_tasks.items():
        metrics[name] = evaluate(model, t, train["eval_samples"], train["eval_seed"], device, ctx, proc.eval_batch)
        print0(f"final {name} ({train['eval_samples']} held-out sequences): {summary(metrics[name])}")
    results = dict(task=cfg["task"], model=cfg["model"], preset=cfg["preset"], config=cfg, model_config=model_config,
                   task_options=eval_tasks["default"].options(), n_params=model.num_params(), iters=it,
                   metrics=metrics, history=history, wall_time_s=wall, device=str(device), seed=train["seed"],
                   code_version=code_version(), torch_version=torch.__version__)
    path = os.path.join(train["out_dir"], "eval.json" if eval_only else "results.json")
    write_json(path, results)
    print0(f"wrote {path} | wall time {fmt_time(wall)}")


def run(cfg, resume_state=None, eval_only=False):
    """train_loop, with Ctrl-C, out of memory and a full disk reported in one line (runtime.guarded)."""
    check_train(cfg["train"])
    return guarded(lambda proc: train_loop(cfg, proc, resume_state, eval_only), cfg["train"],
                   resume_state["iter"] if resume_state else None)


def main(argv=None):
    known, given, parser = parse_args(sys.argv[1:] if argv is None else argv, __doc__)
    try:
        if not (given.get("resume") or given.get("eval_only")):
            return run(build_config(known.task, known.model, known.preset, given))
        out_dir = given.get("out_dir") or os.path.join("out", f"{known.task}_{model_name(known.model)}")
        state = load_checkpoint(os.path.join(out_dir, "ckpt.pt"))
        return run(resume_config(state, known, given, out_dir), state, eval_only=bool(given.get("eval_only")))
    except ValueError as e:
        flag = re.match(r"--(curriculum|curriculum_hold) ", str(e))
        if flag and flag[1] not in given and not given.get("resume"):
            off = "''" if flag[1] == "curriculum" else "0"
            e = f"{e} (--{flag[1]} is the {known.preset} preset's: pass --{flag[1]} {off} to train without it)"
        parser.exit(2, f"{parser.prog}: error: {e}\n")


if __name__ == "__main__":
    cli(main, "train.py", "nothing was written (training had not started)")
