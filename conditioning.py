"""
Theory checks of Qiao, "Understanding Transformers through the Lens of Pavlovian Conditioning" (arXiv 2508.08289).
One subcommand per experiment; each writes out/conditioning/<name>.json and <name>.png (matplotlib optional);
`--results results/conditioning` writes the committed ones.

    python conditioning.py capacity      # Theorem 6 (App. A.1, Eqs. 27-39)
    python conditioning.py propagation   # Theorem 9 (Def. 8, App. A.2, Eqs. 40-51)
    python conditioning.py depth_width   # wide-and-shallow vs narrow-and-deep, trained on `hop` through train.py
    python conditioning.py drift         # hebbian, its decay, delta, oja under concept drift (Eqs. 16-17, 22-25)
    python conditioning.py all           # the four, then summary.md (`summary`: rebuild it and the figures)

This file holds the command line and the one experiment that trains, depth_width (train.py in this process:
commandline.run_in_process); capacity, propagation and drift train nothing and are conditioning_memory.py's: Monte-Carlo
draws, float64 from seeded torch.Generators, through linear_attn.memory. What each experiment measures (noise,
SNR, capacity, chain error, the head rules, accuracy, tracking error) is defined in the docstring of its function:
capacity and capacity_point, propagation and chain_errors, depth_width, drift with drift_stream and track.
summary.md tabulates the numbers; results/conditioning.md reads them against the paper.
"""
import json
import math
import os
import sys
import time
import warnings

if __name__ == "__main__":
    from commandline import before_torch
    before_torch("conditioning.py")

import torch

import checkpoints
from commandline import Parser, check_sizes, cli, log_error, run_in_process, str2bool
from conditioning_memory import (FEATURES, capacity, capacity_figure, drift, drift_figure, propagation,
                                 propagation_figure, report_capacity, report_drift, report_propagation)
from linear_attn import RULES, LinearAttention, LinearAttentionConfig
from presets import count_params
import runtime
from tasks import make_task
import train

CELLS = (("wide", "linear"), ("deep", "linear"), ("wide", "softmax"), ("deep", "softmax"))  # depth_width's four
EXPERIMENTS = ("capacity", "propagation", "depth_width", "drift")

# -----------------------------------------------------------------------------
# wide-and-shallow vs narrow-and-deep, trained on `hop`


def depth_width(args):
    """Attention-only LinearAttention (use_mlp False), wide-and-shallow L=2, H=4 against narrow-and-deep L=8, H=1
    at the width whose parameter count is closest; the softmax twin is transformer.py at the same L, H and width
    with mlp_ratio 0 and no biases, so its MLP adds exactly zero (attention-only; its unused ln_2 weights are
    counted). Defaults: 1-hop queries, since in this token layout a k-hop query needs k + 1 layers (one binds each
    fact's b to its a, one per hop); rule delta (--rule hebbian: the paper's base model). Accuracy: exact match at
    the queries of held-out sequences; chance: 1 / (entities in context). A run whose loss or parameters stop being
    finite is a row with diverged True and accuracy None."""
    (L_ws, H_ws, d_ws), (L_nd, H_nd), rows = args.ws, args.nd, []
    for N in args.n_facts:
        opts = dict(n_facts=N, depth=args.facts_per_chain, hops=args.hops, n_entities=args.n_entities)
        task = make_task("hop", **opts)
        io = dict(vocab_size=task.vocab_size, n_classes=task.n_classes, answer_offset=task.answer_offset,
                  block_size=task.seq_len, use_mlp=False, rule=args.rule)
        size = lambda L, H, d: count_params(LinearAttentionConfig, LinearAttention,
                                            io | dict(n_layer=L, n_head=H, d_model=d))
        d_nd = min(range(H_nd, 4 * d_ws + 1, H_nd), key=lambda d: abs(size(L_nd, H_nd, d) - size(L_ws, H_ws, d_ws)))
        print(f"depth_width N={N}: wide L={L_ws} H={H_ws} d_model={d_ws}: {size(L_ws, H_ws, d_ws):,} parameters | "
              f"deep L={L_nd} H={H_nd} d_model={d_nd}: {size(L_nd, H_nd, d_nd):,}", flush=True)
        # chunks of 16: these sequences are short (2N + 9 tokens), a longer chunk would be mostly padding
        models = [("linear", "linear_attn", ["--use_mlp", "false", "--rule", args.rule, "--chunk_size", "16"])]
        models += [("softmax", "transformer", ["--mlp_ratio", "0", "--bias", "false"])] if args.twin else []
        for seed in args.seeds:
            for arch, L, H, d in [("wide", L_ws, H_ws, d_ws), ("deep", L_nd, H_nd, d_nd)]:
                for kind, model, extra in models:
                    out_dir, t0 = os.path.join(args.scratch, "depth_width", f"N{N}_{arch}_{kind}_s{seed}"), time.time()
                    flags = dict(task="hop", model=model, device="cpu", out_dir=out_dir, seed=seed, n_layer=L,
                                 n_head=H, d_model=d, max_iters=args.max_iters, batch_size=args.batch_size, lr=args.lr,
                                 eval_interval=args.max_iters, log_interval=100, eval_samples=args.eval_samples,
                                 eval_samples_during=min(100, args.eval_samples), **opts)
                    argv = [f"--{k}={v}" for k, v in flags.items()] + extra + ["--overwrite"]  # scratch runs
                    os.makedirs(out_dir, exist_ok=True)
                    log = os.path.join(out_dir, "train.log")
                    with warnings.catch_warnings():
                        warnings.simplefilter("ignore")  # the zero-width MLP's "Initializing zero-element tensors"
                        try:
                            code = run_in_process(train.main, argv, log, "w", contain=False)
                        except SystemExit as e:  # train.py refused a flag or its environment, in its log
                            code = e.code
                    if code not in (0, 1):  # 1: diverged, the loss or the parameters stopped being finite
                        raise ValueError(f"a depth_width run stopped (exit code {code}): {log_error(log)} "
                                         f"(log {log})")
                    acc = n_params = None  # a diverged run writes no results.json
                    if code == 0:
                        with open(os.path.join(out_dir, "results.json"), encoding="utf-8") as f:
                            res = json.load(f)
                        acc, n_params = res["metrics"]["default"]["accuracy"], res["n_params"]
                    rows.append(dict(N=N, arch=arch, model=kind, L=L, H=H, d_model=d, seed=seed, n_params=n_params,
                                     accuracy=acc, chance=1 / (N + N // args.facts_per_chain), diverged=code == 1))
                    what = f"diverged (see {log})" if code else f"({n_params:,} parameters): accuracy {acc:.3f}"
                    print(f"  N={N} seed {seed} {arch} {kind} {what} [{time.time() - t0:.0f}s]", flush=True)
    return dict(settings={k: getattr(args, k) for k in ("rule", "hops", "max_iters", "batch_size", "lr", "n_entities",
                                                        "facts_per_chain")}, rows=rows)


def accuracies(rows, N, arch, kind):
    """Mean and sd over the seeds that did not diverge (nan if none), and every seed's accuracy (None: diverged)."""
    every = [r["accuracy"] for r in rows if (r["N"], r["arch"], r["model"]) == (N, arch, kind)]
    a = [x for x in every if x is not None]
    m = sum(a) / len(a) if a else float("nan")
    return m, math.sqrt(sum((x - m) ** 2 for x in a) / max(len(a) - 1, 1)) if a else float("nan"), every


def depth_width_figure(plt, r):
    fig, ax = plt.subplots(figsize=(6, 4.2))
    Ns = sorted({x["N"] for x in r["rows"]})
    for (arch, kind), m in zip(CELLS, ("o-", "s-", "o--", "s--")):
        st = [accuracies(r["rows"], N, arch, kind) for N in Ns]
        if any(s[2] for s in st):  # the cell was run
            ax.errorbar(Ns, [s[0] for s in st], [s[1] for s in st], fmt=m, capsize=3, label=f"{arch} {kind}")
    ax.plot(Ns, [next(x["chance"] for x in r["rows"] if x["N"] == N) for N in Ns], "k:", label="chance")
    ax.set(xlabel="N facts in context", ylabel="accuracy (mean, sd over seeds)",
           title="hop: wide-shallow vs narrow-deep")
    return fig


def report_depth_width(r):
    s, rows = r["settings"], r["rows"]
    out = ["## Wide-and-shallow vs narrow-and-deep (`hop`)", "",
           f"{s['hops']}-hop queries, {s['facts_per_chain']} facts per chain, {s['n_entities']} entities; linear rule "
           f"{s['rule']}; {s['max_iters']} steps of batch {s['batch_size']}, lr {s['lr']:g}. Accuracy: mean, sd over "
           "the seeds that did not diverge (per seed); (L, H, d_model, parameters).", "",
           "| N | chance | wide linear | deep linear | wide softmax | deep softmax |", "|---|---|---|---|---|---|"]
    pairs = []  # (N, kind, wide mean, deep mean, chance)
    for N in sorted({x["N"] for x in rows}):
        cells, means = [], {}
        for arch, kind in CELLS:
            m, sd, every = means[arch, kind] = accuracies(rows, N, arch, kind)
            cell = [x for x in rows if (x["N"], x["arch"], x["model"]) == (N, arch, kind)]
            if not cell:
                cells.append("not run")
                continue
            x, n = cell[0], next((x["n_params"] for x in cell if x["n_params"] is not None), None)
            d = x.get("d_model", x.get("n_embd"))  # rows written before the rename hold n_embd
            seeds = ", ".join("diverged" if v is None else f"{v:.2f}" for v in every)
            cells.append(("diverged" if math.isnan(m) else f"{m:.3f}, {sd:.3f}") + f" ({seeds}); ({x['L']}, {x['H']}, "
                         f"{d}, {'?' if n is None else f'{n:,}'})")
        chance = next(x["chance"] for x in rows if x["N"] == N)
        out.append(f"| {N} | {chance:.3f} | " + " | ".join(cells) + " |")
        pairs += [(N, kind, means["wide", kind][0], means["deep", kind][0], chance) for kind in ("linear", "softmax")
                  if means["wide", kind][2] and means["deep", kind][2]]
    num = lambda v, fmt=".3f": "—" if math.isnan(v) else format(v, fmt)
    out += ["", "Wide against deep: mean accuracy (—: every seed diverged).", "",
            "| N | model | wide | deep | wide - deep | 2 x chance |", "|---|---|---|---|---|---|"]
    out += [f"| {N} | {kind} | {num(w)} | {num(d)} | {num(w - d, '+.3f')} | {2 * c:.3f} |"
            for N, kind, w, d, c in pairs]
    return out + [""]


# -----------------------------------------------------------------------------
# command line


def summary(results):
    lines = ["# Conditioning experiments (Qiao, arXiv 2508.08289)", "", "From the json files that `python "
             "conditioning.py all` wrote beside this file; every number is measured by that run. Definitions of noise, "
             "SNR, capacity, error and success criteria: the docstrings of conditioning.py's experiments; what the "
             "numbers say: [../conditioning.md](../conditioning.md). Wall time: " + ", ".join(
                 f"{name} {results[name]['wall_s']:.0f}s" for name in EXPERIMENTS if name in results) + ".", ""]
    reports = dict(capacity=report_capacity, propagation=report_propagation, depth_width=report_depth_width,
                   drift=report_drift)
    return "\n".join(lines + [line for name in EXPERIMENTS if name in results for line in reports[name](results[name])])


def variant(s):
    rule, _, param = s.partition("@")
    if rule not in RULES:
        raise ValueError(f"unknown rule {rule!r} in {s!r}; valid: {', '.join(RULES)}")
    try:
        value = float(param) if param else None if rule == "hebbian" else 1.0
    except ValueError:
        value = math.nan
    if value is not None and not 0 < value <= 1:  # hebbian's decay, delta's and oja's beta (linear_attn.memory)
        what = "decay" if rule == "hebbian" else "beta"
        raise ValueError(f"{s!r}: the value after @ ({rule}'s {what}) must be a number in (0, 1]")
    return s, rule, value


FLAGS = {  # name: (default, help, experiments)
    "results": ("out/conditioning", "where the json, png and summary.md go (results/conditioning: the committed ones)",
                EXPERIMENTS),
    "scratch": ("out/conditioning", "the training runs go under SCRATCH/depth_width", ("depth_width",)),
    "seed": (0, "seed of the synthetic draws", EXPERIMENTS),
    "threads": (0, "torch CPU threads (0: torch's default)", EXPERIMENTS),
    "d_ks": ([16, 32, 64, 128, 256, 512], "key dimensions d_k (= d_v)", ("capacity",)),
    "features": (list(FEATURES), f"key features: {' | '.join(FEATURES)}", ("capacity",)),
    "trials": (200, "trials per (d_k, n) for d_k <= 128; times 128/d_k above, at least 50", ("capacity",)),
    "gamma": (4.0, "SNR that the average-case capacity n*(gamma) requires", ("capacity",)),
    "eps": (0.1, "allowed probability that any stored item fails (worst case)", ("capacity",)),
    "delta": (0.5, "noise threshold: a retrieval fails when |S k - v|^2 >= delta", ("capacity", "propagation")),
    "prop_d_k": (32, "d_k = d_v of every head", ("propagation",)),
    "ratios": ([0.125, 0.25, 0.5, 1.0], "pairs stored per head, as n/d_k", ("propagation",)),
    "depths": ([1, 2, 4, 8], "depths L", ("propagation",)),
    "heads": ([1, 2, 4, 8], "heads per layer H", ("propagation",)),
    "chains": (8192, "chains per n (every stored pair starts one)", ("propagation",)),
    "criterion": ("threshold", "head success: threshold (noise < delta, the theorem's) | decode (nearest stored value)",
                  ("propagation",)),
    "n_facts": ([4, 8], "N facts in context (hop task)", ("depth_width",)),
    "seeds": ([0, 1, 2], "training seeds", ("depth_width",)),
    "ws": ([2, 4, 64], "wide-and-shallow: n_layer n_head d_model", ("depth_width",)),
    "nd": ([8, 1], "narrow-and-deep: n_layer n_head (d_model: the closest parameter count)", ("depth_width",)),
    "rule": ("delta", f"memory rule of the linear models: {' | '.join(RULES)}", ("depth_width",)),
    "twin": (True, "also train the softmax twin (transformer.py, attention-only)", ("depth_width",)),
    "max_iters": (500, "training steps", ("depth_width",)),
    "batch_size": (64, "sequences per step", ("depth_width",)),
    "lr": (3e-3, "peak learning rate", ("depth_width",)),
    "eval_samples": (500, "held-out sequences for the accuracy", ("depth_width",)),
    "n_entities": (32, "entity vocabulary of the hop task", ("depth_width",)),
    "facts_per_chain": (2, "facts per chain (hop's --depth)", ("depth_width",)),
    "hops": (1, "k of the k-hop queries", ("depth_width",)),
    "variants": (["hebbian", "hebbian@0.99", "hebbian@0.9", "delta@1", "delta@0.5", "oja@1", "oja@0.1"],
                 "rule@param: hebbian@decay, delta@beta, oja@beta (no @: 1)", ("drift",)),
    "n_keys": (32, "M keys in the stream", ("drift",)),
    "drift_d": (64, "d_k = d_v", ("drift",)),
    "steps": (3000, "stream length T", ("drift",)),
    "period": (500, "abrupt drift: steps between switches", ("drift",)),
    "sigma": (0.05, "gradual drift: step size of each target's random walk", ("drift",)),
    "keys": ("random", "random (unit sphere) | orthonormal (needs n_keys <= drift_d)", ("drift",)),
    "tol": (0.1, "re-convergence: tracking error at most this", ("drift",)),
    "norm_every": (10, "record |S|_F and the error curve every this many steps", ("drift",)),
}
CHOICES = dict(features=FEATURES, criterion=("threshold", "decode"), rule=RULES, keys=("random", "orthonormal"))


def parse_args(argv):
    p = Parser(prog="conditioning.py", description=__doc__.strip().split("\n\n")[0], allow_abbrev=False)
    commands = EXPERIMENTS + ("all", "summary")
    sub = p.add_subparsers(dest="command", required=True, metavar="{" + ",".join(commands) + "}")
    for name in commands:
        helps = dict(all="the four, then summary.md", summary="rebuild summary.md and the figures from the json files")
        sp = sub.add_parser(name, allow_abbrev=False, help=helps.get(name))
        for flag, (default, help, where) in FLAGS.items():
            if name == "all" or name in where or name == "summary" and flag == "results":
                kw = dict(nargs="+", type=type(default[0])) if isinstance(default, list) else dict(type=type(default))
                kw = dict(type=str2bool) if isinstance(default, bool) else kw
                sp.add_argument(f"--{flag}", default=default, choices=CHOICES.get(flag),
                                help=f"{help} (default {default})", **kw)
    args = p.parse_args(argv)
    for flag, (default, _, _) in FLAGS.items():
        values = getattr(args, flag, None)
        if values is None:  # not a flag of this subcommand
            continue
        values = values if isinstance(values, list) else [values]
        if type(values[0]) is float and not all(math.isfinite(v) for v in values):
            p.error(f"--{flag} must be a finite number, got {' '.join(map(str, values))}")
        if flag not in ("seed", "seeds", "threads") and type(values[0]) in (int, float) and min(values) <= 0:
            p.error(f"--{flag} must be > 0, got {' '.join(map(str, values))}")
        if flag == "eps" and values[0] >= 1:
            p.error(f"--eps is a probability: it must be < 1, got {values[0]}")
        if flag == "threads" and values[0] < 0:
            p.error(f"--threads must be >= 0 (0: torch's default), got {values[0]}")
        if flag in ("ws", "nd") and len(values) != len(default):
            p.error(f"--{flag} takes {len(default)} numbers: {FLAGS[flag][1]}")
    check_sizes(p, getattr(args, "threads", None), [getattr(args, "seed", 0)])
    check_sizes(p, seeds=getattr(args, "seeds", []), seed_flag="--seeds")
    if hasattr(args, "norm_every") and args.norm_every >= args.steps:  # |S|_F twice at least: its growth
        p.error(f"--norm_every ({args.norm_every}) must be less than --steps ({args.steps})")
    try:
        args.variants = [variant(v) for v in getattr(args, "variants", [])]
    except ValueError as e:
        p.error(f"--variants: {e}")
    if args.command == "summary" and not os.path.isdir(args.results):
        p.error(f"--results {args.results}: no such folder (run an experiment first, or pass its --results)")
    try:  # before the work, not after it
        for flag in ("results", "scratch"):
            if hasattr(args, flag):
                checkpoints.check_out_dir(getattr(args, flag), f"--{flag}")
    except ValueError as e:
        p.error(str(e))
    return args, p


def save_figure(figure, result, path):
    """The experiment's figure from its json, if matplotlib is there; True if written."""
    plt = runtime.pyplot()
    if plt is None:  # no figures; the json and summary.md still come out
        return False
    fig = figure(plt, result)
    for a in fig.axes:
        a.legend(fontsize=7)
    fig.tight_layout()
    checkpoints.write_file(path, lambda tmp: fig.savefig(tmp, dpi=110, format="png"))
    plt.close(fig)
    return True


def load_result(name, path):
    """An experiment's json, checked by reading it into its summary: a corrupt or foreign one -> ValueError
    naming the file."""
    try:
        with open(path, encoding="utf-8") as f:
            result = json.load(f)
        summary({name: result})
    except json.JSONDecodeError as e:
        raise ValueError(f"{path}: not valid JSON ({e}); rerun `conditioning.py {name}`") from None
    except (KeyError, TypeError, IndexError, AttributeError) as e:
        what = f"lacks the key {e}" if isinstance(e, KeyError) else f"is not what conditioning.py writes ({e})"
        raise ValueError(f"{path} {what}; rerun `conditioning.py {name}`") from None
    return result


def main(argv=None):
    args, p = parse_args(sys.argv[1:] if argv is None else argv)
    torch.set_num_threads(getattr(args, "threads", 0) or torch.get_num_threads())
    steps = dict(capacity=(capacity, capacity_figure), propagation=(propagation, propagation_figure),
                 depth_width=(depth_width, depth_width_figure), drift=(drift, drift_figure))
    path = lambda name, ext: os.path.join(args.results, f"{name}.{ext}")
    try:
        for name in {"all": EXPERIMENTS, "summary": ()}.get(args.command, (args.command,)):
            t0 = time.time()
            result = steps[name][0](args)
            result["wall_s"] = time.time() - t0
            checkpoints.write_json(path(name, "json"), result)
            png = save_figure(steps[name][1], result, path(name, "png"))
            print(f"wrote {path(name, 'json')}{' and .png' if png else ''} [{result['wall_s']:.0f}s]", flush=True)
        if args.command in ("all", "summary"):
            results = {}
            for name in EXPERIMENTS:
                if os.path.exists(path(name, "json")):
                    results[name] = load_result(name, path(name, "json"))
                    if args.command == "summary":  # the figures too, from the same json
                        save_figure(steps[name][1], results[name], path(name, "png"))
            if not results:  # an empty summary.md would read as if the experiments had found nothing
                names = ", ".join(f"{n}.json" for n in EXPERIMENTS)
                raise ValueError(f"no experiment's JSON in {args.results} ({names}): run `conditioning.py all "
                                 f"--results {args.results}` first, or pass the folder that holds them")
            checkpoints.write_text(path("summary", "md"), summary(results))
            print(f"wrote {path('summary', 'md')}")
    except ValueError as e:  # bad sizes reach the memory or the task as ValueError
        p.exit(2, f"conditioning.py: error: {e}\n")
    except OSError as e:  # a full disk, a folder made read-only: every file is written whole or not at all
        p.exit(1, f"conditioning.py: error: {f'{e.filename}: {e.strerror}' if e.filename else e}; "
               "the files written before it are kept\n")
    return 0


if __name__ == "__main__":
    cli(main, "conditioning.py", "the experiments already written are kept")
