"""Bring your own model: a new architecture is one file with the shared interface (a dataclass config with the
I/O fields the task fills in, forward(x), num_params()) and one entry in presets.MODELS; train.py then trains it
on every task, with its flags in --help, and reproduce.py sweeps it. The file is the README's example."""
import importlib
import json

import presets
import reproduce
import train
from cli import exit_code

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


def add_gru(tmp_path, monkeypatch):
    (tmp_path / "gru.py").write_text(GRU_PY)
    monkeypatch.syspath_prepend(str(tmp_path))
    gru = importlib.import_module("gru")
    monkeypatch.setitem(presets.MODELS, "gru", (gru.GRUConfig, gru.GRU))  # the one line outside the file
    return gru


def test_a_new_model_trains_evaluates_and_has_its_flags(tmp_path, monkeypatch, capsys):
    add_gru(tmp_path, monkeypatch)
    out = tmp_path / "run"
    argv = ["--task", "bijection", "--model", "gru", "--V", "6", "--d_model", "16", "--n_layer", "1",
            "--max_iters", "4", "--batch_size", "8", "--log_interval", "2", "--eval_interval", "2",
            "--eval_samples", "20", "--eval_samples_during", "10", "--out_dir", str(out)]
    assert exit_code(train.main, argv) == 0
    r = json.load(open(out / "results.json"))
    assert r["model"] == "gru" and r["iters"] == 4 and r["model_config"]["d_model"] == 16
    assert r["n_params"] == sum(p.numel() for p in presets.MODELS["gru"][1](presets.MODELS["gru"][0](
        **r["model_config"])).parameters())
    assert exit_code(train.main, ["--task", "bijection", "--model", "gru", "--eval_only", "--out_dir", str(out)]) == 0
    assert json.load(open(out / "eval.json"))["metrics"] == r["metrics"]  # the same held-out sequences
    capsys.readouterr()
    assert exit_code(train.main, ["--model", "gru", "--help"]) == 0
    text = " ".join(capsys.readouterr().out.split())
    assert "model gru: --block_size BLOCK_SIZE" in text and "--n_layer N_LAYER stacked GRU layers (default 2)" in text


def test_reproduce_sweeps_a_new_model_on_every_task(tmp_path, monkeypatch):
    add_gru(tmp_path, monkeypatch)
    out, res = tmp_path / "out", tmp_path / "results"
    argv = ["--preset", "tiny", "--models", "gru", "--out", str(out), "--results", str(res)]
    assert exit_code(reproduce.main, argv) == 0
    table = (res / "table.md").read_text()
    for task in reproduce.TASK_ORDER:
        r = json.load(open(out / "tiny" / f"{task}_gru" / "results.json"))
        assert r["iters"] == 4 and r["model_config"]["d_model"] == 16  # the tiny sizes it has
        assert f"| gru | {r['n_params']:,} | {r['metrics']['default']['mae_curve']:.4f} |" in table
