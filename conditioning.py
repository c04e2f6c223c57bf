"""
Theory checks of Qiao, "Understanding Transformers through the Lens of Pavlovian Conditioning" (arXiv 2508.08289).
One subcommand per experiment; each writes out/conditioning/<name>.json and <name>.png (matplotlib optional);
`--results results/conditioning` writes the committed ones.

    python conditioning.py capacity      # Theorem 6 (App. A.1, Eqs. 27-39)
    python conditioning.py propagation   # Theorem 9 (Def. 8, App. A.2, Eqs. 40-51)
    python conditioning.py depth_width   # wide-and-shallow vs narrow-and-deep, trained on `hop` through train.py
    python conditioning.py drift         # hebbian, its decay, delta, oja under concept drift (Eqs. 16-17, 22-25)
    python conditioning.py all           # the four, then summary.md (`summary`: rebuild it and the figures)

Every memory write and read goes through linear_attn.memory; a read is a step with beta = 0 (it writes nothing).
Synthetic draws are float64, from seeded torch.Generators. What each experiment measures (noise, SNR, capacity,
chain error, the head rules, accuracy, tracking error) is defined in the docstring of its function: capacity and
capacity_point, propagation and chain_errors, depth_width, drift with drift_stream and track. summary.md tabulates
the numbers; results/conditioning.md reads them against the paper.
"""
import json
import math
import os
import sys
import time
import warnings

import torch
import torch.nn.functional as F

import checkpoints
import presets
import runtime
import train
from linear_attn import RULES, LinearAttention, LinearAttentionConfig, memory
from presets import count_params
from tasks import make_task

FEATURES = ("sphere", "elu+1")
COMBINE = ("best", "sum", "majority")
CELLS = (("wide", "linear"), ("deep", "linear"), ("wide", "softmax"), ("deep", "softmax"))  # depth_width's four
EXPERIMENTS = ("capacity", "propagation", "depth_width", "drift")


def unit(*shape, g):
    return F.normalize(torch.randn(*shape, generator=g, dtype=torch.float64), dim=-1)


def store_and_read(K, V, Q, budget=1 << 22):
    """K (B, H, n, d_k), V (B, H, n, d_v), Q (B, H, m, d_k) -> S_n q for every query (B, H, m, d_v), with
    S_n = sum_j v_j k_j^T: one stream of n writes then m reads. One chunk (the parallel form) spares short streams
    the padding to a full chunk; the batch is split to bound the (T, T) weights."""
    n, m = K.shape[2], Q.shape[2]
    step, outs = max(1, budget // (K.shape[1] * (n + m) * max(n + m, K.shape[3], V.shape[3]))), []
    for K_, V_, Q_ in zip(K.split(step), V.split(step), Q.split(step)):
        beta = torch.cat([K_.new_ones(K_.shape[:3]), K_.new_zeros(Q_.shape[:3])], 2)
        k, v = torch.cat([K_, Q_], 2), torch.cat([V_, V_.new_zeros(*Q_.shape[:3], V_.shape[3])], 2)
        outs.append(memory(k, k, v, "hebbian", beta, chunk_size=n + m)[0][:, :, n:])
    return torch.cat(outs)


def largest(ok, hi):
    """The largest n in 1..hi with ok(n), for ok true at 1 and monotone: double, then bisect."""
    lo = 1
    while lo < hi and ok(min(2 * lo, hi)):
        lo = min(2 * lo, hi)
    up = min(2 * lo, hi)
    while up - lo > 1:
        mid = (lo + up) // 2
        lo, up = (mid, up) if ok(mid) else (lo, mid)
    return lo


def fit(x, y):
    """Least-squares line y = a x + b: (a, b, R^2)."""
    mx, my = sum(x) / len(x), sum(y) / len(y)
    sxx, sxy, syy = (sum((u - mx) * (w - my) for u, w in zip(p, q)) for p, q in ((x, x), (x, y), (y, y)))
    a = sxy / sxx if sxx else 0.0
    return a, my - a * mx, (sxy * sxy / (sxx * syy) if sxx and syy else 1.0)


def median(xs):
    xs = sorted(xs)
    return xs[len(xs) // 2] if xs else float("nan")

# -----------------------------------------------------------------------------
# capacity (Theorem 6)


def capacity_point(d_k, n, kind, trials, delta, seed):
    """S = sum_j v_j k_j^T over n pairs (hebbian, beta = 1), every stored key queried, in each of `trials` draws.
    Values uniform on the unit sphere; keys on the sphere (the theorem's assumption) or elu+1 features elu(x) + 1,
    x ~ N(0, I), L2-normalised (so the signal is exactly v_m in both). Retrieval noise of item m = |S k_m - v_m|^2
    (signal power 1); mean_noise = P_N, its mean over items and trials (theorem: (n-1)/d_k); p_item: the fraction
    of items with noise >= delta; p_any: the fraction of draws in which some item has."""
    g = torch.Generator().manual_seed(hash((seed, d_k, n, FEATURES.index(kind))) % (1 << 62))
    x = torch.randn(trials, 1, n, d_k, generator=g, dtype=torch.float64)
    K, V = F.normalize(F.elu(x) + 1 if kind == "elu+1" else x, dim=-1), unit(trials, 1, n, d_k, g=g)
    noise = ((store_and_read(K, V, K) - V) ** 2).sum(-1)[:, 0]  # (trials, n): |S k_m - v_m|^2
    return dict(d_k=d_k, n=n, features=kind, trials=trials, mean_noise=noise.mean().item(), theory_noise=(n - 1) / d_k,
                p_item=(noise >= delta).double().mean().item(), p_any=(noise >= delta).any(1).double().mean().item())


def capacity(args):
    """Theorem 6 per key feature and d_k. SNR = 1 / P_N. Average-case capacity n*(gamma) = the largest n with
    SNR >= gamma (theorem: n < 1 + d_k/gamma). Worst-case capacity = the largest n with P(some of the n items has
    noise >= delta) <= eps, against the bound sqrt(eps delta d_k). Both found by doubling, then bisecting n; fits:
    n*(gamma) against d_k, and log worst case against log d_k."""
    points, caps, fits = [], [], {}
    for kind in args.features:
        for d_k in args.d_ks:
            trials, cache = max(50, round(args.trials * min(1.0, 128 / d_k))), {}

            def at(n):  # both searches share the measured points
                if n not in cache:
                    cache[n] = capacity_point(d_k, n, kind, trials, args.delta, args.seed)
                return cache[n]
            n_avg = largest(lambda n: at(n)["mean_noise"] <= 1 / args.gamma, 2 * d_k)  # SNR = 1 / P_N >= gamma
            n_wc = largest(lambda n: at(n)["p_any"] <= args.eps, 2 * d_k)
            bound = math.sqrt(args.eps * args.delta * d_k)
            caps.append(dict(features=kind, d_k=d_k, trials=trials, n_avg=n_avg, theory_avg=1 + d_k / args.gamma,
                             n_wc=n_wc, bound=bound, looseness=n_wc / bound))
            points += sorted(cache.values(), key=lambda p: p["n"])
            print(f"capacity {kind:6s} d_k={d_k:4d}: n*(gamma) = {n_avg} (1 + d_k/gamma = {1 + d_k / args.gamma:.1f})"
                  f" | worst case {n_wc}, bound {bound:.2f} ({n_wc / bound:.1f}x)", flush=True)
        c = [r for r in caps if r["features"] == kind]
        fits[kind] = dict(avg_vs_dk=fit([r["d_k"] for r in c], [r["n_avg"] for r in c]),  # slope, intercept, R^2
                          wc_loglog=fit([math.log(r["d_k"]) for r in c], [math.log(r["n_wc"]) for r in c]))
    return dict(settings=dict(gamma=args.gamma, delta=args.delta, eps=args.eps, seed=args.seed),
                capacity=caps, points=points, fits=fits)


def capacity_figure(plt, r):
    fig, ax = plt.subplots(1, 3, figsize=(15, 4.2))
    s, dks = r["settings"], sorted({x["d_k"] for x in r["capacity"]})
    for kind, m in zip(r["fits"], "os"):
        p = [x for x in r["points"] if x["features"] == kind and x["n"] > 1]
        c = [x for x in r["capacity"] if x["features"] == kind]
        ax[0].loglog([x["theory_noise"] for x in p], [x["mean_noise"] for x in p], m, ms=3, label=kind)
        ax[1].plot(dks, [x["n_avg"] for x in c], m + "-", label=kind)
        ax[2].loglog(dks, [x["n_wc"] for x in c], m + "-", label=f"{kind}, measured")
    ax[0].loglog([1e-3, 4], [1e-3, 4], "k--", lw=1, label="(n-1)/d_k")
    ax[1].plot(dks, [1 + d / s["gamma"] for d in dks], "k--", lw=1, label="1 + d_k/gamma")
    ax[2].loglog(dks, [math.sqrt(s["eps"] * s["delta"] * d) for d in dks], "k--", lw=1, label="sqrt(eps delta d_k)")
    ax[0].set(xlabel="(n-1)/d_k", ylabel="mean |S k - v|^2", title="retrieval noise")
    ax[1].set(xlabel="d_k", ylabel="n*", title=f"average-case capacity: SNR >= {s['gamma']:g}")
    ax[2].set(xlabel="d_k", ylabel="n", title=f"worst case: P(any noise >= {s['delta']:g}) <= {s['eps']:g}")
    ax[2].set_xticks(dks, [str(d) for d in dks], minor=False)
    ax[2].minorticks_off()
    return fig


def report_capacity(r):
    s = r["settings"]
    out = ["## Capacity (Theorem 6)", "", f"gamma = {s['gamma']:g}, delta = {s['delta']:g}, eps = {s['eps']:g}.", "",
           "| keys | d_k | trials | n*(gamma) | 1 + d_k/gamma | worst case n | sqrt(eps delta d_k) "
           "| measured / bound |",
           "|---|---|---|---|---|---|---|---|"] + [
           f"| {c['features']} | {c['d_k']} | {c['trials']} | {c['n_avg']} | {c['theory_avg']:.1f} | {c['n_wc']} | "
           f"{c['bound']:.2f} | {c['looseness']:.1f} |" for c in r["capacity"]] + [""]
    out += ["Per key feature, over the points with n > 1 (and, where any, (n-1) x trials >= 1000: enough crosstalk "
            "terms for a mean): mean noise over (n-1)/d_k (theorem: 1), the noise per other stored pair (theorem: "
            f"1/d_k), the line n*(gamma) = a d_k + b (theorem: a = 1/gamma = {1 / s['gamma']:.4f}), the worst case "
            "n ~ d_k^e (the bound: e = 0.5), and the d_k where the worst case is below the bound.", "",
            "| keys | points | noise / ((n-1)/d_k) | noise per pair | a | b | R^2 | a x gamma | e | R^2 "
            "| worst case < bound at d_k |", "|---|---|---|---|---|---|---|---|---|---|---|"]
    for kind, f in r["fits"].items():
        (a, b, r2), (e, _, r2e) = f["avg_vs_dk"], f["wc_loglog"]
        pts = [p for p in r["points"] if p["features"] == kind and p["n"] > 1]
        pts = [p for p in pts if (p["n"] - 1) * p["trials"] >= 1000] or pts
        ratio, pair = [p["mean_noise"] / p["theory_noise"] for p in pts], [p["mean_noise"] / (p["n"] - 1) for p in pts]
        below = [str(x["d_k"]) for x in r["capacity"] if x["features"] == kind and x["n_wc"] < x["bound"]]
        out.append(f"| {kind} | {len(pts)} | {min(ratio):.3f} to {max(ratio):.3f} | {min(pair):.4f} to {max(pair):.4f} "
                   f"| {a:.4f} | {b:+.2f} | {r2:.4f} | {a * s['gamma']:.3f} | {e:.2f} | {r2e:.3f} "
                   f"| {', '.join(below) or 'none'} |")
    return out + [""]

# -----------------------------------------------------------------------------
# error propagation (Theorem 9)


def chain_errors(R, V, n_layers, delta, heads, depths, criterion="threshold"):
    """R (trials * n_layers, H_max, n, d_v): the heads' read-outs of every stored key; V (trials * n_layers, n, d_v)
    the values -> {rule: {H: {L: error}}}: chain m fails unless pair m's hop succeeds in each of the first L layers.
    A head succeeds iff its noise |r_h - v|^2 < delta (the theorem's event; criterion decode: iff the nearest stored
    value to r_h is v). Head combination: best = any head succeeds (oracle selection, the theorem's OR); sum = the
    heads' read-outs averaged (a layer's W_O sums them; the average keeps the signal at v), then the same test;
    majority = more than H/2 heads succeed."""
    def ok(r):  # (B, [H,] n, d_v) -> (B, [H,] n) bool
        v = V[:, None] if r.dim() == 4 else V
        if criterion == "threshold":
            return ((r - v) ** 2).sum(-1) < delta
        return (r @ v.transpose(-1, -2)).argmax(-1) == torch.arange(V.shape[1])  # nearest stored value is v_m
    head_ok, out = ok(R), {rule: {} for rule in COMBINE}
    for H in heads:
        layer_ok = dict(best=head_ok[:, :H].any(1), sum=ok(R[:, :H].mean(1)), majority=head_ok[:, :H].sum(1) > H / 2)
        for rule, lo in layer_ok.items():
            lo = lo.view(-1, n_layers, lo.shape[-1])  # (trials, layers, n)
            out[rule][H] = {L: 1 - lo[:, :L].all(1).double().mean().item() for L in depths}
    return out


def propagation(args):
    """Theorem 9: L layers of H heads; each head holds its own memory of n random pairs (independent unit key codes
    per head, shared value codes: the theorem's independent heads), each layer independent pairs; every stored pair
    starts a chain, which succeeds iff its hop succeeds in each of the L layers (chain_errors). Error = the fraction
    of failed chains, against the theorem's L (n / (delta d_k))^H. L_slopes: per rule, the log-log slopes of error
    against L of the (n, H) cells with 0 < error < 0.5 at three or more depths."""
    d, L_max, H_max, rows = args.prop_d_k, max(args.depths), max(args.heads), []
    for ratio in args.ratios:
        n = max(2, round(ratio * d))
        trials, g = math.ceil(args.chains / n), torch.Generator().manual_seed(args.seed + n)
        K, V = unit(trials * L_max, H_max, n, d, g=g), unit(trials * L_max, n, d, g=g)  # keys per head, shared values
        errs = chain_errors(store_and_read(K, V[:, None].expand(-1, H_max, -1, -1), K), V, L_max, args.delta,
                            args.heads, args.depths, args.criterion)
        rows += [dict(rule=rule, n=n, H=H, L=L, error=errs[rule][H][L], chains=trials * n,
                      bound=L * (n / (args.delta * d)) ** H)
                 for rule in COMBINE for H in args.heads for L in args.depths]
        print(f"propagation n/d_k={n / d:g}: layer error, one head {errs['best'][1][1]:.4f}; {H_max} heads: best "
              f"{errs['best'][H_max][1]:.2e}, sum {errs['sum'][H_max][1]:.2e}, "
              f"majority {errs['majority'][H_max][1]:.2e}")
    slopes = {}  # log-log slope of error against L per (rule, n, H), where 0 < error < 0.5
    for rule in COMBINE:
        cells = [[(math.log(r["L"]), math.log(r["error"])) for r in rows if (r["rule"], r["n"], r["H"]) == (rule, n, H)
                  and 0 < r["error"] < 0.5] for n in sorted({r["n"] for r in rows}) for H in args.heads]
        slopes[rule] = sorted(fit(*zip(*c))[0] for c in cells if len(c) >= 3)
    return dict(settings=dict(d_k=d, delta=args.delta, criterion=args.criterion, seed=args.seed), rows=rows,
                L_slopes=slopes)


def propagation_figure(plt, r):
    fig, ax = plt.subplots(1, 3, figsize=(15, 4.2), sharey=True)
    for a, rule in zip(ax, COMBINE):
        for H, m in zip(sorted({x["H"] for x in r["rows"]}), "os^vD<>"):
            p = [x for x in r["rows"] if x["rule"] == rule and x["H"] == H and x["error"] > 0]
            a.loglog([x["bound"] for x in p], [x["error"] for x in p], m, ms=4, label=f"H={H}")
        a.loglog([1e-4, 1e3], [1e-4, 1e3], "k--", lw=1, label="error = bound")
        a.set(xlabel="L (n / (delta d_k))^H", title=f"{rule} ({r['settings']['criterion']})", ylim=(1e-5, 1.5))
    ax[0].set_ylabel("chain error (zero errors not shown)")
    return fig


def report_propagation(r):
    s, rows = r["settings"], r["rows"]
    Hs, ns, Ls = (sorted({x[k] for x in rows}) for k in ("H", "n", "L"))
    errors = {(x["rule"], x["n"], x["H"], x["L"]): x["error"] for x in rows}
    get = lambda rule, n, H, L=1: errors[rule, n, H, L]
    bound = lambda n, H, L=1: L * (n / (s["delta"] * s["d_k"])) ** H
    out = ["## Error propagation (Theorem 9)", "", f"d_k = {s['d_k']}, delta = {s['delta']:g}, criterion "
           f"`{s['criterion']}`, at least {min(x['chains'] for x in rows):,} chains per n. Layer error (L = 1), "
           "best / sum / majority (bound (n/(delta d_k))^H):", "",
           "| H | " + " | ".join(f"n/d_k = {n / s['d_k']:g}" for n in ns) + " |",
           "|---|" + "---|" * len(ns)]
    out += [f"| {H} | " + " | ".join(" / ".join(f"{get(rule, n, H):.2g}" for rule in COMBINE) + f" ({bound(n, H):.2g})"
                                     for n in ns) + " |" for H in Hs]
    n = next((n for n in ns if 0.05 < get("best", n, 1) < 0.9), ns[0])  # a layer error p in the readable range
    p = get("best", n, 1)
    out += ["", f"Depth: n/d_k = {n / s['d_k']:g}, H = 1, layer error p = {p:.3f}; chains of independent layers "
            "fail with probability 1 - (1 - p)^L.", "", "| L | chain error | 1 - (1 - p)^L |", "|---|---|---|"]
    out += [f"| {L} | {get('best', n, 1, L):.3f} | {1 - (1 - p) ** L:.3f} |" for L in Ls]
    out += ["", "Log-log slope of chain error against L over the cells (n, H) with 0 < error < 0.5 at three or more "
            "depths (linear growth: 1).", "", "| rule | cells | median slope |", "|---|---|---|"]
    out += [f"| {rule} | {len(sl)} | {median(sl):.2f} |" for rule, sl in r["L_slopes"].items()]
    out += ["", f"Heads: layer error (L = 1) at n/d_k = {n / s['d_k']:g}; independent heads, one of which must "
            "succeed, fail with probability p^H.", "", "| H | p^H | " + " | ".join(COMBINE) + " |",
            "|---|---|" + "---|" * len(COMBINE)]
    out += [f"| {H} | {p ** H:.2g} | " + " | ".join(f"{get(rule, n, H):.2g}" for rule in COMBINE) + " |" for H in Hs]
    cells = [x for x in rows if x["bound"] < 1]
    held = [x for x in cells if x["error"] <= x["bound"]]
    loose = [x["bound"] / x["error"] for x in held if x["error"] > 0]
    out += ["", "The bound L (n/(delta d_k))^H over the cells (rule, n, H, L) where it is < 1.", "",
            "| cells with bound < 1 | error <= bound | median bound / error (error > 0) |", "|---|---|---|",
            f"| {len(cells)} | {len(held)} | {median(loose):.0f} |" if loose else
            f"| {len(cells)} | {len(held)} | — |"]
    return out + [""]

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
                        code = runtime.run_in_process(train.main, argv, log, "w", contain=False)
                    if code not in (0, 1):  # 1: diverged, the loss or the parameters stopped being finite
                        raise ChildProcessError(code, f"train.py stopped with exit code {code} (the log says why)", log)
                    acc = n_params = None  # a diverged run writes no results.json
                    if code == 0:
                        with open(os.path.join(out_dir, "results.json")) as f:
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
# concept drift


def drift_stream(kind, n_keys, d, steps, period, sigma, keys, g):
    """Keys (M, d), the key written at each step (T,), every target at every step (T, M, d). M fixed keys; each
    step writes (k_i, v_t(i)) for a uniformly random i. Abrupt: all targets redrawn every `period` steps; gradual:
    each step every target moves v <- normalize(v + sigma xi), xi ~ N(0, I/d_v)."""
    if keys == "orthonormal" and n_keys > d:
        raise ValueError(f"{n_keys} orthonormal keys need d_k >= {n_keys}, got {d}")
    K = (torch.linalg.qr(torch.randn(d, n_keys, generator=g, dtype=torch.float64))[0].T if keys == "orthonormal"
         else unit(n_keys, d, g=g))
    idx = torch.randint(n_keys, (steps,), generator=g)
    if kind == "abrupt":
        return K, idx, unit(steps // period + 1, n_keys, d, g=g).repeat_interleave(period, 0)[:steps]
    v, vs = unit(n_keys, d, g=g), []
    for _ in range(steps):
        v = F.normalize(v + sigma * torch.randn(n_keys, d, generator=g, dtype=torch.float64) / math.sqrt(d), dim=-1)
        vs.append(v)
    return K, idx, torch.stack(vs)


def track(K, idx, targets, rule, param, norm_every):
    """Write the stream by `rule`, read every key after every write (one head per key): the tracking error at
    every step (T,) and |S|_F every norm_every steps (the state memory() hands back between segments). Tracking
    error = mean over the M keys of 1 - cos(S_t k_i, v_t(i)) after the write at t (the model reads Norm(S q): only
    the direction counts)."""
    (M, d), T = K.shape, len(idx)
    writes = targets[torch.arange(T), idx]  # (T, d): v_t(i_t)
    beta, decay = (1.0, param) if rule == "hebbian" else (param, None)
    mode = "recurrent" if rule == "oja" else "chunked"  # oja's chunked form is the slower one on CPU (linear_attn.py)
    S, errs, norms = None, [], []
    for t0 in range(0, T, norm_every):
        t1 = min(T, t0 + norm_every)
        k, v = (x[None, None, t0:t1].expand(1, M, -1, -1) for x in (K[idx], writes))
        o, S = memory(K[None, :, None].expand(1, M, t1 - t0, d), k, v, rule, beta, decay, mode, S,
                      chunk_size=t1 - t0)
        o = o[0].transpose(0, 1)  # (t, M): o[t, i] = S_t k_i
        errs.append(1 - F.cosine_similarity(o, targets[t0:t1], dim=-1).mean(-1))
        norms.append(S[0, 0].norm().item())
    return torch.cat(errs), norms


def drift(args):
    """Every variant on an abrupt and a gradual stream (drift_stream, track). Re-convergence: steps after a switch
    until the error first falls to <= tol. Steady error: mean error over the last 10% of each period (abrupt) or
    the second half (gradual). Growth: max |S|_F over the second half over its max over the first (1: bounded);
    exponent: the slope of log |S|_F against log t over the second half."""
    out = dict(settings={k: getattr(args, k) for k in ("n_keys", "drift_d", "steps", "period", "sigma", "tol", "keys",
                                                       "norm_every", "seed")}, runs=[])
    for kind in ("abrupt", "gradual"):
        stream = drift_stream(kind, args.n_keys, args.drift_d, args.steps, args.period, args.sigma, args.keys,
                              torch.Generator().manual_seed(args.seed))
        switches = list(range(args.period, args.steps, args.period)) if kind == "abrupt" else []
        for name, rule, param in args.variants:
            err, norms = track(*stream, rule, param, args.norm_every)
            reconv = [next((i + 1 for i, e in enumerate(err[s:s + args.period].tolist()) if e <= args.tol), None)
                      for s in switches]
            tail = max(1, args.period // 10)  # steady error: the last 10% of each period, or the second half
            steady = (sum(err[s - tail:s].mean().item() for s in switches + [args.steps]) / (len(switches) + 1)
                      if kind == "abrupt" else err[args.steps // 2:].mean().item())
            ts, half = [min(args.steps, (i + 1) * args.norm_every) for i in range(len(norms))], len(norms) // 2
            late = [(math.log(t), math.log(x)) for t, x in zip(ts[half:], norms[half:]) if x > 0]
            out["runs"].append(dict(
                drift=kind, variant=name, reconv=reconv, steady_error=steady, norm_half=norms[half - 1],
                norm_end=norms[-1], max_norm=max(norms), growth=max(norms[half:]) / max(norms[:half]),
                exponent=fit(*zip(*late))[0] if len(late) > 2 else 0.0, t=ts, norms=norms,
                error=err[[t - 1 for t in ts]].tolist()))
            ok = [x for x in reconv if x is not None]
            print(f"drift {kind} {name}: steady error {steady:.3f} | |S|_F {norms[half - 1]:.1f} -> {norms[-1]:.1f}"
                  + (f" | re-converged after {len(ok)}/{len(reconv)} switches" + (f", median {median(ok)} steps"
                                                                                   if ok else "") if reconv else ""))
    return out


def drift_figure(plt, r):
    fig, ax = plt.subplots(2, 2, figsize=(12, 7.5))
    for row, kind in enumerate(("abrupt", "gradual")):
        for x in [x for x in r["runs"] if x["drift"] == kind]:
            ax[row, 0].plot(x["t"], x["error"], lw=1, label=x["variant"])
            ax[row, 1].semilogy(x["t"], x["norms"], lw=1, label=x["variant"])
        ax[row, 0].set(xlabel="step", ylabel="tracking error 1 - cos", title=f"{kind} drift: tracking error")
        ax[row, 1].set(xlabel="step", ylabel="|S|_F", title=f"{kind} drift: memory norm")
    return fig


def report_drift(r):
    s = r["settings"]
    out = ["## Concept drift", "", f"{s['n_keys']} {s['keys']} keys, d_k = d_v = {s['drift_d']}, {s['steps']} "
           f"steps; abrupt: all targets redrawn every {s['period']} steps; gradual: sigma = {s['sigma']:g}. Steady "
           "error: mean 1 - cos over the last 10% of each period (abrupt) or the second half (gradual). Re-converged: "
           f"switches after which the error fell to <= {s['tol']:g} (median steps). Growth: max |S|_F over the second "
           "half over its max over the first (1: bounded); exponent: slope of log |S|_F against log t over the second "
           "half.", "",
           "| drift | rule@param | steady error | re-converged | S_F at T/2 | at T | max | growth | exponent |",
           "|---|---|---|---|---|---|---|---|---|"]
    for x in r["runs"]:
        ok = [v for v in x["reconv"] if v is not None]
        rc = f"{len(ok)}/{len(x['reconv'])}" + (f" ({median(ok)})" if ok else "") if x["reconv"] else "—"
        out.append(f"| {x['drift']} | {x['variant']} | {x['steady_error']:.3f} | {rc} | {x['norm_half']:.2f} | "
                   f"{x['norm_end']:.2f} | {x['max_norm']:.2f} | {x['growth']:.2f} | {x['exponent']:.2f} |")
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
    return s, rule, float(param) if param else None if rule == "hebbian" else 1.0


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
    p = presets.Parser(prog="conditioning.py", description=__doc__.strip().split("\n\n")[0], allow_abbrev=False)
    commands = EXPERIMENTS + ("all", "summary")
    sub = p.add_subparsers(dest="command", required=True, metavar="{" + ",".join(commands) + "}")
    for name in commands:
        helps = dict(all="the four, then summary.md", summary="rebuild summary.md and the figures from the json files")
        sp = sub.add_parser(name, allow_abbrev=False, help=helps.get(name))
        for flag, (default, help, where) in FLAGS.items():
            if name == "all" or name in where or name == "summary" and flag == "results":
                kw = dict(nargs="+", type=type(default[0])) if isinstance(default, list) else dict(type=type(default))
                kw = dict(type=presets.str2bool) if isinstance(default, bool) else kw
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
        if flag == "threads" and values[0] < 0:
            p.error(f"--threads must be >= 0 (0: torch's default), got {values[0]}")
        if flag in ("ws", "nd") and len(values) != len(default):
            p.error(f"--{flag} takes {len(default)} numbers: {FLAGS[flag][1]}")
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
                    with open(path(name, "json")) as f:
                        results[name] = json.load(f)
                    if args.command == "summary":  # the figures too, from the same json
                        save_figure(steps[name][1], results[name], path(name, "png"))
            checkpoints.write_text(path("summary", "md"), summary(results))
            print(f"wrote {path('summary', 'md')}")
    except ValueError as e:  # bad sizes reach the memory or the task as ValueError
        p.exit(2, f"conditioning.py: error: {e}\n")
    except OSError as e:  # a full disk, a folder made read-only: every file is written whole or not at all
        p.exit(1, f"conditioning.py: error: {f'{e.filename}: {e.strerror}' if e.filename else e}; "
               "the files written before it are kept\n")
    return 0


if __name__ == "__main__":
    runtime.cli(main, "conditioning.py", "the experiments already written are kept")
