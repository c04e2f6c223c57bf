"""A first run on a GPU, under torchrun or on a Mac, checked on the CPU: fake devices and patched
torch.cuda / torch.backends.mps / torch.compile stand in for the hardware; the tests that need CUDA
itself skip without it."""
from functools import partial
import json
import os

import pytest
import torch
from torch.overrides import TorchFunctionMode
import torch.utils._pytree as pytree

import bench
import checkpoints
import hardware
import optim
import reproduce
import runtime
import train
from cli import exit_code

cuda = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")
run_main = partial(exit_code, train.main)
TINY = ["--n_layer", "1", "--max_iters", "3", "--batch_size", "8", "--log_interval", "1", "--eval_interval", "3",
        "--eval_samples", "20", "--eval_samples_during", "10"]
SMALL = dict(hmm=["--K", "4", "--n_states", "3", "--n_obs", "3", "--eval_K", "6"], regression=["--K", "4", "--d", "2"])


class FakeMPS(TorchFunctionMode):
    """Apple MPS played by the CPU: tensors moved to "mps", and those computed from them, count as on MPS,
    and, as on MPS, none of them may be float64."""

    def __init__(self, generators=()):
        super().__init__()
        self.on = {}  # id -> tensor, kept alive so that no id is reused
        self.generators = generators  # generators made for "mps": what they draw is on MPS

    def __torch_function__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        if func in (torch.Tensor.to, torch.Tensor.cpu):
            t = args[0]
            device, dtype = (torch._C._nn._parse_to(*args[1:], **kwargs)[:2] if func is torch.Tensor.to
                             else ("cpu", None))
            if device is not None:  # a move: a copy where it crosses between "devices", as a real move does
                to_mps = torch.device(device).type == "mps"
                out = t.to("cpu", dtype or t.dtype, copy=to_mps or id(t) in self.on)
                return self.mark(out) if to_mps else out
        out = func(*args, **kwargs)
        if any(kwargs.get("generator") is g for g in self.generators) or \
                any(id(t) in self.on for t in pytree.tree_leaves((args, kwargs)) if isinstance(t, torch.Tensor)):
            pytree.tree_map_only(torch.Tensor, self.mark, out)  # computed on MPS, stays there
        return out

    def mark(self, t):
        if t.dtype == torch.float64:
            raise TypeError("Cannot convert a MPS Tensor to float64 dtype as the MPS framework doesn't support float64")
        self.on[id(t)] = t
        return t


@pytest.mark.parametrize("task", ["hmm", "regression"])
def test_a_device_without_float64_gets_only_the_models_tensors(tmp_path, monkeypatch, task):
    monkeypatch.setattr(torch.backends.mps, "is_available", lambda: True)
    argv = ["--task", task, "--device", "mps", "--d_model", "16", "--n_head", "2", "--out_dir", str(tmp_path)]
    with FakeMPS() as mps:
        assert run_main(argv + TINY + SMALL[task]) == 0
    assert len(mps.on) > 0  # the model did run "on MPS"
    r = json.load(open(tmp_path / "results.json"))
    assert r["device"] == "mps" and r["metrics"]["default"]["n_sequences"] == 20


@pytest.mark.parametrize("task", ["hmm", "regression", "bijection"])
def test_data_drawn_on_mps_is_drawn_in_float64_on_the_cpu(tmp_path, monkeypatch, task):
    # --data_device device: hmm and regression draw float64, which MPS refuses; they draw on the CPU and move
    real, made = torch.Generator, []

    class Generator:  # torch.Generator("mps") played by a CPU generator whose draws count as on MPS; a class, so
        def __new__(cls, device="cpu"):  # that annotations such as `torch.Generator | None` still evaluate
            g = real("cpu")
            if torch.device(device).type == "mps":
                made.append(g)
            return g

    monkeypatch.setattr(torch.backends.mps, "is_available", lambda: True)
    monkeypatch.setattr(torch, "Generator", Generator)
    argv = ["--task", task, "--device", "mps", "--data_device", "device", "--data_chunk", "2", "--d_model", "16",
            "--n_head", "2", "--out_dir", str(tmp_path)]
    with FakeMPS(made):
        assert run_main(argv + TINY + SMALL.get(task, ["--V", "6"])) == 0
    assert len(made) == (task == "bijection")  # bijection draws no float64: on the device
    assert json.load(open(tmp_path / "results.json"))["iters"] == 3


def compile_with(monkeypatch, backend):
    monkeypatch.setattr(torch, "compile", partial(torch.compile, backend=backend))


def test_compile_falls_back_to_eager_at_the_first_backward(tmp_path, monkeypatch, capsys):
    # with the aot_eager backend the chunked linear attention compiles its forward and then raises
    # "view size is not compatible" in the backward
    compile_with(monkeypatch, "aot_eager")
    argv = ["--task", "bijection", "--V", "6", "--model", "linear_attn", "--mode", "chunked", "--d_model", "16",
            "--n_head", "2", "--compile", "--device", "cpu", "--out_dir", str(tmp_path)]
    assert run_main(argv + TINY) == 0
    out = capsys.readouterr().out
    assert out.count("torch.compile failed") == 1 and "running eager" in out
    assert json.load(open(tmp_path / "results.json"))["iters"] == 3


def test_compile_falls_back_to_eager_at_a_later_recompile(tmp_path, monkeypatch, capsys):
    # a backend that compiles the training graphs and fails on the evaluation's (no_grad) recompile
    def backend(gm, inputs):
        if not torch.is_grad_enabled():
            raise RuntimeError("cannot compile this graph")
        return gm.forward

    compile_with(monkeypatch, backend)
    argv = ["--task", "bijection", "--V", "6", "--model", "mlp", "--d_model", "16", "--compile", "--device", "cpu",
            "--out_dir", str(tmp_path)]
    assert run_main(argv + TINY) == 0
    out = capsys.readouterr().out
    assert out.count("torch.compile failed") == 1 and "cannot compile this graph" in out
    assert out.index("step      3/3") < out.index("torch.compile failed")  # the training steps were compiled


def test_a_sweep_of_compiled_runs_in_one_process_stays_compiled(tmp_path, monkeypatch):
    # without a reset per run the third would find dynamo's recompile limit used up by the first two and run
    # eager, saying nothing; here hitting the limit raises, so a run would say "torch.compile failed"
    compiled, per_run, real_run = [], [], train.train_loop

    def backend(gm, inputs):
        compiled.append(gm)
        return gm.forward

    def run(*a, **k):
        n = len(compiled)
        rc = real_run(*a, **k)
        per_run.append(len(compiled) - n)
        return rc

    compile_with(monkeypatch, backend)
    monkeypatch.setattr(train, "train_loop", run)
    out = tmp_path / "out"
    # config.patch, not monkeypatch: undoing a monkeypatch deletes the option, which hides it from later tests
    with torch._dynamo.config.patch(fail_on_recompile_limit_hit=True):
        assert exit_code(reproduce.main, ["--preset", "tiny", "--tasks", "bijection,hmm,recall", "--models",
                                          "transformer", "--out", str(out), "--results", str(tmp_path / "res"),
                                           "--jobs",
                                          "1", "--", "--compile"]) == 0  # one process, one after another
    assert len(per_run) == 3 and min(per_run) >= 2, per_run  # each run compiles its training and evaluation graphs
    for log in (out / "tiny").glob("*/train.log"):
        assert "torch.compile failed" not in log.read_text()


@pytest.mark.parametrize("local_rank", [0, 1])
def test_torchrun_with_more_processes_than_gpus_is_a_clear_error(tmp_path, monkeypatch, capsys, local_rank):
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 1)
    for k, v in dict(WORLD_SIZE=2, RANK=local_rank, LOCAL_RANK=local_rank, LOCAL_WORLD_SIZE=2).items():
        monkeypatch.setenv(k, str(v))
    assert run_main(["--task", "bijection", "--device", "cuda", "--out_dir", str(tmp_path / "run")]) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1
    assert "started 2 processes on this machine but it has 1 GPU: use --nproc_per_node=1" in err
    assert not (tmp_path / "run").exists()  # nothing started


def test_a_gpu_index_beyond_the_machines_is_a_clear_error(monkeypatch, capsys):
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 2)
    assert run_main(["--task", "bijection", "--device", "cuda:2", "--out_dir", "/nonexistent/never"]) == 2
    assert "device 'cuda:2' does not exist here: this machine has 2 GPUs" in capsys.readouterr().err


@pytest.mark.parametrize("layers, bidirectional", [(1, False), (2, True)])
def test_bench_counts_the_flops_of_cudnns_lstm(layers, bidirectional):
    # aten._cudnn_rnn has a meta kernel, so its call on a GPU can be replayed here; 2 flops per weight per token
    T, B, I, H, dirs = 7, 3, 5, 6, 1 + bidirectional
    m = dict(device="meta")
    weights = [w for layer in range(layers) for _ in range(dirs)
               for w in (torch.empty(4 * H, I if layer == 0 else H * dirs, **m), torch.empty(4 * H, H, **m),
                         torch.empty(4 * H, **m), torch.empty(4 * H, **m))]
    h0 = torch.empty(layers * dirs, B, H, **m)
    args = (torch.empty(T, B, I, **m), weights, 4, None, h0, h0, 2, H, 0, layers, False, 0.0, True, bidirectional,
            [], None)
    expect = 2 * T * B * sum(w.numel() for w in weights if w.dim() == 2)
    with torch.utils.flop_counter.FlopCounterMode(display=False, custom_mapping=bench.EXTRA_FLOPS) as counter:
        torch.ops.aten._cudnn_rnn(*args)
    assert counter.get_total_flops() == expect
    # the backward has no meta kernel: its formula, called as the counter calls it
    output, _, _, reserve, _ = torch.ops.aten._cudnn_rnn(*args)
    backward = counter.flop_registry[torch.ops.aten._cudnn_rnn_backward]
    bargs = args[:3] + (torch.empty(0, **m), h0, h0, output, output, h0, h0) + args[6:] + (reserve, [True] * 4)
    assert backward(*bargs, out_val=None) == 2 * expect


@pytest.mark.filterwarnings("ignore:CUDA is not available")  # torch.autocast("cuda") on this machine
@pytest.mark.parametrize("native, expect", [(True, True), (False, False)])
def test_bf16_autocast_only_where_the_gpu_has_it_natively(monkeypatch, native, expect):
    # a T4 or V100: bf16 by emulation only
    monkeypatch.setattr(torch.cuda, "is_bf16_supported", lambda including_emulation=True: native or including_emulation)
    assert runtime.autocast("auto", torch.device("cuda"))[0] is expect
    assert runtime.autocast("float32", torch.device("cuda"))[0] is False
    assert runtime.autocast("auto", torch.device("cpu"))[0] is False


def test_checkpoints_hold_the_cuda_rng_state(monkeypatch):
    state, restored = torch.arange(16, dtype=torch.uint8), []
    monkeypatch.setattr(torch.cuda, "get_rng_state", lambda device="cuda": state.clone())
    monkeypatch.setattr(torch.cuda, "set_rng_state", lambda s, device="cuda": restored.append((s, device)))
    dev = torch.device("cuda:0")
    saved = checkpoints.rng_state(dev)
    assert set(saved) == {"torch_rng", "cuda_rng"} and torch.equal(saved["cuda_rng"], state)
    checkpoints.set_rng_state(saved, dev)
    assert len(restored) == 1 and torch.equal(restored[0][0], state) and restored[0][1] == dev
    assert set(checkpoints.rng_state(torch.device("cpu"))) == {"torch_rng"}
    # a CPU run resumed on a GPU: the seeded state
    checkpoints.set_rng_state(checkpoints.rng_state(torch.device("cpu")), dev)
    assert len(restored) == 1


@cuda
def test_a_gpu_run_with_dropout_resumes_with_the_same_masks(tmp_path):
    a, b = tmp_path / "a", tmp_path / "b"
    common = ["--task", "bijection", "--V", "6", "--model", "lstm", "--n_layer", "2", "--d_model", "16",
              "--dropout", "0.5", "--lr", "1e-2", "--warmup_iters", "1", "--batch_size", "8", "--max_iters", "6",
              "--eval_interval", "3", "--eval_samples", "20", "--eval_samples_during", "10", "--device", "cuda",
              "--dtype", "float32"]
    assert run_main(common + ["--out_dir", str(a), "--ckpt_schedule", "eval"]) == 0
    os.makedirs(b)
    os.replace(a / "ckpt_0000003.pt", b / "ckpt.pt")
    assert run_main(["--task", "bijection", "--model", "lstm", "--resume", "--out_dir", str(b)]) == 0
    sa, sb = (torch.load(d / "ckpt.pt", weights_only=True) for d in (a, b))
    for k in sa["model"]:  # other masks would move them by ~lr = 1e-2; cuDNN's RNN may differ in the last bits
        assert torch.allclose(sa["model"][k], sb["model"][k], rtol=0, atol=1e-5), k


def test_a_resumed_optimizer_keeps_its_own_kernel():
    # a checkpoint of a CPU run (the plain loop) resumed where build() makes the fused AdamW, as on CUDA
    torch.manual_seed(0)
    model = torch.nn.Linear(4, 3)
    before = torch.optim.AdamW(model.parameters(), lr=0.1)
    model(torch.randn(2, 4)).sum().backward()
    before.step()
    fused = torch.optim.AdamW(model.parameters(), lr=0.1, fused=True)
    optim.Optimizers(fused).load_state_dict(before.state_dict())
    assert fused.param_groups[0]["fused"] is True
    assert torch.equal(fused.state[model.weight]["exp_avg"], before.state[model.weight]["exp_avg"])
    fused.step()  # the fused kernel accepts the state it was given
    assert float(fused.state[model.weight]["step"]) == 2


def test_bench_memory_times_the_rules_without_the_value_checks(monkeypatch):
    seen = []

    def memory(*a, **kw):
        seen.append(kw.get("check_values", True))
        return real(*a, **kw)

    real = bench.memory
    monkeypatch.setattr(bench, "memory", memory)
    args = bench.argparse.Namespace(threads=1, device="cpu", dtype="float32", seed=0, B=1, H=1, d_k=4, d_v=4,
                                    decay=1.0, warmup=0, reps=1)
    bench.measure_memory("oja", "chunked", None, 8, args)
    assert seen and not any(seen)  # the model calls memory with check_values=False


def test_bench_scan_warms_up_the_backward_before_measuring(monkeypatch):
    events, real_scan, real_time = [], bench.selective_scan, bench.time_and_peak

    def scan(*a, **kw):
        y = real_scan(*a, **kw)
        if y.requires_grad:
            y.register_hook(lambda g: events.append("backward"))
        return y

    def time_and_peak(*a, **kw):
        events.append("measure")
        return real_time(*a, **kw)

    monkeypatch.setattr(bench, "selective_scan", scan)
    monkeypatch.setattr(bench, "time_and_peak", time_and_peak)
    args = bench.argparse.Namespace(threads=1, device="cpu", seed=0, B=1, D=4, N=2, warmup=0, reps=1)
    bench.measure_scan("chunked", 16, args)
    assert events.index("backward") < events.index("measure")  # cuBLAS's workspace is made before the baseline


def test_bench_synchronises_mps_and_reads_the_resident_set_by_platform(monkeypatch):
    calls = []
    monkeypatch.setattr(torch.mps, "synchronize", lambda: calls.append("mps"))
    hardware.syncer(torch.device("mps"))()
    assert calls == ["mps"]
    monkeypatch.setattr(hardware.resource, "getrusage", lambda who: bench.argparse.Namespace(ru_maxrss=3000))
    monkeypatch.setattr(hardware.sys, "platform", "darwin")  # bytes
    assert hardware.max_rss() == 3000
    monkeypatch.setattr(hardware.sys, "platform", "linux")  # kilobytes
    assert hardware.max_rss() == 3000 * 1024


def test_reproduce_keeps_an_inherited_cuda_visible_devices(tmp_path, monkeypatch):
    envs = []

    class Done:
        returncode = 0

        def __init__(self, cmd, env, **kw):
            envs.append(env["CUDA_VISIBLE_DEVICES"])

        def poll(self):
            return 0

    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "5, GPU-7f3a")
    monkeypatch.setattr(reproduce.subprocess, "Popen", Done)
    todo = [((f"t{i}", "m"), [], str(tmp_path / f"log{i}")) for i in range(2)]
    assert [rc for _, rc, _ in reproduce.run_cells(todo, 2, 2)] == [0, 0]
    assert sorted(envs) == ["5", "GPU-7f3a"]


RANK_FAILS = """
import sys, torch, evaluation, runtime, train
rank, where = int(sys.argv[1]), sys.argv[2]
if rank == 0 and where == "evaluation":  # out of memory in rank 0's first evaluation (the others wait for its word)
    real = train.build
    def build(cfg, device, saved=None):  # the model's forward without gradients (an evaluation's) runs out
        built = real(cfg, device, saved)
        forward = built[2].forward
        oom = torch.OutOfMemoryError("CUDA out of memory. Tried to allocate 2.00 GiB")
        built[2].forward = lambda x: forward(x) if torch.is_grad_enabled() else (_ for _ in ()).throw(oom)
        return built
    train.build = build
if rank == 0 and where == "results":  # a full disk when rank 0 writes results.json (the others wait to finish)
    def write_json(path, obj):
        raise OSError(28, "No space left on device", path)
    evaluation.write_json = write_json
sys.exit(train.main(sys.argv[3:]))
"""


@pytest.mark.skipif(not os.environ.get("WINDTUNNEL_GLOO"), reason="opt-in (WINDTUNNEL_GLOO=1): two processes "
                    "meeting in a gloo group on 127.0.0.1, which some sandboxes do not allow")
@pytest.mark.parametrize("where", ["evaluation", "results"])
def test_a_rank_0_failure_under_torchrun_ends_every_rank_within_seconds(tmp_path, where):
    import socket
    import subprocess
    import sys
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    argv = ["--task", "bijection", "--V", "6", "--model", "mlp", "--d_model", "16", "--device", "cpu",
            "--eval_batch_size", "4", "--out_dir", str(tmp_path)] + TINY
    root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    procs = [subprocess.Popen([sys.executable, "-c", RANK_FAILS, str(r), where] + argv, cwd=root, text=True,
                              stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                              env=dict(os.environ, RANK=str(r), LOCAL_RANK=str(r), WORLD_SIZE="2", LOCAL_WORLD_SIZE="2",
                                       MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port), OMP_NUM_THREADS="1"))
             for r in range(2)]
    try:
        outs = [p.communicate(timeout=120) for p in procs]  # without rank 0's word, rank 1 waits 30 minutes (gloo)
    finally:
        for p in procs:
            if p.poll() is None:
                p.kill()
    assert [p.returncode for p in procs] == [2, 2], outs
    errs = [e for _, e in outs]
    assert errs[1].strip() == "", errs  # rank 0 speaks for the run, in one line
    line = errs[0].strip()
    assert len(line.splitlines()) == 1, line
    assert ("out of memory at evaluation (try a smaller --eval_batch_size; it was 4) at step 3" in line
            if where == "evaluation" else "No space left on device" in line), line
    assert f"kept {tmp_path / 'ckpt.pt'} (step 3)" in line
