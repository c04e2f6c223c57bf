"""A wind tunnel of one's own: a task and its exact posterior from a file, held against its own sampler
(oracles.check), then trained, tabled and diagnosed as the built-ins are."""
from dataclasses import dataclass, replace
import json
import os

import pytest
import torch
import torch.nn.functional as F

from cli import exit_code
import oracles
import reproduce
import tasks
import train

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
DICE, KALMAN = (os.path.join(ROOT, "examples", f) for f in ("dice.py:Dice", "kalman.py:Kalman"))
SMALL = dict(bijection=dict(V=6), hmm=dict(n_states=3, n_obs=3, K=8), regression=dict(d=3, K=6),
             recall=dict(n_pairs=4, n_queries=2, key_vocab=8, value_vocab=8, filler=2), hop={})
QUIET = dict(say=lambda line: None)


def check(task, n_seq=1500, pairs=16):
    return oracles.failed(oracles.check(task, n_seq=n_seq, pairs=pairs, **QUIET))


@pytest.mark.parametrize("name", list(SMALL) + ["dice", "kalman"])
def test_every_tunnel_holds_against_its_own_sampler(name):
    task = tasks.make_task({"dice": DICE, "kalman": KALMAN}.get(name, name), **SMALL.get(name, {}))
    assert check(task) is None


def wrong(task, posterior):
    """task with its posterior replaced (a subclass of its class, as one line of a wrong oracle)."""
    cls = dataclass(type(type(task).__name__, (type(task),), dict(posterior=posterior)))
    return cls(**task.options())


def bij_count_off_by_one(self, x):  # the last pair's value still possible: uniform over V - t + 1
    p, V = oracles.bijection_posterior(self, x).clone(), self.V
    shown = F.one_hot(x[:, 1:2 * self.L - 1:2] - self.answer_offset, V).double()
    used = torch.cat([torch.zeros_like(shown[:, :2]), shown[:, :-1]], 1).cumsum(1).clamp(max=1)  # pairs < t - 1
    p[:, 0:2 * self.L:2] = (1 - used) / (1 - used).sum(-1, keepdim=True)
    return p


def hmm_filter_of(self, x, obs_shift=0, prior=None):
    S, O, h = self.n_states, self.n_obs, self.header_len
    T = oracles.hmm_header(x[:, 1:1 + S * S].reshape(-1, S, S))
    E = oracles.hmm_header(x[:, 2 + S * S:2 + S * S + S * O].reshape(-1, S, O))
    obs, a = (x[:, h + 1::2] - self.symbol_offset + obs_shift) % O, prior.expand(len(x), S)
    out, p = [], oracles.uniform(x, S)
    for t in range(obs.shape[1]):
        a = (a.unsqueeze(1) @ T).squeeze(1) if t else a
        a = a * E.gather(2, obs[:, t, None, None].expand(-1, S, 1)).squeeze(-1)
        out.append(a / a.sum(-1, keepdim=True))
        a = out[-1]
    p[:, h + 1::2] = torch.stack(out, 1)
    return p


def peek(p, after, every):
    """p with a point mass on the input after each scored position (every `every` positions, the last excepted)."""
    p = p.clone()
    t = torch.arange(0, p.shape[1] - 1, every)
    p[:, t] = F.one_hot(after[:, t], p.shape[-1]).double()
    return p


WRONG = {  # (task, the wrong posterior in one line): each a kind of mistake an oracle is written with
    "bijection, a wrong prior": (
        "bijection", lambda s, x: (lambda p: p / p.sum(-1, keepdim=True))(
            oracles.bijection_posterior(s, x) * torch.linspace(1, 2, s.V, dtype=torch.float64))),
    "bijection, a count off by one": ("bijection", bij_count_off_by_one),
    "bijection, a peek at the next input": ("bijection", lambda s, x: peek(oracles.bijection_posterior(s, x),
                                                                         x[:, 1:] - s.answer_offset, 2)),
    "hmm, a wrong prior": ("hmm", lambda s, x: hmm_filter_of(s, x, prior=torch.tensor([0.8, 0.1, 0.1],
                                                                                      dtype=torch.float64))),
    "hmm, a count off by one": ("hmm", lambda s, x: hmm_filter_of(s, x, obs_shift=1, prior=torch.full(
        (3,), 1 / 3, dtype=torch.float64))),
    "hmm, a peek at the next input": ("hmm", lambda s, x: torch.cat([oracles.hmm_posterior(s, x)[:, 2:],
                                                                     oracles.uniform(x, s.n_states)[:, :2]], 1)),
    "regression, a wrong prior": ("regression",
                                  lambda s, x: oracles.regression_posterior(replace(s, prior_std=3.0), x)),
    "regression, a count off by one": ("regression", lambda s, x: (lambda m, v: (m, v - (v - s.noise_std ** 2) / 2))(
        *oracles.regression_posterior(s, x))),
    "regression, a peek at the next input": ("regression", lambda s, x: (lambda m, v: (
        torch.where(torch.arange(x.shape[1]) % 2 == 0, F.pad(x[:, 1:, s.d].double(), (0, 1)), m), v))(
        *oracles.regression_posterior(s, x))),
    "regression, a variance doubled": ("regression", lambda s, x: (lambda m, v: (m, 2 * v))(
        *oracles.regression_posterior(s, x))),
    "recall, a wrong prior": ("recall", lambda s, x: 0.9 * oracles.recall_posterior(s, x) + 0.1 / s.n_classes),
    "recall, a count off by one": ("recall", lambda s, x: oracles.recall_posterior(s, x).roll(1, -1)),
    "hop, a count off by one": ("hop", lambda s, x: oracles.hop_posterior(replace(s, hops=s.hops - 1), x)),
    "dice, a wrong prior": (DICE, lambda s, x: tasks.task_class(DICE).posterior(replace(s, alpha=3.0), x)),
    "dice, a peek at the next input": (DICE, lambda s, x: peek(tasks.task_class(DICE).posterior(s, x), x[:, 1:], 1)),
    "kalman, a variance doubled": (KALMAN, lambda s, x: (lambda m, v: (m, 2 * v))(
        *tasks.task_class(KALMAN).posterior(s, x))),
}


@pytest.mark.parametrize("what", list(WRONG))
def test_a_wrong_posterior_fails_the_check(what):
    name, posterior = WRONG[what]
    task = tasks.make_task(name, **SMALL.get(name, {}))
    why = check(wrong(task, lambda self, x: posterior(self, x)))
    assert why is not None, what
    if "peek" in what and name in ("bijection", DICE):  # right on average: only the splice tells
        assert why.startswith("(iv) causality"), why


def test_a_posterior_that_reads_the_latents_is_refused_by_its_signature():
    """posterior(x) is given the inputs alone: a posterior that needs the batch's latents cannot be written."""
    task = tasks.make_task("bijection", V=6)
    with pytest.raises(TypeError):
        task.posterior(task.sample(2, torch.Generator().manual_seed(0)))  # a Batch is not x


TASK_PY = '''
from dataclasses import dataclass
import torch
from tasks import Batch, Task


@dataclass
class Coin(Task):
    """A coin of unknown bias p ~ U(0, 1): predict each toss from the ones before; posterior (1 + heads) / (2 + t)."""
    name = "coin"
    tosses: int = 12  # tosses a sequence
    BROKEN = ""

    def __post_init__(self):
        self.vocab_size, self.n_classes, self.answer_offset, self.seq_len = 3, 2, 0, self.tosses

    def sample(self, batch_size, generator=None):
        if self.BROKEN == "sample":
            raise RuntimeError("no coin")
        p = torch.rand(batch_size, 1, generator=generator)
        y = (torch.rand(batch_size, self.tosses, generator=generator) < p).long()
        x = torch.cat([torch.full((batch_size, 1), 2), y[:, :-1]], 1)
        mask = torch.ones_like(y, dtype=torch.bool)
        if self.BROKEN == "mask":
            mask = mask.long()
        return Batch(x, y, mask, dict(p=p))

    def posterior(self, x):
        heads = (x == 1).double().cumsum(1)
        t = (x != 2).double().cumsum(1)
        p = (1 + heads) / (2 + t)
        if self.BROKEN == "shape":
            return p
        if self.BROKEN == "sum":
            return torch.stack([1 - p, p + 0.1], -1)
        if self.BROKEN == "prior":  # reads a Beta(1, 1) prior as Beta(2, 2)
            p = (2 + heads) / (4 + t)
        return torch.stack([1 - p, p], -1)
'''


@pytest.fixture
def coin(tmp_path):
    path = tmp_path / "coin.py"
    path.write_text(TASK_PY)
    return f"{path}:Coin"


def test_a_task_from_a_file_trains_resumes_and_evaluates(coin, tmp_path, capsys):
    out = str(tmp_path / "run")
    argv = ["--task", coin, "--model", "transformer", "--n_layer", "1", "--n_head", "2", "--d_model", "16",
            "--batch_size", "8", "--max_iters", "4", "--eval_interval", "2", "--eval_samples", "20",
            "--eval_samples_during", "20", "--device", "cpu", "--out_dir", out]
    assert exit_code(train.main, argv) == 0
    said = capsys.readouterr().out
    assert "posterior check" in said and "holds" in said and "preset quick: any task" in said
    r = json.load(open(os.path.join(out, "results.json")))
    assert r["task"] == coin and r["task_options"] == dict(tosses=12) and r["iters"] == 4
    config = json.load(open(os.path.join(out, "config.json")))  # the resolved run, beside its checkpoint
    assert config["model_config"]["vocab_size"] == 3 and config["train"]["max_iters"] == 4
    assert exit_code(train.main, argv[:-2] + ["--out_dir", out, "--resume", "--max_iters", "6"]) == 0
    assert json.load(open(os.path.join(out, "results.json")))["iters"] == 6


@pytest.mark.parametrize("broken, line", [
    ("sample", "raised RuntimeError: no coin"), ("mask", "Batch.mask is (B, T) bool"),
    ("shape", "posterior(x) returns float64 probabilities (B, T, C)"),
    ("sum", "posterior(x) is finite, >= 0 and sums to 1"),
    ("prior", "its posterior fails the check: (i) surprisal - entropy")])
def test_a_broken_task_is_refused_in_one_line_naming_what_it_breaks(coin, tmp_path, broken, line, capsys):
    path = coin.rpartition(":")[0]
    with open(path) as f:
        text = f.read().replace('BROKEN = ""', f'BROKEN = "{broken}"')
    with open(path, "w") as f:
        f.write(text)
    assert exit_code(train.main, ["--task", coin, "--max_iters", "2", "--out_dir", str(tmp_path / "r")]) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and line in err, err
    assert not os.path.exists(tmp_path / "r")


@pytest.mark.parametrize("text, says", [
    ("class Coin:\n    pass\n", "is not a subclass of tasks.Task"),
    ("from tasks import Task\nclass Coin(Task):\n    name = 'c'\n", "is not a @dataclass"),
    ("from dataclasses import dataclass\nfrom tasks import Task\n@dataclass\nclass Coin(Task):\n    pass\n",
     "has no name"),
    ("from dataclasses import dataclass\nfrom tasks import Task\n@dataclass\nclass Coin(Task):\n    name = 'hmm'\n",
     "is a built-in task's: name it otherwise"),
    ("raise ValueError('nope')\n", "importing it raised ValueError: nope at")])
def test_a_file_that_is_not_a_task_is_one_line(tmp_path, text, says, capsys):
    (tmp_path / "bad.py").write_text(text)
    assert exit_code(train.main, ["--task", f"{tmp_path / 'bad.py'}:Coin", "--out_dir", str(tmp_path / "r")]) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and says in err, err


def test_the_check_from_the_command_line(coin, capsys):
    assert exit_code(oracles.main, ["check", "bijection", "--V", "5", "--n_seq", "500", "--pairs", "4"]) == 0
    out = capsys.readouterr().out
    assert "check bijection (V=5" in out and out.strip().splitlines()[-1].startswith("holds")
    path = coin.rpartition(":")[0]
    with open(path) as f:
        text = f.read().replace('BROKEN = ""', 'BROKEN = "prior"')
    with open(path, "w") as f:
        f.write(text)
    assert exit_code(oracles.main, ["check", coin, "--n_seq", "2000", "--pairs", "4"]) == 1
    assert "FAILS" in capsys.readouterr().out.strip().splitlines()[-1]
    assert exit_code(oracles.main, ["check", "nope"]) == 2
    assert "unknown task 'nope'" in capsys.readouterr().err


def test_a_task_from_a_file_gets_a_table_section(coin, tmp_path):
    out, res = tmp_path / "out", tmp_path / "results"
    argv = ["--preset", "tiny", "--tasks", f"hop,{coin}", "--models", "transformer,lstm", "--out", str(out),
            "--results", str(res), "--jobs", "1"]
    assert exit_code(reproduce.main, argv) == 0
    table = (res / "table.md").read_text()
    assert "## coin" in table and "## hop" in table and (out / "tiny" / "coin_lstm" / "results.json").exists()
