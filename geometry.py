"""
Geometric diagnostics of a trained wind-tunnel model (arXiv 2512.22471 §6-7, v3's architecture
comparison): what the keys, queries, attention and representations look like inside.

    python geometry.py all --ckpt out/hmm_transformer         # every diagnostic that applies
    python geometry.py clusters --ckpt out/hmm_mamba --K 15   # at the K of the authors' five-cluster figure
    python geometry.py seeds out/s1 out/s2 out/s3 --out DIR   # the claims' figures over seeds of one recipe

Each writes geometry_<name>.json (the numbers) and .png (if matplotlib is installed) beside the
checkpoint, in float64, from the first --n_seq of the held-out sequences train.py's final evaluation scores
(its eval seed, drawn 250 at a time as evaluation.evaluate draws them; past its 2,000, the same stream on).
Each diagnostic's function defines what it measures:
- keys: how orthogonal the hypothesis tokens' keys are, in every variant of the paper and the authors' code;
- qk (Fig. 15): query-key cosines and attention entropy by layer;
- values (Figs. 16-17): PCA of the representations against posterior entropy H and position;
- dynamics: frame against precision over one run's checkpoints (train with --ckpt_schedule log), with every
  figure of the claims table at each checkpoint, the authors' three value-manifold protocols and, with
  --frame_seqs, their frame ratio (geometry_stats.py's docstring);
- trajectory: one run's checkpoints beside the authors' dense run, step by step (`--preset authors`);
- ablate: entropy MAE with layers and heads removed, and the authors' frame-head criterion;
- clusters (v3 "five clusters"; hmm): the argmax-state clusters against permuted labels and k-means;
- belief (Shai et al. 2024, arXiv 2405.15943): a linear probe of the whole posterior vector.
Scored positions: the task's `mask` (bijection: every key; hmm: every observation). Hypothesis tokens:
the answer tokens where answers are tokens (bijection: the V value tokens, the hypotheses pi(k), as in
the authors' jlens code; with --layout query the keys share them); hmm has no state tokens: its O observation symbols.
What each needs (why_not, lacks): keys, qk, dynamics softmax attention (transformer.Transformer); values, clusters,
belief per-layer hidden states (forward(x, return_internals=True)) and bijection or hmm, hmm, a posterior vector;
ablate forward(x, skip_layers=...) and n_layer. One that does not apply, or a missing checkpoint: a one-line error
(exit 2; `all` says what it skips and why); weights that are not finite, or a full disk
(the files written before kept whole): one line, exit 1.

Where they are: keys, qk, ablate and dynamics (the attention side) in geometry_attention.py; values, clusters
and belief here, with the command line and `seeds`; their float64 statistics and figures in geometry_stats.py; a
checkpoint as a float64 model in settings.py. A diagnostic returns (numbers for the JSON, a function drawing the
figure);
its FIGURES function picks the claims table's figures, which main writes into the JSON and seeds reads.
"""
from functools import partial
import glob
import inspect
import os
import sys

if __name__ == "__main__":
    from commandline import before_torch
    before_torch("geometry.py")

import torch
from einops import rearrange

from checkpoints import (EVALUATION, HOW_IT_RAN, check_out_dir, ckpt_path, read_json, setting_differs, to_json,
                         write_file, write_json)
from commandline import Parser, cli, fault, seed_arg
from geometry_attention import (KEY_TASKS, ablate, ablate_figures, dynamics, dynamics_figures, keys,
                                keys_figures, qk, qk_figures, trajectory)
from geometry_stats import (BELIEF_EPS, abs_corr, belief_figures, belief_kl, claims, clusters_figures, final_streams,
                            manifold_stats, probe, r2, state_clusters, subsample, values_figures)
from oracles import entropy_bits, oracle
from runtime import check_memory, pyplot, token_bytes
from settings import build_model, load, run_record
from tasks import make_task
from transformer import Transformer

DIAGNOSTICS = ("keys", "qk", "values", "dynamics", "trajectory", "ablate", "clusters", "belief")  # `all`'s order
STREAMS = ("values", "clusters", "belief")  # read every layer's hidden states: forward(x, return_internals=True)
STREAM_LAYOUT = "layers=[{'x': (B, T, d) input of each layer}, ...], final=(B, T, d) what the head reads"

# -----------------------------------------------------------------------------
# values and clusters: the representations against the exact posterior (Figs. 16-17, v3's five clusters)


def representations(model, batch):
    """[(name, (N, d) representation at the scored positions)]: `emb` (the embedding), `L1`.. (the residual
    after l blocks), `final` (after the final norm: what the head reads), and with attention `attn0`..
    (block l's att @ v, heads concatenated)."""
    inside = internals(model, batch.x)
    reps = [l["x"] for l in inside["layers"]] + [inside["final"]]
    names = ["emb"] + [f"L{i}" for i in range(1, len(reps) - 1)] + ["final"]
    for i, l in enumerate(inside["layers"]):
        if "att" in l:  # attention: its output, the attention-weighted values of all heads
            reps.append(rearrange(l["att"] @ l["v"], "b h t d -> b t (h d)"))
            names.append(f"attn{i}")
    return [(n, h[batch.mask]) for n, h in zip(names, reps)]


def internals(model, x):
    """model(x, return_internals=True)'s dict, checked against the layout the stream diagnostics read."""
    got = model(x, return_internals=True)
    inside = got[1] if isinstance(got, tuple) and len(got) == 2 else None
    ok = lambda h: isinstance(h, torch.Tensor) and h.dim() == 3 and h.shape[:2] == x.shape[:2]
    if not (isinstance(inside, dict) and isinstance(inside.get("layers"), list) and ok(inside.get("final"))
            and all(isinstance(l, dict) and ok(l.get("x")) for l in inside["layers"])):
        raise ValueError(f"{type(model).__name__}(x, return_internals=True) must return (out, dict({STREAM_LAYOUT}))")
    return inside


def scored_entropy(task, batch):
    p = oracle(task, batch)[batch.mask]  # (N, C)
    return entropy_bits(p), p.argmax(-1)


def sites(task, batch):
    """{site: (B, T) mask} of the positions whose final representation is analysed: hmm, the observations
    (scored); bijection, the keys (scored, even t) and the values (odd t)."""
    if task.name != "bijection":
        return dict(observation=batch.mask)
    value = torch.zeros_like(batch.mask)
    value[:, 1::2] = True
    return dict(key=batch.mask, value=value)


def site_labels(task, batch, site):
    """(H, position, argmax state) at a site's positions: at a scored position its posterior's; at a bijection
    value (t odd) the preceding key's, the entropy before that value is seen (the authors' label)."""
    p = oracle(task, batch)  # (B, T, C), the scored positions filled
    if site == "value":
        p = torch.cat([torch.zeros_like(p[:, :1]), p[:, :-1]], 1)  # position t reads t - 1
    m = sites(task, batch)[site]
    return entropy_bits(p[m]), torch.arange(m.shape[1]).expand_as(m)[m], p[m].argmax(-1)


def final_layer(model, task, batch, args, by_state=False):
    """Per site (sites), the final layer's representation before and after the final norm: manifold_stats
    (with |corr(PC1, position)|), `corr_h_position` = |corr(H, position)| (bijection: H = log2(V - k) is a
    function of the position alone, so both correlations are high), and with by_state state_clusters."""
    before, after = final_streams(model, batch.x)
    out, coords = {}, {}
    for site, m in sites(task, batch).items():
        H, pos, states = site_labels(task, batch, site)
        out[site] = dict(n_points=len(H), corr_h_position=abs_corr(H, pos.double()))
        for name, X in (("before_norm", before[m]), ("after_norm", after[m])):
            stats, coords[site, name] = manifold_stats(X, H, position=pos)  # state_clusters: the silhouette
            if by_state:
                stats |= state_clusters(X, states, task.n_classes, args.max_points, args.n_perm)
            out[site][name] = stats
    return out, coords


def manifold(model, task, batch, state, args, by_state=False):
    """values (Figs. 16-17; by_state=False) and clusters (v3 "five clusters", hmm; by_state=True): per
    representation (representations) at the scored positions, manifold_stats against the exact posterior
    entropy H (with the argmax state's silhouette for clusters); `final_layer`: the final layer at every
    site before and after the final norm (final_layer). Figure: PC1-2 of the points coloured by H (state)."""
    H, states = scored_entropy(task, batch)
    pos = torch.arange(batch.x.shape[1]).expand_as(batch.mask)[batch.mask]
    layers, coords = {}, {}
    for name, X in representations(model, batch):
        layers[name], coords[name] = manifold_stats(X, H, states if by_state else None, args.max_points, position=pos)
    final, final_coords = final_layer(model, task, batch, args, by_state)
    labels = {site: site_labels(task, batch, site) for site in final}

    def panel(key):
        """(title's label, H, argmax states, stats, PC1-2) of the points of a panel: key is a representation's
        name (layers), or a (site, "before_norm" | "after_norm") of the final layer (final_layer)."""
        if key in layers:
            return key, H, states, layers[key], coords[key]
        site, where = key
        h, _, st = labels[site]
        return f"{site}s, final layer {where.replace('_', ' ')}", h, st, final[site][where], final_coords[key]

    def draw(plt):
        if by_state:  # clusters: the observations' final layer after and before its norm, by state and by H
            panels = [(("observation", b), c) for b in ("after_norm", "before_norm") for c in ("state", "H")]
        else:  # values: every representation, then the final layer at every site, by H
            panels = [(n, "H") for n in layers] + [(key, "H") for key in final_coords]
        cols = min(len(panels), 5)
        rows = (len(panels) + cols - 1) // cols
        fig, axs = plt.subplots(rows, cols, figsize=(3.6 * cols, 3.3 * rows), squeeze=False)
        for ax, (key, colour) in zip(axs.flat, panels):
            label, h, st, s, Z = panel(key)
            sub = subsample(len(Z), args.max_points, 0)
            Z, h, st = Z[sub].numpy(), h[sub], st[sub]
            if colour == "state":
                pts = ax.scatter(Z[:, 0], Z[:, 1], c=st.numpy(), s=2, cmap="tab10", vmin=0, vmax=9)
                ax.legend(*pts.legend_elements(), title="state", fontsize=7)
                title = (f"{state['config']['model']} {label}, by argmax state\nsilhouette {s['silhouette']:.2f}"
                         + (f" (null p95 {s['silhouette_null_p95']:.2f}), k-means ARI {s['kmeans_ari']:.2f}"
                            if "kmeans_ari" in s else ""))
            else:
                sc = ax.scatter(Z[:, 0], Z[:, 1], c=h.numpy(), s=2, cmap="RdYlBu_r",
                                vmin=H.quantile(0.02).item(), vmax=H.quantile(0.98).item())
                title = (f"{label}: PC1 {100 * s['pc1_share']:.1f}%, R2 {s['probe_r2']:.2f}\n"
                         f"|corr(PC1,H)| {s['corr_pc1']:.2f}, |corr(PC1,t)| {s['corr_pc1_position']:.2f}")
            ax.set_title(title, fontsize=7)
        for ax in list(axs.flat)[len(panels):]:
            ax.axis("off")
        fig.colorbar(sc, ax=axs, label="posterior entropy H (bits)")
        return fig
    return dict(layers=layers, final_layer=final), draw


# -----------------------------------------------------------------------------
# belief: a linear probe of the exact posterior vector (Shai et al. 2024)

def belief_target(task, batch):
    """(N, D) the exact posterior at the scored positions, row-major: a distribution, or (mean, log var)."""
    if task.gaussian:
        mean, var = oracle(task, batch)
        return torch.stack([mean[batch.mask], var[batch.mask].log()], -1)
    return oracle(task, batch)[batch.mask]


def belief(model, task, batch, state, args):
    """Is the whole posterior a linear function of the stream (Shai et al. 2024)? Target y: hmm, the filter's
    P(s_t | o_1..o_t); bijection, P(pi(k_t) = v); regression, the predictive (mean, log var). Per layer
    (`emb`, `L1`.., `final`), of the trained model, of its initialisation and of the token embeddings alone
    (wte(x_t)): a ridge probe y ~ X W + b (probe, ridge) fitted on the first half of the sequences, scored
    on the second: pooled R^2 (r2), and the mean KL(oracle || probe) in bits (belief_kl). `constant`: the
    fitting half's mean belief, for scale. Figure: the final layer's held-out predictions beside the truth
    (3 states: in the simplex, coloured by the true belief as RGB; else on the truth's PC1-2), R^2 and KL
    per layer."""
    B = len(batch.x)
    if B < 4:
        raise ValueError("belief needs --n_seq >= 4: sequences to fit, to choose the ridge strength and to score")
    Y, seq = belief_target(task, batch), batch.mask.nonzero()[:, 0]  # the sequence of every scored point
    test = seq >= B // 2

    def score(X):
        alpha, P = probe(X, Y, seq, B)
        return dict(r2=r2(Y[test], P), kl_bits=belief_kl(Y[test], P, task.gaussian).mean().item(), alpha=alpha), P

    init = build_model(state, trained=False)
    streams = lambda m: [(n, X) for n, X in representations(m, batch) if not n.startswith("attn")]
    layers, pred = {}, {}
    for (name, X), (_, X0) in zip(streams(model), streams(init)):
        (trained, pred[name]), (fresh, _) = score(X), score(X0)
        layers[name] = dict(trained=trained, init=fresh)
    tokens = score(model.wte(batch.x)[batch.mask])[0] if hasattr(model, "wte") else None  # its token embeddings
    Yt, const = Y[test], Y[~test].mean(0).expand_as(Y[test])
    target = "(mean, log var)" if task.gaussian else \
        f"P over {Y.shape[1]} " + ("hidden states" if task.name == "hmm" else "values")
    r = dict(target=target, n_fit=int((~test).sum()), n_scored=int(test.sum()), eps=BELIEF_EPS, layers=layers,
             tokens=tokens, constant=dict(r2=r2(Yt, const), kl_bits=belief_kl(Yt, const, task.gaussian).mean().item()))
    sub = torch.randperm(len(Yt), generator=torch.Generator().manual_seed(0))[:args.max_points]
    Yt, P = Yt[sub], pred["final"][sub]  # the final layer's held-out predictions

    def draw(plt):
        fig, axs = plt.subplots(1, 4, figsize=(16, 3.8))
        names, cfg_model = list(layers), state["config"]["model"]
        for ax, k in zip(axs[:2], ("r2", "kl_bits")):
            for who in ("trained", "init"):
                ax.plot(names, [layers[n][who][k] for n in names], "o-", label=f"{who} model")
            if tokens:
                ax.axhline(tokens[k], color="gray", ls="--", label="token embeddings")
            ax.set(xlabel="layer", title=f"held-out probe {'R2' if k == 'r2' else 'KL (bits)'} of the belief")
        axs[1].axhline(r["constant"]["kl_bits"], color="k", ls=":", label="constant (mean belief)")
        axs[1].set_yscale("log")
        axs[1].legend(fontsize=8)
        if task.gaussian:
            for ax, i, label in ((axs[2], 0, "predictive mean"), (axs[3], 1, "predictive log variance")):
                ax.scatter(Yt[:, i].numpy(), P[:, i].numpy(), s=2, c=Yt[:, 1].numpy(), cmap="viridis")
                ax.axline((0, 0), slope=1, color="k", lw=0.8)
                ax.set(xlabel=f"oracle {label}", ylabel="probe", title=f"probe of the final layer ({cfg_model})")
            return fig
        if Y.shape[1] == 3:  # barycentric coordinates: the 2-simplex as a triangle, the belief as RGB
            corners = torch.tensor([[0, 0], [1, 0], [0.5, 3 ** 0.5 / 2]], dtype=torch.float64)
            xy, colour, axes = lambda p: p @ corners, dict(c=Yt.clamp(0, 1).numpy()), ("", "")
        else:  # both on the truth's principal axes, coloured by the truth's PC1
            mu = Yt.mean(0)
            Vh = torch.linalg.svd(Yt - mu, full_matrices=False)[2][:2]
            xy, axes = lambda p: (p - mu) @ Vh.T, ("PC1 of the true beliefs", "PC2")
            colour = dict(c=xy(Yt)[:, 0].numpy(), cmap="viridis")
        both = torch.cat([xy(Yt), xy(P)] + ([corners] if Y.shape[1] == 3 else []))  # the same axes in both panels
        pad = 0.05 * (both.max(0).values - both.min(0).values)
        lo, hi = (both.min(0).values - pad).numpy(), (both.max(0).values + pad).numpy()
        for ax, p, title in ((axs[2], Yt, "true belief"), (axs[3], P, f"probe of the final layer ({cfg_model})")):
            if Y.shape[1] == 3:
                ax.plot(*corners[[0, 1, 2, 0]].T.numpy(), color="k", lw=0.8)
                for i, corner in enumerate(corners.tolist()):  # hidden states, or bijection values
                    ax.annotate(f"{'s' if task.name == 'hmm' else 'v'}{i}", corner, textcoords="offset points",
                                xytext=(0, 4), ha="center")
                ax.set_aspect("equal")
                ax.axis("off")
            ax.scatter(*xy(p).T.numpy(), s=2, **colour)
            ax.set(title=title, xlabel=axes[0], ylabel=axes[1], xlim=(lo[0], hi[0]), ylim=(lo[1], hi[1]))
        return fig
    return r, draw


RUN = dict(keys=keys, qk=qk, values=manifold, dynamics=dynamics, trajectory=trajectory, ablate=ablate,
           clusters=partial(manifold, by_state=True), belief=belief)
# each diagnostic's figures for the claims table, read from its result (the others have none): main writes them
# into geometry_<name>.json as `figures`, and seeds reads them from there
FIGURES = dict(keys=keys_figures, qk=qk_figures, values=values_figures, dynamics=dynamics_figures,
               ablate=ablate_figures, clusters=clusters_figures, belief=belief_figures)

# -----------------------------------------------------------------------------
# one recipe over several seeds

CLAIMS = ("keys", "ablate", "qk", "values", "dynamics")  # the claims table's diagnostics, in its order
RECIPE = ("task", "model", "task_opts", "model_opts", "train")  # what seeds of one recipe share, but the seed


def read_figures(name, d, path):
    """The figures of geometry_<name>.json (d, read from path): those it holds, or for an older file, read from its
    numbers by the diagnostic's FIGURES function; a layout it cannot read is a ValueError naming the file."""
    if "figures" in d:
        return d["figures"]
    try:
        return FIGURES[name](d) if name in FIGURES else {}
    except (KeyError, IndexError, TypeError) as e:
        raise ValueError(f"{path} holds no figures, and not the layout geometry.py writes ({type(e).__name__}: "
                         f"{e}): run geometry.py {name} on it again") from None


def read_runs(run_dirs):
    """(runs, their figures) of seeds of one recipe. No geometry_*.json, a corrupt or foreign one, a run given twice,
    runs of other settings (results.json's, but how they ran and were evaluated) or of one seed: a ValueError."""
    runs, found, configs = [], [], []
    for run in run_dirs:
        paths = {n: f for n in DIAGNOSTICS if os.path.exists(f := os.path.join(run, f"geometry_{n}.json"))}
        if not paths:
            raise ValueError(f"no geometry_*.json in {run} (first: geometry.py all --ckpt {run})")
        meta = read_json(r) if os.path.exists(r := os.path.join(run, "results.json")) else run_record(run)
        heads = [read_json(f) for f in paths.values()]
        runs.append(dict(run=run, seed=meta.get("seed"), iter=next((h["iter"] for h in heads if "iter" in h), None)))
        found.append({n: read_figures(n, h, f) for (n, f), h in zip(paths.items(), heads)})
        configs.append({k: d[k] for d in (*heads, meta, meta.get("config") or {}) for k in d if k in RECIPE})
        for earlier, was in zip(runs[:-1], configs[:-1]):
            if os.path.realpath(run) == os.path.realpath(earlier["run"]):
                raise ValueError(f"{run} is given twice: give each seed's run once")
            differs = setting_differs(was, configs[-1], ignore=HOW_IT_RAN | EVALUATION | {"seed"})
            if differs:
                raise ValueError(f"{earlier['run']} and {run} are not seeds of one recipe: {differs[0]} {differs[1]} "
                                 f"vs {differs[2]}")
            if runs[-1]["seed"] is not None and runs[-1]["seed"] == earlier["seed"]:
                raise ValueError(f"{earlier['run']} and {run} both ran with --seed {earlier['seed']}: one run twice?")
    return runs, found


def seeds(argv):
    """`geometry.py seeds RUN ... --out DIR`: the claims table's figures (FIGURES, in CLAIMS order) over runs of one
    recipe with different seeds, each analysed by `geometry.py all` first: every seed's value, the mean, min and
    max, in DIR/geometry_seeds.json and as a table. A figure that some run lacks is named below the table (and
    under `missing` in the JSON), with the runs that lack it."""
    p = Parser(prog="geometry.py seeds", description=seeds.__doc__.split(":")[0], allow_abbrev=False)
    p.add_argument("runs", nargs="+", help="the runs' out_dirs, each with its geometry_<diagnostic>.json")
    p.add_argument("--out", required=True, help="folder for geometry_seeds.json")
    args = p.parse_args(argv)
    try:
        check_out_dir(args.out, "--out")
        runs, found = read_runs(args.runs)
        figures, missing = claims(runs, found, CLAIMS)
    except ValueError as e:
        p.exit(2, f"geometry.py seeds: error: {e}\n")
    write_json(os.path.join(args.out, "geometry_seeds.json"),
               to_json(dict(runs=runs, figures=figures, missing=missing)))
    f = lambda x: "[" + ", ".join(f(v) for v in x) + "]" if isinstance(x, list) else f"{x:.4g}"
    print(f"| figure | mean | min | max | {' | '.join(str(r['seed']) for r in runs)} |")
    print("|---" * (4 + len(runs)) + "|")
    for name, s in figures.items():
        cells = [name.replace("|", "\\|")] + [f(v) for v in [s["mean"], s["min"], s["max"], *s["values"]]]
        print(f"| {' | '.join(cells)} |")
    for name, m in missing.items():
        where = "every run" if len(m["runs"]) == len(runs) else ", ".join(m["runs"])
        print(f"missing: {name} (geometry_{m['diagnostic']}.json) in {where}")
    for r in (r for r in runs if r["seed"] is None):
        print(f"unchecked: {r['run']} has no results.json or ckpt.pt: its settings and seed were not compared")
    print(f"wrote {os.path.join(args.out, 'geometry_seeds.json')}")
    return 0


# -----------------------------------------------------------------------------
# command line


def lacks(name, model, mc):
    """What a model must add for a diagnostic (README, "Bring your own model"), or None: the stream diagnostics
    read forward(x, return_internals=True); ablate forward(x, skip_layers=...) and its config's n_layer; the
    attention ones the q, k, attention maps and weights of transformer.py's layout."""
    takes = lambda arg: arg in (ps := inspect.signature(model.forward).parameters) or any(
        p.kind is p.VAR_KEYWORD for p in ps.values())
    if name in ("keys", "qk", "dynamics", "trajectory") and not isinstance(model, Transformer):
        return (f"{name} needs a model with softmax attention laid out as transformer.py's (transformer, or a "
                f"subclass of transformer.Transformer); {type(model).__name__} is not one")
    if name in STREAMS and not takes("return_internals"):
        return (f"{name} reads each layer's hidden states: give {type(model).__name__}.forward a return_internals "
                f"argument that, when True, returns (out, dict({STREAM_LAYOUT}))")
    if name == "ablate" and not (takes("skip_layers") and isinstance(mc.get("n_layer"), int)):
        return (f"ablate skips layers: give {type(model).__name__}.forward a skip_layers argument (the layers to "
                f"bypass, output = input) and its config an n_layer field")
    return None


def posterior_kind(task, n=64):
    """What the task's posterior is at its scored positions, read off n sequences of its own: (Gaussian, every one a
    point mass, its entropy varies across positions, its top answer ties with another at most of them)."""
    batch = task.sample(n, torch.Generator().manual_seed(0))
    if task.gaussian:
        return True, False, True, False
    p = oracle(task, batch)[batch.mask]
    top2 = p.topk(min(2, p.shape[1]), -1).values
    H = entropy_bits(p).view(n, -1).mean(0)  # the mean entropy at each scored position
    return False, bool((p.max(-1).values > 1 - 1e-12).all()), bool(H.std() > 1e-9) if len(H) > 1 else False, \
        bool((top2[:, 0] - top2[:, -1] < 1e-12).double().mean() > 0.5)


def why_not(name, cfg, path, model, mc, task):
    """None if the diagnostic applies to this checkpoint, else the reason: what it reads of the task's contract (its
    posterior: categorical, an entropy that varies, not point masses, a top answer), and of the model (lacks)."""
    spec = cfg["task"]
    gaussian, point, varies, tied = posterior_kind(task)
    if name in ("values", "dynamics") and (gaussian or not varies):
        return (f"{name} needs a task whose categorical posterior's entropy varies across its scored positions "
                f"(bijection, hmm), not {spec!r}")
    if name == "clusters" and (gaussian or point or tied):
        return (f"clusters needs a categorical posterior with a top answer (hmm's hidden state), not {spec!r}'s"
                + (" point masses" if point else " ties" if tied else ""))
    if name == "belief" and point:
        return (f"belief needs a task whose posterior is a vector (bijection, hmm, regression): {spec}'s is a point "
                f"mass on one answer, nothing to probe")
    if (why := lacks(name, model, mc)) is not None:
        return why
    if name in ("keys", "qk") and spec not in KEY_TASKS and task.answer_offset is None:
        return f"{name} needs a task with hypothesis tokens (its answers are tokens: answer_offset), not {spec!r}"
    if name == "trajectory" and (spec != "bijection" or cfg["task_opts"].get("layout", "separate") != "separate"):
        return "trajectory needs a bijection run in the authors' separate layout, their dense run's task"
    if name in ("dynamics", "trajectory") and not glob.glob(os.path.join(path, "ckpt_*.pt")):
        return f"{name} needs snapshot checkpoints ckpt_*.pt in {path} (train with --ckpt_schedule log or dense)"
    return None


def held_out(task, n, seed, draw=250):
    """The first n sequences of evaluation.evaluate's held-out stream (the diagnostics' batch): from `seed`, `draw` at
    a time (its batch_size), as one tasks.Batch."""
    g = torch.Generator().manual_seed(seed)
    parts = [task.sample(draw, g) for _ in range(-(-n // draw))]
    cat = lambda ts: torch.cat(list(ts))[:n]
    return type(parts[0])(cat(b.x for b in parts), cat(b.y for b in parts), cat(b.mask for b in parts),
                          {k: cat(b.latent[k] for b in parts) for k in parts[0].latent})


def check_geometry_memory(args, task, mc, attention):
    """The diagnostics hold --n_seq sequences' float64 streams, a transformer one (T, T) attention map a head
    at least, and --n_perm null silhouettes: refused before they allocate if the machine cannot hold them."""
    T, cpu = task.seq_len, torch.device("cpu")
    K = f" (--K {args.K})" if args.K is not None else ""
    check_memory(f"--n_seq {args.n_seq} of {T}-token sequences{K}", args.n_seq * T * token_bytes(mc, False, 8)
                 + attention * 8 * T * T * (mc.get("n_head") or 1), cpu, f"use a smaller --n_seq{' or --K' * bool(K)}")
    check_memory(f"--n_perm {args.n_perm}", 8 * args.n_perm, cpu, "use a smaller --n_perm")


def main(argv=None):
    argv = sys.argv[1:] if argv is None else argv
    if argv[:1] == ["seeds"]:
        return seeds(argv[1:])
    p = Parser(prog="geometry.py", description=__doc__.split("\n\n")[0].strip(), allow_abbrev=False)
    p.add_argument("diagnostic", choices=DIAGNOSTICS + ("all",),
                   help="which diagnostic (all: every one that applies); `geometry.py seeds --help`: over seeds")
    p.add_argument("--ckpt", required=True, help="a run's out_dir (its ckpt.pt) or a checkpoint file")
    p.add_argument("--n_seq", type=int, default=200, help="held-out sequences to analyse")
    p.add_argument("--seed", type=seed_arg, default=None, help="seed of those sequences (default: the run's eval_seed)")
    p.add_argument("--max_points", type=int, default=3000, help="points in the scatter plots and the silhouette")
    p.add_argument("--key_tokens", default="hypothesis", choices=("hypothesis", "vocab"),
                   help="keys: the hypothesis tokens (paper) or every token id (authors' qkv_analysis)")
    p.add_argument("--settle", type=float, default=0.95, help="dynamics: attention similarity that counts as settled")
    p.add_argument("--K", type=int, default=None,
                   help="hmm: observations per sequence (default: the run's; the authors' five-cluster figure: 15)")
    p.add_argument("--n_perm", type=int, default=200, help="clusters: label permutations in the silhouette's null")
    p.add_argument("--frame_seqs", type=int, default=0,
                   help="dynamics, trajectory: sequences of the authors' batch for "
                   "their frame ratio at every checkpoint (0: off; theirs: 256, ~15 minutes a paper-size checkpoint on "
                   "a 2-core CPU)")
    p.add_argument("--no_plot", action="store_true", help="write the JSON only")
    args = p.parse_args(argv)
    try:
        if args.n_seq < 2 or args.max_points < 2 or args.n_perm < 1 or not 0 <= args.frame_seqs <= 256:
            raise ValueError("--n_seq and --max_points must be >= 2, --n_perm >= 1, --frame_seqs in [0, 256] (theirs)")
        if not 0 <= args.settle <= 1:  # NaN too
            raise ValueError(f"--settle must be in [0, 1] (an attention similarity 1 - JS, in bits), got {args.settle}")
        model, task, state = load(args.ckpt)
        if not all(torch.isfinite(p).all() for p in model.parameters()):  # a diverged run's: every number NaN
            print(f"geometry.py: error: the parameters in {ckpt_path(args.ckpt)} are not finite (step "
                  f"{state['iter']}): nothing to analyse", file=sys.stderr)
            return 1
        cfg, path = state["config"], ckpt_path(args.ckpt)
        check_out_dir(os.path.dirname(path), "--ckpt")  # the diagnostics go beside it: said now, not after the work
        if args.K is not None:
            if cfg["task"] != "hmm":
                raise ValueError(f"--K applies to hmm checkpoints only, not {cfg['task']!r}")
            task = make_task("hmm", **cfg["task_opts"] | dict(K=args.K))
        # before why_not, which draws from the task: a K past memory is refused, not drawn for minutes
        check_geometry_memory(args, task, state["model_config"], isinstance(model, Transformer))
        why = {n: why_not(n, cfg, args.ckpt, model, state["model_config"], task) for n in DIAGNOSTICS
               if args.diagnostic in (n, "all")}
        names = [n for n, w in why.items() if w is None]
        if args.diagnostic != "all" and why[args.diagnostic]:
            raise ValueError(why[args.diagnostic])
        for n in (n for n, w in why.items() if w):
            print(f"skipped {n}: {why[n]}")
        if not names:
            raise ValueError(f"no diagnostic applies to {path}: each is skipped above, with what it needs")
        seed = cfg["train"]["eval_seed"] if args.seed is None else args.seed
        args.seed, batch = seed, held_out(task, args.n_seq, seed)
        if batch.x.is_floating_point():  # regression's real inputs, for the float64 model
            batch.x = batch.x.double()
        plt = None if args.no_plot else pyplot()
        if plt is None and not args.no_plot:  # the figures are optional, the JSON is not
            print("matplotlib is not installed: writing the JSON only")
        stem = os.path.splitext(os.path.basename(path))[0]
        for n in names:
            with torch.no_grad():
                r, draw = RUN[n](model, task, batch, state, args)
            base = os.path.join(os.path.dirname(path), f"geometry_{n}" + ("" if stem == "ckpt" else f"_{stem}"))
            head = dict(diagnostic=n, ckpt=path, task=cfg["task"], model=cfg["model"], iter=state["iter"],
                        n_seq=args.n_seq, seed=seed) | (dict(K=task.K) if task.name == "hmm" else {})
            figures = {k: v for k, v in FIGURES[n](r).items() if v is not None} if n in FIGURES else {}  # for seeds
            write_json(base + ".json", to_json(head | r | dict(figures=figures)))
            if plt is not None:
                with plt.rc_context({"figure.constrained_layout.use": True}):  # these figures', not the process's:
                    fig = draw(plt)  # a later tight_layout (conditioning.py, reproduce.py) would warn of the switch
                write_file(base + ".png", lambda tmp: fig.savefig(tmp, dpi=90, format="png"))
                plt.close(fig)
            print(f"wrote {base}.json" + (" and .png" if plt is not None else ""))
            num = lambda v: f"{v:.4g}" if isinstance(v, float) else str(v)  # as train.py prints its metrics:
            for k, v in figures.items():  # the headline figures
                print(f"  {k}: {', '.join(map(num, v)) if isinstance(v, list) else num(v)}")
    except ValueError as e:
        p.exit(2, f"geometry.py: error: {e}\n")
    except OSError as e:  # a full or read-only disk: every file is written whole or not at all (write_file)
        return print(f"geometry.py: error: {fault(e)}; the files written before are kept", file=sys.stderr) or 1
    return 0


if __name__ == "__main__":
    cli(main, "geometry.py", "the diagnostics already written are kept")
