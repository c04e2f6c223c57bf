"""
How the weights move: AdamW or Muon, the learning-rate schedule, one training step (forward, loss, backward,
clipping, the update), as train.py's loop takes them.

- make_optimizer: AdamW on everything, or Muon on the blocks' linear maps and AdamW on the rest, under one --lr
  (Muon's update rescaled to AdamW's RMS); Optimizers steps several as one;
- Muon's Newton-Schulz iterations in bf16 where the device has it natively, in float32 where it would be emulated;
- get_lr: linear warmup, cosine decay to --min_lr_ratio, or the authors' own schedule (--lr_schedule authors);
- update: a step, once more eager if compiling failed; a model of a file whose forward raises, or whose output
  carries no gradient, is one line naming it.
"""
import math

import torch

from commandline import in_file, is_oom, raised


def make_optimizer(model, train, device, ns_dtype=torch.float32):
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
                adjust_lr_fn="match_rms_adamw", ns_dtype=ns_dtype)
    return Optimizers(adamw, muon)


class Optimizers:
    """Several optimizers over disjoint parameters, stepped as one (--optimizer muon needs two)."""

    def __init__(self, *opts):
        self.opts = opts

    @property
    def param_groups(self):  # read anew: load_state_dict replaces an optimizer's group dicts
        return [g for o in self.opts for g in o.param_groups]

    def zero_grad(self, set_to_none=True):
        for o in self.opts:
            o.zero_grad(set_to_none=set_to_none)

    def step(self):
        for o in self.opts:
            o.step()

    def state_dict(self):
        return [o.state_dict() for o in self.opts]

    def load_state_dict(self, states):
        """Each optimizer's state, keeping its own kernel flags (fused on CUDA): a CPU run resumed on a GPU
        would otherwise run the checkpoint's unfused loop."""
        states = [states] if isinstance(states, dict) else states  # checkpoints from before --optimizer
        if len(states) != len(self.opts):
            raise ValueError(f"the checkpoint holds {len(states)} optimizer states, this run has {len(self.opts)}")
        for o, state in zip(self.opts, states):
            groups = [g | {k: new[k] for k in ("fused", "foreach", "capturable") if k in new}
                      for g, new in zip(state["param_groups"], o.param_groups)]
            o.load_state_dict(state | {"param_groups": groups})


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

# -----------------------------------------------------------------------------
# the schedule, and one step


def get_lr(it, train):
    """Linear warmup to --lr, cosine down to min_lr_ratio * lr at lr_decay_iters (a resolved run's: settings.settle
    makes 0 --max_iters), then flat. `authors`: their scripts' rate, which counts steps from 1 (s = it + 1): s / w
    of --lr, then the cosine at (s - w) / (T - w)."""
    w, T = train["warmup_iters"], train["lr_decay_iters"]
    s, w1 = (it + 1, w) if train.get("lr_schedule") == "authors" else (it, w + 1)
    if s < w:
        return train["lr"] * (it + 1) / w1
    decay = 0.5 * (1 + math.cos(math.pi * min(1.0, (s - w) / max(1, T - w))))
    return train["lr"] * (train["min_lr_ratio"] + (1 - train["min_lr_ratio"]) * decay)


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
