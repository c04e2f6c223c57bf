"""
The Pavlovian experiments that train nothing: Monte-Carlo checks of linear_attn.memory, the Hebbian associative
memory S_t = S_{t-1} + v_t k_t^T with o_t = S_t q_t, against Qiao (arXiv 2508.08289). `python conditioning.py
capacity | propagation | drift` runs them (conditioning.py holds the command line, and depth_width, which trains).

- capacity (Theorem 6, App. A.1, Eqs. 27-39): retrieval noise P_N = (n-1)/d_k of n stored pairs, the
  average-case capacity n*(gamma) < 1 + d_k/gamma and the worst case against sqrt(eps delta d_k) (capacity_point);
- propagation (Theorem 9, Def. 8, App. A.2, Eqs. 40-51): chains of L layers of H heads, error against
  L (n / (delta d_k))^H (chain_errors);
- drift (Eqs. 16-17, 22-25): hebbian, its decay, delta and oja tracking targets that move (drift_stream, track).
Every write and read goes through linear_attn.memory; a read is a step with beta = 0 (it writes nothing).
Synthetic draws are float64, from seeded torch.Generators. Each experiment returns its numbers as a dict, its
`*_figure` draws them and its `report_*` tabulates them for summary.md.
"""
import math

import torch
import torch.nn.functional as F

from linear_attn import memory

FEATURES = ("sphere", "elu+1")
COMBINE = ("best", "sum", "majority")


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
