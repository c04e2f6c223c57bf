"""
The batch of each training step: drawn fresh from a seeded generator (on the GPU where it has one), `chunk` steps
per sampler call, every rank drawing the same and taking its slice; under --curriculum from that step's stage.
A step's batch is redrawn from the generator state Batches.state records, so a resumed run trains on the same.
"""
import torch


def data_source(train, device, task=None):
    """(generator, chunk): batches are drawn on the generator's device, `chunk` per sampler call. On a GPU a
    draw is a few hundred tiny kernels whatever its size, so one call per 16 steps makes it cheap. A task that
    draws in float64 (task.float64) draws on the CPU for a device without float64 (MPS), and the batch moves."""
    on_gpu = train["data_device"] == "device" or train["data_device"] == "auto" and device.type == "cuda"
    on_gpu = on_gpu and not (device.type == "mps" and getattr(task, "float64", False))
    dev = device if on_gpu else torch.device("cpu")
    chunk = train["data_chunk"] or (16 if dev.type == "cuda" else 1)
    return torch.Generator(device=dev).manual_seed(train["seed"]), chunk


class Batches:
    """The global batch of step `it` is slice it % chunk of one draw of `chunk` batches; every rank draws
    the same and trains on its 1/world slice. state(it) is the generator state that redraws step it's batch."""

    def __init__(self, run, device, rank, world):
        self.gen, self.n = data_source(run.train, device, run.tasks["default"])
        self.B, self.device, self.rank, self.world = run.train["batch_size"], device, rank, world
        self.stage = run.curriculum  # the task of each step: the layout it trains on, grown by --curriculum
        self.chunk = self.chunk_state = None

    def steps_left(self, it, T):
        """The steps from it to T in units of step it's cost, its sequence length (the ETA): T - it, or more
        under a curriculum."""
        return self.stage.tokens(it, T) / self.stage(it).seq_len

    def get(self, it):
        """Step it's batch, and the task it was drawn from (under a curriculum, that step's stage)."""
        k, B = it % self.n, self.B
        if k == 0 or self.chunk is None:  # None: resumed mid-chunk, with the generator at the chunk's start
            self.chunk_state = self.gen.get_state()
            self.chunk_task = self.stage(it - k)
            self.chunk = self.chunk_task.sample(B * self.n, self.gen)
        batch = self.chunk.map(lambda t: t[k * B:(k + 1) * B]) if self.n > 1 else self.chunk
        if self.world > 1:
            per = B // self.world
            batch = batch.map(lambda t: t[self.rank * per:(self.rank + 1) * per])
        if batch.x.device.type == "cpu" and self.device.type == "cuda":  # from pinned memory the copy is asynchronous
            batch = batch.map(lambda t: t.pin_memory().to(self.device, non_blocking=True), latent=False)
        # the oracle's float64 latents stay on the CPU (MPS has no float64)
        return batch.to(self.device, latent=False), self.chunk_task

    def state(self, it):
        return self.gen.get_state() if it % self.n == 0 else self.chunk_state
