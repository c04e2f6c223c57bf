"""
A linear-Gaussian state space whose parameters are stated in context, scored against its Kalman filter: a wind
tunnel of continuous belief transport (the HMM's primitive, with a real-valued hidden state), in one file, to the
task contract alone (README, "Bring your own task").

Each sequence draws a drift a ~ U(-0.95, 0.95) and variances q, r ~ log-uniform on [0.05, 1]; a hidden state
z_t = a z_{t-1} + N(0, q), from the stationary N(0, q / (1 - a^2)); observations y_t = z_t + N(0, r). Position 0
states (a, log q, log r); position t > 0 holds y_{t-1}; every position predicts y_t. The exact predictive is the
filter's: N(m_t, P_t + r), with m_0 = 0, P_0 = q / (1 - a^2), and after each y the update K = P / (P + r),
m <- m + K (y - m), P <- (1 - K) P, then the transport m <- a m, P <- a^2 P + q.

    python train.py --task examples/kalman.py:Kalman --model transformer
    python oracles.py check examples/kalman.py:Kalman
"""
from dataclasses import dataclass
import math

import torch

from tasks import Batch, Task


@dataclass
class Kalman(Task):
    name = "kalman"
    steps: int = 32  # observations a sequence, each one predicted
    a_max: float = 0.95  # the drift a is uniform on [-a_max, a_max]
    var_min: float = 0.05  # q and r are log-uniform on [var_min, var_max]
    var_max: float = 1.0
    # its own stop rule where no preset names it: the level of the project's other Gaussian tunnel (regression)
    defaults = dict(stop_at="mae_token<=0.05", max_iters=3000, eval_interval=250, patience=4)

    gaussian = True
    float64 = True

    def __post_init__(self):
        if not (isinstance(self.steps, int) and self.steps >= 1):
            raise ValueError(f"kalman: steps must be an int >= 1, got {self.steps}")
        if not (0 <= self.a_max < 1 and 0 < self.var_min <= self.var_max <= 1e3):
            raise ValueError(f"kalman: a_max must be in [0, 1) and 0 < var_min <= var_max <= 1e3, got "
                             f"{self.a_max}, {self.var_min}, {self.var_max}")
        self.n_features, self.n_classes, self.seq_len = 4, 2, self.steps  # [a, log q, log r, y_prev]; (mean, log var)

    def sample(self, batch_size, generator=None):
        B, T, g = batch_size, self.steps, generator
        dev = g.device if g is not None else torch.device("cpu")
        u = lambda *shape: torch.rand(*shape, generator=g, device=dev, dtype=torch.float64)
        lo, hi = math.log(self.var_min), math.log(self.var_max)
        # stated in float32, as the model reads them: the dynamics run on the stated values exactly
        a = ((2 * u(B) - 1) * self.a_max).float().double()
        log_q, log_r = ((lo + (hi - lo) * u(B)).float().double() for _ in range(2))
        q, r = log_q.exp(), log_r.exp()
        z = torch.randn(B, generator=g, device=dev, dtype=torch.float64) * (q / (1 - a ** 2)).sqrt()
        ys = []
        for t in range(T):
            if t:
                z = a * z + q.sqrt() * torch.randn(B, generator=g, device=dev, dtype=torch.float64)
            ys.append(z + r.sqrt() * torch.randn(B, generator=g, device=dev, dtype=torch.float64))
        y = torch.stack(ys, 1).float()  # (B, T) the observations, as the inputs state them
        x = torch.zeros(B, T, 4, device=dev)
        x[:, 0, :3] = torch.stack([a, log_q, log_r], -1).float()
        x[:, 1:, 3] = y[:, :-1]
        return Batch(x, y, torch.ones(B, T, dtype=torch.bool, device=dev), dict(a=a, q=q, r=r))

    def posterior(self, x):
        """The Kalman filter's predictive (mean, var) of y_t from the stated (a, q, r) and y_0 .. y_{t-1}."""
        x = x.double()
        a, q, r = x[:, 0, 0], x[:, 0, 1].exp(), x[:, 0, 2].exp()
        m, P = torch.zeros_like(a), q / (1 - a ** 2)  # the stationary prior of z_0
        mean, var = [], []
        for t in range(x.shape[1]):
            if t:  # update with y_{t-1}, then transport one step
                K = P / (P + r)
                m, P = m + K * (x[:, t, 3] - m), (1 - K) * P
                m, P = a * m, a ** 2 * P + q
            mean.append(m)
            var.append(P + r)
        return torch.stack(mean, 1), torch.stack(var, 1)
