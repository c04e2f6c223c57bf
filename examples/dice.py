"""
A die of unknown weights: the Dirichlet-categorical wind tunnel, in one file, to the task contract alone (README,
"Bring your own task"). Belief accumulation, as the bijection's, but of counts rather than of eliminations.

Each sequence draws its die's weights theta ~ Dirichlet(alpha, ..., alpha) over `faces` faces and rolls it `rolls`
times. The model reads the rolls so far and predicts the next: x_t = the roll before t (a start token first),
y_t = roll t, every position scored. The exact predictive is the Dirichlet posterior's mean,
P(y_t = c | y_<t) = (alpha + n_c) / (faces * alpha + t), with n_c the count of face c among the t rolls before t.

    python train.py --task examples/dice.py:Dice --model transformer
    python oracles.py check examples/dice.py:Dice
"""
from dataclasses import dataclass

import torch
import torch.nn.functional as F

from tasks import Batch, Task


@dataclass
class Dice(Task):
    name = "dice"
    faces: int = 6  # the die's faces: the answer classes
    rolls: int = 32  # rolls a sequence, each one scored
    alpha: float = 1.0  # the Dirichlet's concentration: 1 = every die equally likely
    # its own stop rule where no preset names it: the paper's level for accumulation (the bijection's 0.01 bits)
    defaults = dict(stop_at="mae_curve<=0.01", max_iters=3000, eval_interval=250, patience=4)

    def __post_init__(self):
        if not (isinstance(self.faces, int) and self.faces >= 2 and isinstance(self.rolls, int) and self.rolls >= 1):
            raise ValueError(f"dice: faces must be an int >= 2 and rolls an int >= 1, got {self.faces}, {self.rolls}")
        if not 1e-3 <= self.alpha <= 1e3:
            raise ValueError(f"dice: alpha must be in [1e-3, 1e3], got {self.alpha}")
        self.vocab_size = self.faces + 1  # faces 0..faces-1, then the start token
        self.n_classes, self.answer_offset = self.faces, 0  # face c is token c
        self.n_features, self.gaussian, self.seq_len = 0, False, self.rolls

    def sample(self, batch_size, generator=None):
        dev = generator.device if generator is not None else torch.device("cpu")
        theta = dirichlet(batch_size, self.faces, self.alpha, generator, dev)  # the die of each sequence
        u = torch.rand(batch_size, self.rolls, 1, generator=generator, device=dev, dtype=torch.float64)
        y = (theta.cumsum(-1)[:, None, :] < u).sum(-1).clamp(max=self.faces - 1)  # (B, rolls) inverse CDF
        start = torch.full((batch_size, 1), self.faces, dtype=torch.long, device=dev)
        x = torch.cat([start, y[:, :-1]], 1)  # the roll before each position
        return Batch(x, y, torch.ones_like(y, dtype=torch.bool), dict(theta=theta))

    def posterior(self, x):
        """(alpha + n_c) / (faces alpha + t) at position t, the counts n_c of the rolls in x_1..x_t."""
        seen = F.one_hot(x, self.faces + 1)[..., :self.faces].double()  # the start token counts as no face
        counts = seen.cumsum(1)  # (B, T, faces): the rolls up to x_t, i.e. before roll t
        return (self.alpha + counts) / (self.faces * self.alpha + counts.sum(-1, keepdim=True))


def dirichlet(B, k, alpha, g, dev):
    """(B, k) float64 rows ~ Dirichlet(alpha): Gamma(alpha) draws by Marsaglia and Tsang's method (alpha >= 1; below,
    boosted by U^(1/alpha)), normalised, from the generator's uniforms and normals alone (seeded, on its device)."""
    a = alpha if alpha >= 1 else alpha + 1
    d, out = a - 1 / 3, torch.zeros(B, k, dtype=torch.float64, device=dev)
    c, todo = 1 / (9 * d) ** 0.5, torch.ones(B, k, dtype=torch.bool, device=dev)
    for _ in range(64):  # each round accepts > 95% of what is left: 64 rounds leave none in practice
        z = torch.randn(B, k, generator=g, device=dev, dtype=torch.float64)
        u = torch.rand(B, k, generator=g, device=dev, dtype=torch.float64)
        v = (1 + c * z) ** 3
        ok = todo & (v > 0) & (torch.log(u) < 0.5 * z ** 2 + d - d * v + d * torch.log(v.clamp(min=1e-300)))
        out, todo = torch.where(ok, d * v, out), todo & ~ok
    out = torch.where(todo, d, out)  # never in practice: the mean, not a failure
    if alpha < 1:
        out = out * torch.rand(B, k, generator=g, device=dev, dtype=torch.float64) ** (1 / alpha)
    return out / out.sum(-1, keepdim=True)
