"""
Train any model on any wind tunnel, score it against the exact posterior, save a checkpoint.

    python train.py --task recall --model transformer               # quick CPU defaults
    python train.py --task hmm --model transformer --preset paper   # the paper's sizes (GPU)
    python train.py --task bijection --resume                       # continue out/bijection_transformer
    torchrun --nproc_per_node=N train.py ...                        # data-parallel: the same global batch

Settings: defaults < preset < flags, resolved once (settings.py; `--help` shows each flag's value, `--dry_run` the
whole run). Recipe: AdamW or Muon; warmup, cosine decay, clipping; a fresh seeded batch every step (a growing task
under --curriculum); held-out checks on sequences of their own end a run at its target or plateau (--stop_at,
--patience); checkpoints; results.json. Plumbing: runtime.py, checkpoints.py.
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

from checkpoints import checkpoint, code_version, print0, resume, write_json
from commandline import cli, in_file, is_oom, raised
from oracles import Broken, Metrics, batch_mae, check, failed
from runtime import (CompiledOrEager, Optimizers, autocast, check_run_memory, data_parallel, data_source, fmt_time,
                     global_mean, guarded, native_bf16, oom_hint, prepare_out_dir, say_eta)
from settings import during_seed, parse_args, start


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
    return model, make_optimizer(model, run.train, device)


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
    muon = Muon([p for n, p in named if n in hidden], lr=train["lr"], weight_decay=train["weight_decay"],
                adjust_lr_fn="match_rms_adamw", ns_dtype=torch.bfloat16 if native_bf16(device) else torch.float32)
    return Optimizers(adamw, muon)


class Muon(getattr(torch.optim, "Muon", torch.optim.Optimizer)):  # torch < 2.9: refused in make_optimizer
    """torch.optim.Muon with its Newton-Schulz iterations in ns_dtype. torch's own run in bf16, which a CPU without
    it natively (AVX2-only x86: older, consumer and many cloud CPUs) emulates at 0.9 GFLOP/s against fp32's 62
    (results/speed.md); so they run in float32 there and in bf16 where it is native, as torch's do (the same
    update to the bit: tests/test_train.py). The momentum buffer is torch's (state["momentum_buffer"])."""

    def __init__(self, params, ns_dtype=torch.bfloat16, **kw):
        super().__init__(params, **kw)
        self.ns_dtype = ns_dtype

    @torch.no_grad()
    def step(self, closure=None):
        if self.ns_dtype == torch.bfloat16:
            return super().step(closure)
        for group in self.param_groups:
            for p in (p for p in group["params"] if p.grad is not None):
                buf = self.state[p].setdefault("momentum_buffer", torch.zeros_like(p.grad))
                buf.lerp_(p.grad, 1 - group["momentum"])
                update = p.grad.lerp(buf, group["momentum"]) if group["nesterov"] else buf
                update = newton_schulz(update, group["ns_coefficients"], group["ns_steps"], group["eps"], self.ns_dtype)
                p.mul_(1 - group["lr"] * group["weight_decay"])
                p.add_(update, alpha=-group["lr"] * 0.2 * math.sqrt(max(p.shape)))  # AdamW's RMS (match_rms_adamw)


def newton_schulz(g, coefficients, steps, eps, dtype):
    """The quintic Newton-Schulz iteration towards the orthogonal factor of g (Jordan et al.), as torch.optim.Muon's,
    in dtype: X <- a X + (b A + c A^2) X with A = X X^T, from X = g / |g|_F, on the wide orientation."""
    a, b, c = coefficients
    x = g.to(dtype)
    wide = g.size(0) <= g.size(1)
    x = x if wide else x.T
    x = x.div(x.norm().clamp(min=eps))
    for _ in range(steps):
        gram = x @ x.T
        x = torch.addmm(x, torch.addmm(gram, gram, gram, beta=b, alpha=c), x, beta=a)
    return x if wide else x.T


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

    def __init__(self, run, device, rank, world):
        self.gen, self.n = data_source(run.train, device, run.tasks["default"])
        self.B, self.device, self.rank, self.world = run.train["batch_size"], device, rank, world
        self.stage = run.curriculum  # the task of each step: the layout it trains on, grown by --curriculum
        self.chunk = self.chunk_state = None

    def steps_left(self, it, T):
        """The steps from it to T in units of step it's cost, its sequence length (the ETA): T - it, or more
        under a curriculum."""
        return self.stage.tokens(it, T) / self.stage(it).seq_len

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

# -----------------------------------------------------------------------------
# when a run's held-out evaluations end it: --stop_at, --patience

RANGE = dict(accuracy=(0.0, 1.0))  # the values a metric can take (the others: [0, inf), bits)


def parse_stop(spec, task):
    """--stop_at: 'metric<=x' or 'metric>=x' -> (metric, op, x), or None for ''; a target no run can meet (accuracy
    >= 2, kl <= -1) is refused."""
    if not spec:
        return None
    m = re.fullmatch(r"(mae_curve|mae_token|kl|accuracy)(<=|>=)([0-9.eE+-]+)", spec.replace(" ", ""))
    try:
        x = float(m.group(3)) if m else None
    except ValueError:
        x = None
    if x is not None and not math.isfinite(x):
        raise ValueError(f"--stop_at {spec!r}: the threshold must be a finite number, got {x}")
    if x is None:
        raise ValueError(f"--stop_at {spec!r}: expected METRIC<=X or METRIC>=X with METRIC one of "
                         "mae_curve, mae_token, kl, accuracy and X a finite number")
    name, op = m.group(1), m.group(2)
    if name == "accuracy" and task.gaussian:
        raise ValueError(f"--stop_at {spec!r}: {task.name} has no accuracy; use mae_curve, mae_token or kl")
    lo, hi = RANGE.get(name, (0.0, math.inf))
    if x < lo if op == "<=" else x > hi:
        raise ValueError(f"--stop_at {spec!r}: {name} is in [{lo:g}, {hi:g}], so no run can meet it")
    return name, op, x


def meets(r, target, margin=0.0):
    """Whether the metrics r meet target (metric, op, x), by `margin` of the metric's standard errors."""
    name, op, x = target
    v, se = r[name], margin * r.get(f"{name}_se", 0.0)
    return v + se <= x if op == "<=" else v - se >= x


class StopRule:
    """When a run's held-out evaluations end it: at --stop_at's target, met by two standard errors over the check's
    sequences (their noise allowed for: a check of 500 sequences that reads 99.9% when the model has 99.85% does
    not stop it), or after --patience evaluations in a row whose KL is not 1% below the best before them (the
    evaluations reuse one set of sequences, so a change is the model's). rule(r) -> why to stop now, or None; a
    resumed run's history is counted first."""
    MARGIN = 2.0

    def __init__(self, train, task, history=()):
        self.spec, self.target, self.patience = train["stop_at"], parse_stop(train["stop_at"], task), train["patience"]
        self.what = " or ".join([self.spec] * bool(self.spec) + ["a plateau"] * bool(self.patience))  # for eta lines
        self.best, self.since = math.inf, 0
        for r in history:
            self(r)
        self.reason = None

    def __call__(self, r):
        self.best, self.since = (r["kl"], 0) if r["kl"] < 0.99 * self.best else (self.best, self.since + 1)
        self.reason = None
        if self.target is not None and meets(r, self.target, self.MARGIN):
            self.reason = f"reached {self.spec}"
        elif self.patience and self.since >= self.patience:
            self.reason = f"plateau: KL not 1% below {self.best:.4g} in {self.patience} evaluations"
        return self.reason


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


def train_loop(run, proc, resume_state=None, eval_only=False):
    """The run on this process (proc: its device, rank and checkpoints); exit code 0, or 1 if it diverged."""
    train, T, device, cfg = run.train, run.train["max_iters"], proc.device, run.record
    torch.manual_seed(train["seed"])
    model, opt = build(run, device)
    task = run.tasks["default"]
    use_bf16, ctx = autocast(train["dtype"], device)
    batches = Batches(run, device, proc.rank, proc.world)
    out_dir = prepare_out_dir(train, resume_state is not None, proc)
    proc.record = run.description  # config.json, beside the first ckpt.pt
    it, elapsed, history = resume(resume_state, model, opt, batches, device, train)
    stop = StopRule(train, task, history)  # a resumed run's evaluations count towards its plateau
    fwd = CompiledOrEager(data_parallel(model, device, proc.world), train["compile"], print0)
    eval_fwd = model if proc.world > 1 else fwd  # the bare model: no gradient hooks, no collectives
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
        lr = get_lr(it, train)
        for group in opt.param_groups:
            group["lr"] = lr
        batch, stage = batches.get(it)
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
                proc.save(checkpoint(cfg, run.model_config, model, opt, batches, device, it, now, history), at_eval)
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


def step(fwd, task, opt, batch, ctx):
    """Forward, loss and backward: the compiled backward graph is built, and may fail, at the first backward."""
    with ctx:
        loss = task.loss(out := fwd(batch.x), batch)
    opt.zero_grad(set_to_none=True)
    loss.backward()
    return out, loss


def update(fwd, model, task, opt, batch, ctx, grad_clip, file=None, spec=""):
    """One training step: step() (once more eager if compiling failed), the gradient clipped to grad_clip
    (0 = off), the optimizer's update. fwd: the model as called (compiled, data-parallel); model: its parameters.
    A model of a file (--model spec) whose forward raises is one line naming its file and line; one whose output
    carries no gradient (detached, cast to integers, no parameters) is refused, not trained on silently."""
    try:
        out, loss = fwd.retry(lambda: step(fwd, task, opt, batch, ctx))
    except Exception as e:
        if file is None or is_oom(e):
            raise
        if "does not require grad" in str(e):
            raise ValueError(f"--model {spec}: its output has no gradient (detached, not a float, or no parameters "
                             f"before it): nothing would train") from None
        if not in_file(e, file):  # ours (the output's shape refused): its own line
            raise
        raise ValueError(f"--model {spec}: its forward raised {raised(e, file)}") from None
    if grad_clip > 0:
        torch.nn.utils.clip_grad_norm_(model.parameters(), grad_clip)
    opt.step()
    return out, loss


def final_eval(run, model, proc, ctx, it, history, wall, stop, eval_only):
    """The held-out metrics at every evaluated length, into results.json (eval.json for --eval_only), with how the
    run stopped; a run stopped at its target on the checks that misses it on these sequences says so."""
    train, metrics, device = run.train, {}, proc.device
    for name, t in run.tasks.items():
        metrics[name] = evaluate(model, t, train["eval_samples"], train["eval_seed"], device, ctx, proc.eval_batch)
        print0(f"final {name} ({train['eval_samples']} held-out sequences): {summary(metrics[name])}")
    last = history[-1] if history and history[-1].get("iter") == it else {}
    why = last.get("stopped") or ("its schedule's end" if it >= train["max_iters"] else "not trained on")
    meets_final = meets(metrics["default"], stop.target) if stop.target else None
    stopped = dict(why=why, step=it, target=train["stop_at"] or None, final_meets_target=meets_final)
    results = dict(task=run.task, model=run.model, preset=run.preset, config=run.record,
                   model_config=run.model_config, task_options=run.tasks["default"].options(),
                   n_params=model.num_params(), iters=it, metrics=metrics, stop=stopped, history=history,
                   wall_time_s=wall, device=str(device), seed=train["seed"], code_version=code_version(),
                   torch_version=torch.__version__)
    path = os.path.join(train["out_dir"], "eval.json" if eval_only else "results.json")
    write_json(path, results)
    name = stop.target and stop.target[0]
    miss = (f" | {why} on the checks at step {it}, but the final evaluation misses it: {name} "
            f"{metrics['default'][name]:.4f}" if why.startswith("reached") and meets_final is False else "")
    print0(f"wrote {path} | wall time {fmt_time(wall)}{miss}")


def check_task(run, n_seq=1000, pairs=8):
    """A task from a file: its contract and a short form of its posterior's check against its own sampler
    (oracles.check, n_seq sequences), refused in one line where either fails; the built-ins' pass it (a test)."""
    if "task" not in run.files or os.environ.get("RANK", "0") != "0":
        return
    try:
        why = failed(check(run.tasks["default"], n_seq=n_seq, pairs=pairs, say=lambda line: None))
    except Broken as e:
        raise ValueError(f"--task {run.task} breaks the task contract (README, \"Bring your own task\"): {e}") from None
    if why:
        raise ValueError(f"--task {run.task}: its posterior fails the check: {why}; `python oracles.py check "
                         f"{run.task}` runs the whole check")
    print(f"posterior check of {run.tasks['default'].name} ({n_seq:,} sequences of its sampler, oracles.check): holds")


def run_guarded(run, resume_state=None, eval_only=False):
    """train_loop, with Ctrl-C, out of memory and a full disk reported in one line (runtime.guarded)."""
    if resume_state is None:
        check_task(run)
    if run.note and os.environ.get("RANK", "0") == "0":
        print(run.note, file=sys.stderr)
    return guarded(lambda proc: train_loop(run, proc, resume_state, eval_only), run.train,
                   resume_state["iter"] if resume_state else None)


def main(argv=None):
    known, given, parser = parse_args(sys.argv[1:] if argv is None else argv, __doc__)
    try:
        run, state = start(known, given)
        if given.get("dry_run"):
            print(json.dumps(run.description, indent=1))
            return 0
        return run_guarded(run, state, eval_only=bool(given.get("eval_only")))
    except ValueError as e:
        flag = re.match(r"--(curriculum|curriculum_hold) ", str(e))
        if flag and flag[1] not in given and not given.get("resume"):
            off = "''" if flag[1] == "curriculum" else "0"
            e = f"{e} (--{flag[1]} is the {known.preset} preset's: pass --{flag[1]} {off} to train without it)"
        parser.exit(2, f"{parser.prog}: error: {e}\n")


if __name__ == "__main__":
    cli(main, "train.py", "nothing was written (training had not started)")
