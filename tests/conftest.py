"""The tests run Mamba's eager sequential scan on a CPU unless a test asks for another mode:
compiling the fused scan step takes seconds for each new shape. Subprocesses inherit the setting."""
import os

os.environ.setdefault("WINDTUNNEL_SCAN", "sequential")


def loss_before_after(model, opts, steps):
    """The loss on a fixed batch of bijection V=6 (Bayes 1.32 nats; a constant predictor gets 1.79) before and
    after `steps` steps of train.py's `model` and optimizer, built with `opts` over the quick preset."""
    import torch
    import tasks
    import settings
    import train
    task = tasks.make_task("bijection", V=6)
    run = settings.run_of("bijection", model, "quick", dict(V=6) | opts)
    torch.manual_seed(0)
    net, opt = train.build(run, torch.device("cpu"))
    fixed = task.sample(256, torch.Generator().manual_seed(1))
    before = task.loss(net(fixed.x), fixed).item()
    g = torch.Generator().manual_seed(2)
    for _ in range(steps):
        b = task.sample(64, g)
        loss = task.loss(net(b.x), b)
        opt.zero_grad()
        loss.backward()
        opt.step()
    return before, task.loss(net(fixed.x), fixed).item()
