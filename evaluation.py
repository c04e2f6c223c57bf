"""
The held-out checks: metrics against the exact posterior on sequences of their own (evaluate), the rule that ends a
run at its target or plateau (--stop_at, --patience: StopRule), the verdict of a check during training
(evaluate_during), and the final evaluation into results.json (final_eval).
"""
import math
import os
import re
import time

import torch

from checkpoints import code_version, print0, write_json
from oracles import Metrics
from runtime import fmt_time, oom_hint, say_eta


def during_seed(train):
    """The seed of the evaluations during training (--eval_seed_during; -1: --eval_seed + 1)."""
    return train["eval_seed"] + 1 if train["eval_seed_during"] == -1 else train["eval_seed_during"]

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

# -----------------------------------------------------------------------------
# held-out metrics: during training, and at its end


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


def evaluate_during(model, fwd, task, train, proc, ctx, at_eval, state, stop):
    """Rank 0's verdict at a step that saves (proc.ckpts.due), and the held-out metrics (without curves) it rests on:
    ("diverged", None) if the parameters or metrics are not finite (said), ("reached", metrics, why under "stopped")
    where the stop rule ends the run, else ("go on", metrics; None at a snapshot). state(): ckpt.pt, saved first."""
    if not all(torch.isfinite(p).all() for p in model.parameters()):
        proc.diverged("parameters are not finite", proc.step)
        return "diverged", None
    if not at_eval:
        return "go on", None
    proc.ckpts.save_first(state)
    r = evaluate(fwd, task, train["eval_samples_during"], during_seed(train), proc.device, ctx, proc.eval_batch,
                 flag="--eval_samples_during")
    if not all(math.isfinite(v) for v in r.values() if isinstance(v, float)):
        proc.diverged("held-out metrics are not finite", proc.step)
        return "diverged", None
    r = {k: v for k, v in r.items() if not isinstance(v, list)}
    return ("reached", r | {"stopped": stop.reason}) if stop(r) else ("go on", r)


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
