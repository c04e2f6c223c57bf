"""A run's settings resolved once: a copied model file keeps its recipe, the resolved run is shown and written
beside its checkpoint, and the plumbing imports nothing of the configuration; a model file of one's own that gets
something wrong is one line, naming its file and line."""
import ast
import json
import os
import shutil

import pytest

from cli import exit_code
import optim
import settings
import train

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
HOW = ("out_dir",)  # where a run writes: its own


def same_run(a, b):
    a, b = dict(a.description), dict(b.description)
    for d in (a, b):
        d["train"] = {k: v for k, v in d["train"].items() if k not in HOW}
        d.pop("model"), d.pop("entries")
    return a == b


@pytest.mark.parametrize("task", ["recall", "hmm", "bijection"])
@pytest.mark.parametrize("model", ["mamba", "transformer", "lstm"])
def test_a_copied_model_file_runs_its_originals_recipe(tmp_path, task, model):
    shutil.copy(os.path.join(ROOT, f"{model}.py"), tmp_path / "mine.py")
    cls = dict(mamba="Mamba", transformer="Transformer", lstm="LSTM")[model]
    fork = settings.run_of(task, f"{tmp_path / 'mine.py'}:{cls}", "quick")
    assert same_run(fork, settings.run_of(task, model, "quick")) and f"its class is {model}'s name" in fork.entries


def test_a_class_of_another_name_takes_its_config_defaults_unless_told(tmp_path, capsys):
    text = open(os.path.join(ROOT, "mamba.py")).read().replace("class Mamba(", "class Mine(").replace(
        "class MambaConfig:", "class MineConfig:").replace("MambaConfig", "MineConfig")
    (tmp_path / "mine.py").write_text(text)
    spec = f"{tmp_path / 'mine.py'}:Mine"
    own = settings.run_of("recall", spec, "quick")
    assert "none (its config's defaults" in own.entries and own.train["optimizer"] == "adamw"
    told = settings.run_of("recall", spec, "quick", dict(preset_model="mamba"))
    assert "mamba (--preset_model mamba)" in told.entries and told.train["optimizer"] == "muon"
    assert told.model_config["d_state"] == settings.run_of("recall", "mamba", "quick").model_config["d_state"] == 32
    assert exit_code(train.main, ["--task", "recall", "--model", spec, "--dry_run"]) == 0
    shown = json.loads(capsys.readouterr().out)
    assert shown["entries"].startswith("quick: recall, none") and shown["train"]["stop_at"] == "accuracy>=0.999"


def test_dry_run_shows_the_whole_resolved_run_and_writes_nothing(tmp_path, capsys):
    out = tmp_path / "r"
    assert exit_code(train.main, ["--out_dir", str(out), "--dry_run"]) == 0  # the headline's recipe
    run = json.loads(capsys.readouterr().out)
    assert (run["task"], run["model"], run["train"]["optimizer"], run["train"]["lr"]) == \
        ("recall", "transformer", "muon", 0.006)
    assert run["model_config"]["pos"] == "alibi" and run["model_config"]["n_head"] == 16
    assert run["train"]["lr_decay_iters"] == 300 and run["n_params"] > 0 and not out.exists()


def test_the_plumbing_imports_nothing_of_the_project():
    """checkpoints.py and commandline.py import no file of the project: files and command lines know nothing of
    tasks, models or settings."""
    project = {f[:-3] for f in os.listdir(ROOT) if f.endswith(".py")}
    for name in ("checkpoints.py", "commandline.py"):
        tree = ast.parse(open(os.path.join(ROOT, name)).read())
        imported = {a.name.split(".")[0] for n in ast.walk(tree) if isinstance(n, ast.Import) for a in n.names}
        imported |= {n.module.split(".")[0] for n in ast.walk(tree) if isinstance(n, ast.ImportFrom) and n.module}
        assert not imported & project, (name, imported & project)


def no_line_past_120_columns():
    for f in sorted(os.listdir(ROOT)):
        if f.endswith(".py"):
            for i, line in enumerate(open(os.path.join(ROOT, f)), 1):
                if len(line.rstrip("\n")) > 120:
                    yield f"{f}:{i}"


def test_no_line_past_120_columns():
    assert list(no_line_past_120_columns()) == []

# -----------------------------------------------------------------------------
# a model file of one's own that gets something wrong: one line


MODEL = '''
from dataclasses import dataclass, field
import torch
import torch.nn as nn


@dataclass
class NetConfig:
    {first}
    vocab_size: int = 0
    n_classes: int = 2
    d_model: int = 16  # width
    {extra}


class Net(nn.Module):
    def __init__(self, config):
        super().__init__()
        self.config = config
        {init}
        self.wte = nn.Embedding(config.vocab_size, config.d_model)
        self.head = nn.Linear(config.d_model, config.n_classes)

    def num_params(self):
        return sum(p.numel() for p in self.parameters())

    def forward(self, x):
        {forward}
        return self.head(self.wte(x))
'''


def net(tmp_path, extra="", init="pass", forward="pass", first=""):
    (tmp_path / "net.py").write_text(MODEL.format(extra=extra, init=init, forward=forward, first=first))
    return f"{tmp_path / 'net.py'}:Net"


def one_line(capsys, *want):
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and all(w in err for w in want), err
    return err


ARGV = ["--task", "bijection", "--V", "6", "--max_iters", "2", "--batch_size", "4", "--eval_samples", "8",
        "--eval_samples_during", "8", "--device", "cpu"]


@pytest.mark.parametrize("extra, flag, what", [("seed: int = 3", "--seed", "a training setting"),
                                               ("task: str = 'x'", "--task", "a flag of train.py"),
                                               ("V: int = 4", "--V", "an option of --task bijection")])
def test_a_config_field_that_is_also_a_flag_is_refused_naming_both(tmp_path, capsys, extra, flag, what):
    assert exit_code(train.main, ARGV + ["--model", net(tmp_path, extra), "--out_dir", str(tmp_path / "r")]) == 2
    one_line(capsys, f"config field {flag[2:]!r} is also {what} ({flag})")


def test_a_field_without_a_default_asks_for_its_flag(tmp_path, capsys):
    spec = net(tmp_path, first="depth: int  # layers")
    assert exit_code(train.main, ARGV + ["--model", spec, "--out_dir", str(tmp_path / "r")]) == 2
    one_line(capsys, "the following arguments are required: --depth")
    assert exit_code(train.main, ARGV + ["--model", spec, "--depth", "2", "--out_dir", str(tmp_path / "r")]) == 0


def test_a_list_field_that_may_be_none_gets_a_working_flag(tmp_path, capsys):
    spec = net(tmp_path, "widths: list[int] | None = None  # per layer")
    argv = ARGV + ["--model", spec, "--widths", "3", "4", "--out_dir", str(tmp_path / "r")]
    assert exit_code(train.main, argv) == 0
    assert json.load(open(tmp_path / "r" / "results.json"))["model_config"]["widths"] == [3, 4]


@pytest.mark.parametrize("forward", ["x = x.detach(); return (self.head(self.wte(x)) * 0).detach()",
                                     "return torch.zeros(*x.shape, self.config.n_classes)"])
def test_a_model_whose_output_has_no_gradient_is_refused(tmp_path, capsys, forward):
    assert exit_code(train.main, ARGV + ["--model", net(tmp_path, forward=forward), "--out_dir",
                                         str(tmp_path / "r")]) == 2
    one_line(capsys, "its output has no gradient")


@pytest.mark.parametrize("where, code", [("init", "raise ValueError('bad init')"),
                                         ("forward", "raise ValueError('bad forward')")])
def test_an_error_in_the_models_own_code_names_its_file_and_line(tmp_path, capsys, where, code):
    spec = net(tmp_path, **{where: code})
    assert exit_code(train.main, ARGV + ["--model", spec, "--out_dir", str(tmp_path / "r")]) == 2
    line = (tmp_path / "net.py").read_text().splitlines().index(f"        {code}") + 1
    one_line(capsys, f"ValueError: bad {where} at {tmp_path / 'net.py'}:{line}")


def test_a_checkpoint_whose_model_file_moved_says_the_file_is_gone(tmp_path, capsys):
    spec = net(tmp_path)
    assert exit_code(train.main, ARGV + ["--model", spec, "--out_dir", str(tmp_path / "r")]) == 0
    os.rename(tmp_path / "net.py", tmp_path / "moved.py")
    assert exit_code(train.main, ["--task", "bijection", "--model", spec, "--out_dir", str(tmp_path / "r"),
                                  "--eval_only"]) == 2
    one_line(capsys, f"the model file {tmp_path / 'net.py'} it was trained from is gone")


@pytest.mark.parametrize("curriculum", [[], ["--curriculum", "L=2"]])
def test_a_schedule_of_10_23_steps_prints_its_first_line_at_once(tmp_path, capsys, monkeypatch, curriculum):
    """The ETA counts the steps left in closed form: before, it summed over every one and never printed."""
    real = optim.get_lr

    def stop_at_the_second_step(it, t):
        if it == 1:
            raise KeyboardInterrupt
        return real(it, t)
    monkeypatch.setattr(train, "get_lr", stop_at_the_second_step)
    argv = ARGV + curriculum + ["--max_iters", str(10 ** 23), "--out_dir", str(tmp_path / "r")]
    with pytest.raises(KeyboardInterrupt):
        train.main(argv)
    assert f"step      1/{10 ** 23} | loss" in capsys.readouterr().out


def test_an_absurd_learning_rate_is_refused(tmp_path, capsys):
    assert exit_code(train.main, ARGV + ["--lr", "1e308", "--out_dir", str(tmp_path / "r")]) == 2
    one_line(capsys, "--lr must be in (0, 1e30]", "got 1e+308")


def test_overwrite_sets_the_old_models_diagnostics_aside_with_it(tmp_path):
    out = tmp_path / "r"
    assert exit_code(train.main, ARGV + ["--out_dir", str(out)]) == 0
    (out / "geometry_values.json").write_text("{}")
    assert exit_code(train.main, ARGV + ["--out_dir", str(out), "--overwrite"]) == 0
    assert not (out / "geometry_values.json").exists() and (out / "config.json").exists()
