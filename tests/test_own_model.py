"""Bring your own model, as a user would: a model file in a folder of its own, outside the repository, which
stays unedited; `train.py --model PATH.py:Class` trains it on every task it can take, resumes and evaluates it, and
geometry.py's loader finds it again; `reproduce.py --models transformer,PATH.py:Class` sweeps it, writing n/a where it
cannot take a task. A model that cannot take a task's inputs, and a spec that names no model, are one-line errors.
The GRU is the README's example."""
import json
import os
import subprocess
import sys

import pytest

import settings
import commandline
import presets
import reproduce
import train
from cli import exit_code

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
TINY = ["--V", "6", "--d_model", "16", "--n_layer", "1", "--max_iters", "2", "--batch_size", "8", "--log_interval",
        "1", "--eval_interval", "2", "--eval_samples", "50", "--eval_samples_during", "50"]

GRU_PY = '''"""A GRU for the wind tunnels: token embeddings (or a linear read-in of real inputs), stacked GRU
layers, a head."""
from dataclasses import dataclass

import torch.nn as nn


@dataclass
class GRUConfig:
    # I/O, filled in from the task
    vocab_size: int = 0  # input tokens; 0 means real-valued inputs through a linear read-in
    n_features: int = 0  # width of real-valued inputs
    n_classes: int = 2  # answer classes C (or 2 = mean, log-variance for the Gaussian head)
    answer_offset: int = None  # token id of answer class 0 when answers are tokens (unused: the head is not tied)
    gaussian: bool = False  # real-valued prediction: Gaussian head
    block_size: int = 128  # longest sequence (unused: a recurrence has no position table)
    # architecture
    n_layer: int = 2  # stacked GRU layers
    d_model: int = 64  # embedding width = GRU hidden size


class GRU(nn.Module):

    def __init__(self, config):
        super().__init__()
        c = self.config = config
        self.wte = nn.Embedding(c.vocab_size, c.d_model) if c.vocab_size else nn.Linear(c.n_features, c.d_model)
        self.gru = nn.GRU(c.d_model, c.d_model, c.n_layer, batch_first=True)
        self.head = nn.Linear(c.d_model, 2 if c.gaussian else c.n_classes)

    def num_params(self):
        return sum(p.numel() for p in self.parameters())

    def forward(self, x):
        """x: (B, T) tokens or (B, T, F) reals -> (B, T, C) logits, or (B, T, 2) = (mean, log-variance)."""
        h, _ = self.gru(self.wte(x))  # (B, T, d_model)
        return self.head(h)
'''

CONV_PY = '''"""A causal convolution over token embeddings: tokens in, no real-valued inputs, no Gaussian head."""
from dataclasses import dataclass

import torch.nn as nn
import torch.nn.functional as F


@dataclass
class ConvConfig:
    vocab_size: int = 0  # input tokens (filled in from the task)
    n_classes: int = 2  # answer classes C (filled in from the task)
    n_layer: int = 2  # convolution layers
    d_model: int = 32  # channels
    kernel: int = 4  # positions each layer sees: its own and kernel - 1 before it


class Conv(nn.Module):

    def __init__(self, config):
        super().__init__()
        c = self.config = config
        self.wte = nn.Embedding(c.vocab_size, c.d_model)
        self.convs = nn.ModuleList(nn.Conv1d(c.d_model, c.d_model, c.kernel) for _ in range(c.n_layer))
        self.head = nn.Linear(c.d_model, c.n_classes)

    def num_params(self):
        return sum(p.numel() for p in self.parameters())

    def forward(self, x):
        """x: (B, T) tokens -> (B, T, C) logits; padded on the left, so position t sees no later one."""
        h = self.wte(x).transpose(1, 2)  # (B, d_model, T)
        for conv in self.convs:
            h = h + F.gelu(conv(F.pad(h, (conv.kernel_size[0] - 1, 0))))
        return self.head(h.transpose(1, 2))  # (B, T, C)
'''


def model_file(folder, name, text):
    (folder / f"{name}.py").write_text(text)
    return str(folder / f"{name}.py")


def run_train(*argv):
    """(exit code, stderr) of train.py run from the checkout, as a user runs it."""
    p = subprocess.run([sys.executable, "train.py", *argv], cwd=ROOT, capture_output=True, text=True,
                       env=os.environ | {"OMP_NUM_THREADS": "1"})
    return p.returncode, p.stderr.strip()


def test_a_model_file_trains_resumes_and_evaluates_from_an_unedited_checkout(tmp_path):
    conv, out = model_file(tmp_path, "conv", CONV_PY), tmp_path / "run"
    rc, err = run_train("--task", "bijection", "--model", f"{os.path.relpath(conv, ROOT)}:Conv", *TINY,
                         "--out_dir", str(out))  # a relative path, as typed
    assert rc == 0, err
    r = json.load(open(out / "results.json"))
    assert r["model"] == f"{conv}:Conv" and r["iters"] == 2  # recorded with its path made absolute
    argv = ["--task", "bijection", "--model", f"{conv}:Conv", "--out_dir", str(out)]
    assert exit_code(train.main, argv + ["--resume", "--max_iters", "4"]) == 0
    assert json.load(open(out / "results.json"))["iters"] == 4
    assert exit_code(train.main, argv + ["--eval_only"]) == 0
    assert json.load(open(out / "eval.json"))["metrics"] == json.load(open(out / "results.json"))["metrics"]
    model, task, state = settings.load(str(out))  # geometry.py's loader
    assert type(model).__name__ == "Conv" and state["iter"] == 4 and task.name == "bijection"


def test_a_model_that_cannot_take_the_task_is_one_line_before_training(tmp_path):
    conv = model_file(tmp_path, "conv", CONV_PY)
    rc, err = run_train("--task", "regression", "--model", f"{conv}:Conv", "--out_dir", str(tmp_path / "run"))
    assert rc == 2 and err == (f"train.py: error: {conv}:Conv cannot take regression's real-valued inputs: its "
                               f"config has no n_features field"), err
    assert not (tmp_path / "run").exists()


@pytest.mark.parametrize("spec, expect", [
    ("{tmp}/gone.py:Conv", "train.py: error: --model {tmp}/gone.py:Conv: no file {tmp}/gone.py"),
    ("{tmp}/conv.py:Cnv", "--model {tmp}/conv.py:Cnv: {tmp}/conv.py has no class Cnv"),
    ("{tmp}/conv.py:ConvConfig", "ConvConfig is not an nn.Module"),
    ("{tmp}/bare.py:Net", "no config: add a @dataclass named NetConfig to {tmp}/bare.py"),
    ("{tmp}/bare.py:Counted", "Counted has no num_params() method"),
    ("no_such_module:Conv", "--model no_such_module:Conv: no module named no_such_module (put its folder on "
                            "PYTHONPATH, or give its file: no_such_module.py:Conv)"),
    ("conv.py", "--model conv.py: not a model; give one of transformer, mamba"),
])
def test_a_spec_that_names_no_model_is_one_line(tmp_path, capsys, spec, expect):
    model_file(tmp_path, "conv", CONV_PY)
    model_file(tmp_path, "bare", "import torch.nn as nn\n\n\nclass Net(nn.Module):\n    def num_params(self):\n"
                                 "        return 0\n\n\nclass Counted(nn.Module):\n    pass\n")
    assert exit_code(train.main, ["--model", spec.format(tmp=tmp_path)]) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and expect.format(tmp=tmp_path) in err, err


@pytest.mark.parametrize("source, expect", [
    ("class Conv(:\n", "--model {file}:Conv: importing it raised SyntaxError: "),
    ("import torch\n\nx = 1\nraise RuntimeError('no GPU here')\n",
     "--model {file}:Conv: importing it raised RuntimeError: no GPU here at {file}:4"),
    ("from torch import no_such_name\n", "--model {file}:Conv: importing it raised ImportError: cannot import name"),
    ("raise SystemExit(3)\n", "--model {file}:Conv: importing it raised SystemExit: 3"),
])
def test_a_model_file_that_fails_on_import_is_one_line(tmp_path, capsys, source, expect):
    file = model_file(tmp_path, "broken", source)
    assert exit_code(train.main, ["--model", f"{file}:Conv", "--out_dir", str(tmp_path / "run")]) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and expect.format(file=file) in err and f" at {file}:" in err, err
    assert not (tmp_path / "run").exists()
    model_file(tmp_path, "broken", CONV_PY)  # mended, the same file is read afresh
    assert presets.resolve_model(f"{file}:Conv")[1].__name__ == "Conv"


def test_a_model_whose_head_has_the_wrong_width_is_one_line(tmp_path, capsys):
    conv = model_file(tmp_path, "conv", CONV_PY.replace("nn.Linear(c.d_model, c.n_classes)", "nn.Linear(c.d_model, 4)"))
    assert exit_code(train.main, ["--task", "bijection", "--model", f"{conv}:Conv", *TINY,
                                  "--out_dir", str(tmp_path / "run")]) == 2
    err = capsys.readouterr().err.strip()
    assert err == ("train.py: error: the model's output is (8, 9, 4); bijection needs a tensor (B, T, C) = "
                   "(8, 9, 6)"), err
    # (logits, None)
    pair = "    def __call__(self, x):\n        return super().__call__(x), None\n\n    def num_params"
    conv = model_file(tmp_path, "pair", CONV_PY.replace("    def num_params", pair))
    assert exit_code(train.main, ["--task", "bijection", "--model", f"{conv}:Conv", *TINY,
                                  "--out_dir", str(tmp_path / "run")]) == 2
    assert "the model's output is a tuple; bijection needs a tensor (B, T, C)" in capsys.readouterr().err


def test_a_model_that_lacks_the_gaussian_head_is_refused_on_regression(tmp_path, capsys):
    gru = model_file(tmp_path, "gru", GRU_PY.replace("    gaussian: bool = False  # real-valued prediction: Gaussian "
                                                     "head\n", "").replace("2 if c.gaussian else c.n_classes",
                                                                           "c.n_classes"))
    assert exit_code(train.main, ["--task", "regression", "--model", f"{gru}:GRU", "--max_iters", "4",
                                  "--out_dir", str(tmp_path / "run")]) == 2  # no curriculum note before the line
    assert capsys.readouterr().err.strip() == (f"train.py: error: {gru}:GRU cannot give regression's Gaussian "
                                               "prediction: its config has no gaussian field")


def test_a_model_from_an_importable_module(tmp_path, monkeypatch):
    model_file(tmp_path, "byo_conv", CONV_PY)
    monkeypatch.syspath_prepend(str(tmp_path))
    assert presets.model_spec("byo_conv:Conv") == "byo_conv:Conv"
    assert exit_code(train.main, ["--task", "bijection", "--model", "byo_conv:Conv", *TINY,
                                  "--out_dir", str(tmp_path / "run")]) == 0
    assert (tmp_path / "run" / "results.json").exists()


def test_a_new_model_trains_evaluates_and_has_its_flags(tmp_path, capsys):
    spec, out = f"{model_file(tmp_path, 'gru', GRU_PY)}:GRU", tmp_path / "run"
    argv = ["--task", "bijection", "--model", spec, "--V", "6", "--d_model", "16", "--n_layer", "1",
            "--max_iters", "4", "--batch_size", "8", "--log_interval", "2", "--eval_interval", "2",
            "--eval_samples", "20", "--eval_samples_during", "10", "--out_dir", str(out)]
    assert exit_code(train.main, argv) == 0
    r = json.load(open(out / "results.json"))
    assert r["model"] == spec and r["iters"] == 4 and r["model_config"]["d_model"] == 16
    Config, Model = presets.resolve_model(spec)
    assert r["n_params"] == sum(p.numel() for p in Model(Config(**r["model_config"])).parameters())
    capsys.readouterr()
    assert exit_code(train.main, ["--model", spec, "--help"]) == 0
    text = " ".join(capsys.readouterr().out.split())
    assert f"model {spec}: --block_size BLOCK_SIZE" in text
    assert "--n_layer N_LAYER stacked GRU layers (default 2)" in text


def test_reproduce_sweeps_a_new_model_on_every_task(tmp_path):
    spec = f"{model_file(tmp_path, 'gru', GRU_PY)}:GRU"
    out, res = tmp_path / "out", tmp_path / "results"
    argv = ["--preset", "tiny", "--models", spec, "--out", str(out), "--results", str(res)]
    assert exit_code(reproduce.main, argv) == 0
    table = (res / "table.md").read_text()
    for task in reproduce.TASK_ORDER:
        r = json.load(open(out / "tiny" / f"{task}_GRU" / "results.json"))
        assert r["iters"] == 4 and r["model_config"]["d_model"] == 16  # the tiny sizes it has
        assert f"| GRU | {r['n_params']:,} | {r['metrics']['default']['mae_curve']:.4f} |" in table


def test_reproduce_writes_n_a_where_a_model_cannot_take_the_task(tmp_path, capsys):
    conv = model_file(tmp_path, "conv", CONV_PY)
    out, res = tmp_path / "out", tmp_path / "results"
    argv = ["--preset", "tiny", "--tasks", "bijection,regression", "--models", f"transformer,{conv}:Conv",
            "--out", str(out), "--results", str(res), "--jobs", "1"]
    assert exit_code(reproduce.main, argv) == 0
    said, table = capsys.readouterr().out, (res / "table.md").read_text()
    assert "4 cells, preset tiny: 0 finished before (skipped), 3 to run, 1 n/a" in said
    why = f"{conv}:Conv cannot take regression's real-valued inputs: its config has no n_features field"
    assert f"regression x Conv: n/a, {why}." in said and f"regression x Conv: n/a, {why}." in table
    regression = table[table.index("## regression"):]
    assert "| Conv | n/a |" in regression and "| transformer | " in regression
    cells = sorted(set(os.listdir(out / "tiny")) - {"sweep.json"})  # sweep.json: the sweep's command and time
    assert cells == ["bijection_Conv", "bijection_transformer", "regression_transformer"]
    r = json.load(open(out / "tiny" / "bijection_Conv" / "results.json"))
    assert r["model"] == f"{conv}:Conv" and f"| Conv | {r['n_params']:,} |" in table
    assert exit_code(reproduce.main, argv[:5] + [f"transformer,{tmp_path / 'gone.py'}:Conv"] + argv[6:]) == 2
    assert capsys.readouterr().err.strip().endswith(f"--models {tmp_path / 'gone.py'}:Conv: no file "
                                                    f"{tmp_path / 'gone.py'}")


# every I/O field declared with a default of another kind than some task fills in (answer_offset: int = 0 where
# hmm and regression have none, n_features None where recall has 0): train.py's checkpoint reopens all the same
IO_DECLARED = GRU_PY.replace("answer_offset: int = None", "answer_offset: int = 0").replace(
    "n_features: int = 0", "n_features: int = None").replace("vocab_size: int = 0", "vocab_size: int = None")


@pytest.mark.parametrize("task", ["hmm", "regression", "recall"])
def test_a_checkpoint_reopens_for_every_io_field_a_config_declares(tmp_path, task):
    spec, out = f"{model_file(tmp_path, 'gru', IO_DECLARED)}:GRU", tmp_path / "run"
    argv = ["--task", task, "--model", spec, "--out_dir", str(out)]
    tiny = ["--d_model", "8", "--n_layer", "1", "--batch_size", "4", "--log_interval", "1", "--eval_interval", "2",
            "--eval_samples", "8", "--eval_samples_during", "8", "--stop_at", "", "--curriculum", ""]
    assert exit_code(train.main, argv + tiny + ["--max_iters", "2"]) == 0
    assert exit_code(train.main, argv + ["--resume", "--max_iters", "3"]) == 0
    assert exit_code(train.main, argv + ["--eval_only"]) == 0
    model, t, state = settings.load(str(out))  # geometry.py's loader
    assert state["iter"] == 3 and model.config.answer_offset == t.answer_offset  # None on hmm and regression


# the README's contract for the diagnostics: per-layer hidden states (values, clusters, belief), layers to skip (ablate)
GRU_LAYERS_PY = GRU_PY.replace('''        self.gru = nn.GRU(c.d_model, c.d_model, c.n_layer, batch_first=True)''',
                               '''        self.grus = nn.ModuleList(nn.GRU(c.d_model, c.d_model, batch_first=True)
                                  for _ in range(c.n_layer))
        self.ln_f = nn.LayerNorm(c.d_model)''').replace('''    def forward(self, x):
        """x: (B, T) tokens or (B, T, F) reals -> (B, T, C) logits, or (B, T, 2) = (mean, log-variance)."""
        h, _ = self.gru(self.wte(x))  # (B, T, d_model)
        return self.head(h)''', '''    def forward(self, x, skip_layers=(), return_internals=False):
        h, layers = self.wte(x), []
        for i, gru in enumerate(self.grus):
            layers.append({"x": h})  # (B, T, d_model) the input of layer i
            h = h if i in skip_layers else h + gru(h)[0]
        h = self.ln_f(h)
        return (self.head(h), dict(layers=layers, final=h)) if return_internals else self.head(h)''')
HMM = ["--task", "hmm", "--K", "4", "--n_states", "3", "--n_obs", "3", "--d_model", "8", "--n_layer", "2",
       "--batch_size", "4", "--max_iters", "2", "--eval_interval", "2", "--eval_samples", "8",
       "--eval_samples_during", "8", "--stop_at", "", "--curriculum", ""]


def test_geometry_all_runs_every_diagnostic_a_model_file_exposes(tmp_path, capsys):
    import geometry
    out = str(tmp_path / "run")
    spec = f"{model_file(tmp_path, 'gru', GRU_LAYERS_PY)}:GRU"
    assert exit_code(train.main, HMM + ["--model", spec, "--out_dir", out]) == 0
    capsys.readouterr()
    assert exit_code(geometry.main, ["all", "--ckpt", out, "--n_seq", "8", "--n_perm", "5", "--no_plot"]) == 0
    said = capsys.readouterr().out
    for n in ("values", "clusters", "belief", "ablate"):
        assert os.path.exists(os.path.join(out, f"geometry_{n}.json")), said
    assert list(json.load(open(os.path.join(out, "geometry_values.json")))["layers"]) == ["emb", "L1", "final"]
    a = json.load(open(os.path.join(out, "geometry_ablate.json")))
    assert [r["ablation"] for r in a["ablations"]] == ["skip L0", "skip L1"] and "frame" not in a
    assert ("skipped keys: keys needs a model with softmax attention laid out as transformer.py's (transformer, or "
            "a subclass of transformer.Transformer); GRU is not one") in said
    c = json.load(open(os.path.join(out, "geometry_clusters.json")))["figures"]
    assert f"  silhouette by argmax state: {c['silhouette by argmax state']:.4g}\n" in said  # the headline figures
    assert "  |corr(PC1, H)| at observation positions: " in said and "  belief probe R2, final layer: " in said


def test_geometry_says_what_a_model_file_must_add(tmp_path, capsys):
    import geometry
    out = str(tmp_path / "run")
    assert exit_code(train.main, HMM + ["--model", f"{model_file(tmp_path, 'gru', GRU_PY)}:GRU", "--out_dir", out]) == 0
    capsys.readouterr()
    assert exit_code(geometry.main, ["all", "--ckpt", out, "--n_seq", "8", "--no_plot"]) == 2
    said, err = capsys.readouterr()
    assert "skipped values: values reads each layer's hidden states: give GRU.forward a return_internals" in said
    assert ("skipped ablate: ablate skips layers: give GRU.forward a skip_layers argument (the layers to bypass, "
            "output = input) and its config an n_layer field") in said
    assert err == (f"geometry.py: error: no diagnostic applies to {out}/ckpt.pt: each is skipped above, with what it "
                   f"needs\n")
    for n in ("values", "belief", "clusters", "ablate", "qk"):
        assert exit_code(geometry.main, [n, "--ckpt", out, "--no_plot"]) == 2
        err = capsys.readouterr().err
        assert err.startswith(f"geometry.py: error: {n} ") and err.count("\n") == 1, err


def test_eval_only_refuses_a_wrong_output_shape_as_training_does(tmp_path, capsys):
    conv, out = model_file(tmp_path, "conv", CONV_PY), tmp_path / "run"
    argv = ["--task", "bijection", "--model", f"{conv}:Conv", "--out_dir", str(out)]
    assert exit_code(train.main, argv + TINY) == 0
    model_file(tmp_path, "conv", CONV_PY.replace("return self.head(h.transpose(1, 2))",
                                                 "return self.head(h.transpose(1, 2))[..., :1]"))  # (B, T, 1)
    commandline.load_module.cache_clear()  # the edited file, as a new process reads it
    capsys.readouterr()
    assert exit_code(train.main, argv + ["--eval_only"]) == 2
    assert capsys.readouterr().err.strip().endswith("the model's output is (50, 9, 1); bijection needs a tensor "
                                                    "(B, T, C) = (50, 9, 6)")
    assert not (out / "eval.json").exists()
