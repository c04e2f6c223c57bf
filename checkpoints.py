"""
A run's files: what a checkpoint holds and how a run resumes from it, files written whole, and the rules and
the lock of a run's folder. Every script that writes goes through here, and it imports no file of the project: the
plumbing knows nothing of tasks, models or settings. The devices, data-parallel and fault plumbing of a training
process is runtime.py's (nanochat keeps checkpoint_manager.py apart from common.py so).

- checkpoints hold tensors and plain values only, so they load with weights_only=True (checkpoint, resume);
  a run keeps the last good one, and copies by its schedule (Checkpoints);
  read_checkpoint refuses a file that is not one in a line (settings.load_checkpoint checks the run it names);
- every file is written beside its name and renamed over it (write_file): a crash mid-write leaves the old
  file whole, and a failed write (a full disk, a file size limit) is Python's OSError naming the file;
- a new run refuses a folder that holds another (run_files); a run locks its folder for its lifetime
  (lock_out_dir), and --overwrite sets the old run aside until the new one has saved (set_aside, settle_aside);
- print0: only rank 0 speaks for a run; it is here, below runtime.py, since a lock taken over says so in a line;
- what a run records of itself (code_version), and which of two runs' settings differ (setting_differs).
"""
import builtins
from contextlib import suppress
from dataclasses import MISSING, fields
import glob
import io
import json
import math
import os
import re
import shlex
import shutil
import subprocess
import tempfile
import time

import torch
import torch.distributed as dist

RUN_FILES = ("ckpt.pt", "results.json", "eval.json", "config.json")  # and ckpt_<step>.pt, and the diagnostics':
RUN_GLOBS = ("ckpt_*.pt", "geometry_*.json", "geometry_*.png")  # what --overwrite sets aside with the run
UMASK = os.umask(0o022)  # read by setting it: put back at once
os.umask(UMASK)


def snapshot_steps(schedule, n):
    """The steps up to n whose checkpoint --ckpt_schedule copies to ckpt_<step>.pt: `log`, four a decade (1, 2, 3, 6,
    10, 18, 32, 56, 100, ..); `dense`, the authors' (jlens train_dense_checkpoints.py): every 100 steps to 1,000,
    every 500 to 5,000, every 1,000 to 10,000, then every 5,000; none for `last` and `eval`."""
    if schedule == "log":
        return {round(10 ** (i / 4)) for i in range(int(4 * math.log10(max(n, 1))) + 1)}
    return {s for s in [*range(100, 1000, 100), *range(1000, 5000, 500), *range(5000, 10000, 1000),  # dense only:
                        *range(10000, n + 1, 5000)] if s <= n} if schedule == "dense" else set()  # n may be 10**20


def print0(*args, **kwargs):
    """print on rank 0 only: it speaks for the run (every process alone is rank 0)."""
    if not (dist.is_available() and dist.is_initialized()) or dist.get_rank() == 0:
        builtins.print(*args, **kwargs)

# -----------------------------------------------------------------------------
# checkpoints: what ckpt.pt holds, a run resumed from it, and the checkpoints a run keeps


def save_checkpoint(path, state):
    """torch.save into memory, then written as bytes: on a full disk torch's own file writer says only
    "unexpected pos N vs M", Python's write says "No space left on device" (or "File too large")."""
    buf = io.BytesIO()
    torch.save(state, buf)
    write_file(path, lambda tmp: write_bytes(tmp, buf.getbuffer()))


def write_bytes(path, data):
    with open(path, "wb") as f:
        f.write(data)


def checkpoint(cfg, model_config, model, opt, batches, device, it, elapsed, history):
    """What ckpt.pt holds (tensors and plain values, so it loads with weights_only=True): all resume() needs."""
    return dict(model=model.state_dict(), optimizer=opt.state_dict(), gen_state=batches.state(it),
                **rng_state(device), iter=it, elapsed=elapsed, history=history, config=cfg, model_config=model_config)


def read_checkpoint(path, missing=""):
    """A checkpoint's dict, or a ValueError naming the file in one line: missing, not a regular file, or not a
    readable train.py checkpoint. missing: what to say where there is none."""
    if not os.path.isfile(path):  # a FIFO or a device: torch.load would wait for ever, or read without end
        raise ValueError(f"{path} is not a regular file" if os.path.exists(path) else f"no checkpoint at {path} "
                         f"{missing}")
    # one message for every failure: torch's own would suggest weights_only=False, which runs the file's code
    try:
        state = torch.load(path, map_location="cpu", weights_only=True)
        if not (isinstance(state, dict) and {"config", "model", "model_config", "iter"} <= set(state)):
            raise ValueError
    except Exception:
        raise ValueError(f"{path}: not a readable train.py checkpoint (truncated or corrupt?)") from None
    return state


def fits(state, Config, io_fields):
    """{part of a checkpoint: whether it is of the kind train.py writes} for the parts that a run resumes from
    (those absent pass: geometry.py reads checkpoints without them) and the model's settings, each of its
    config's type (an int where the default is an int, a float or an int where it is a float), but its I/O fields:
    the task fills them in, and may leave one None (hmm's answer_offset), so load_checkpoint compares them with it."""
    rng = lambda v: isinstance(v, torch.Tensor) and v.dtype == torch.uint8
    kind = lambda d: (int, float) if isinstance(d, float) else type(d)
    mc = state["model_config"]
    return dict(train=isinstance(state["config"]["train"], dict), weights=isinstance(state["model"], dict),
                step=type(state["iter"]) is int and state["iter"] >= 0,
                elapsed=isinstance(state.get("elapsed", 0.0), (int, float)),
                history=isinstance(state.get("history", []), list),
                **{k: rng(state[k]) for k in ("torch_rng", "cuda_rng", "gen_state") if k in state},
                **{f"model's {f.name}": isinstance(mc[f.name], kind(f.default)) for f in fields(Config)
                   if f.name in mc and f.default not in (None, MISSING) and f.name not in io_fields})


def code_version():  # the git commit a run records in results.json, "-dirty" with edits
    here = os.path.dirname(os.path.abspath(__file__))
    try:
        git = lambda *a: subprocess.run(["git", *a], cwd=here, capture_output=True, text=True, timeout=5).stdout.strip()
        rev = git("rev-parse", "--short", "HEAD")
        return (rev + ("-dirty" if git("status", "--porcelain", "--untracked-files=no") else "")) if rev else "unknown"
    except (OSError, subprocess.SubprocessError):
        return "unknown"


def rng_state(device):
    """The global generators a resumed run continues: dropout draws from the device's (the batches have their own)."""
    return dict(torch_rng=torch.get_rng_state()) | (
        dict(cuda_rng=torch.cuda.get_rng_state(device)) if device.type == "cuda" else {})


def set_rng_state(state, device):
    torch.set_rng_state(state["torch_rng"])
    if device.type == "cuda" and "cuda_rng" in state:  # absent when the run was on a CPU before
        torch.cuda.set_rng_state(state["cuda_rng"], device)


def load_weights(model, state, path):
    """The checkpoint's weights into model, built from its model_config; weights that do not fit it (a model file
    changed since the run, an edited checkpoint) are one line naming the first mismatch, not torch's list."""
    try:
        model.load_state_dict(state["model"])
    except RuntimeError as e:
        first = next((line.strip() for line in str(e).splitlines()[1:] if line.strip()), str(e))
        first = first if len(first) <= 100 else first[:97] + "..."
        raise ValueError(f"{path}: its weights do not fit its model_config ({first})") from None


def resume(state, model, opt, batches, device, train):
    """(step, elapsed time, history) of a new run, or of a checkpoint, with its model, optimizer and RNGs."""
    if state is None:
        return 0, 0.0, []
    load_weights(model, state, os.path.join(train["out_dir"], "ckpt.pt"))
    opt.load_state_dict(state["optimizer"])
    set_rng_state(state, device)
    try:
        batches.gen.set_state(state["gen_state"])
    except (RuntimeError, ValueError):  # a generator state from another kind of device (a GPU run resumed on a CPU)
        print0("the checkpoint's batch generator was on another device: reseeding, the batches will differ "
               "from an uninterrupted run's")
        batches.gen.manual_seed(train["seed"] + state["iter"])
    return state["iter"], state["elapsed"], state["history"]


class Checkpoints:
    """The checkpoints a run keeps in its folder (rank 0 writes them): ckpt.pt at every evaluation (`kept`, the last
    good one, which a fault report names), copies ckpt_<step>.pt by --ckpt_schedule (eval: at every evaluation, log:
    at log-spaced steps), config.json beside the first; the old run an --overwrite set aside (`aside`) is deleted once
    the new one has saved, or put back where it ends before (settle)."""

    def __init__(self, train, resumed_at=None):
        self.out_dir, self.every_eval = train["out_dir"], train["ckpt_schedule"] == "eval"
        self.snapshots = snapshot_steps(train["ckpt_schedule"], train["max_iters"])
        self.ckpt = os.path.join(self.out_dir, "ckpt.pt")
        self.kept = None if resumed_at is None else f"{self.ckpt} (step {resumed_at})"
        self.aside = False
        self.record = None  # the resolved run, written to config.json beside the first ckpt.pt

    def due(self, it, at_eval):
        """Whether step `it` saves: at every evaluation and at the snapshots."""
        return at_eval or it in self.snapshots

    def save_first(self, state):
        """ckpt.pt (state(): its contents) before the run's first evaluation, so that a failure there keeps it."""
        if self.kept is None:
            self.save(state(), at_eval=True)

    def save(self, state, at_eval):
        it = state["iter"]
        if at_eval:
            save_checkpoint(self.ckpt, state)
            if self.record is not None:  # the run's settings, resolved (settings.Run.description), once
                write_json(os.path.join(self.out_dir, "config.json"), self.record)
                self.record = None
            self.kept = f"{self.ckpt} (step {it})"  # finite parameters and metrics: a good one
            self.settle(keep_new=True)  # the run it replaces can go now
        if self.every_eval and at_eval or it in self.snapshots:
            save_checkpoint(os.path.join(self.out_dir, f"ckpt_{it:07d}.pt"), state)

    def settle(self, keep_new):
        """Delete the old run set aside by --overwrite (keep_new), or put it back; True if it was put back."""
        aside, self.aside = self.aside, False
        return aside and settle_aside(self.out_dir, keep_new)


def ckpt_path(path):
    return os.path.join(path, "ckpt.pt") if os.path.isdir(path) else path

# -----------------------------------------------------------------------------
# files: every write goes through a temporary name, so a crash mid-write leaves the old file whole


def write_file(path, write):
    """write(tmp) beside path, then rename it over path; a failure removes tmp and names path. Each writer has a
    temporary name of its own (path.<random>.tmp), so two processes writing one file leave one of them whole."""
    tmp = None
    try:
        folder, name = os.path.split(path)
        os.makedirs(folder or ".", exist_ok=True)
        remove_stale_tmp(folder or ".")
        fd, tmp = tempfile.mkstemp(dir=folder or ".", prefix=name + ".", suffix=".tmp")
        os.close(fd)
        os.chmod(tmp, 0o666 & ~UMASK)  # mkstemp's 0600, widened to what open() would have given
        write(tmp)
        os.replace(tmp, path)
    except BaseException as e:
        if tmp is not None:
            with suppress(OSError):
                os.remove(tmp)
        if isinstance(e, OSError) and e.filename in (None, "", tmp):  # the one-line report names the file
            raise OSError(e.errno, e.strerror, path) from None
        raise


TMP = re.compile(r".+\.[a-z0-9_]{8}\.tmp")  # write_file's temporary names: mkstemp's 8 random characters
STALE_S = 60  # a temporary file untouched this long is a killed writer's: a live one writes it within a second


def remove_stale_tmp(folder):
    """The temporary files a killed writer left in folder (a geometry.py killed mid-figure), removed by the next
    writer there: only write_file's names, and only those untouched for STALE_S seconds, so never a live writer's."""
    with suppress(OSError):
        for f in os.listdir(folder):
            p = os.path.join(folder, f)
            if TMP.fullmatch(f) and time.time() - _mtime(p) > STALE_S and os.path.isfile(p):
                with suppress(OSError):
                    os.remove(p)


def write_text(path, text):
    def write(tmp):
        with open(tmp, "w", encoding="utf-8") as f:  # whatever the locale: the tables' "−" and "—"
            f.write(text)
    write_file(path, write)


def write_json(path, obj):
    write_text(path, json.dumps(obj, indent=1))


def to_json(x):  # NaN (e.g. the silhouette of a single cluster) -> null
    if isinstance(x, dict):
        return {k: to_json(v) for k, v in x.items()}
    return [to_json(v) for v in x] if isinstance(x, list) else None if x != x else x


def read_json(path):  # a JSON object: a corrupt file, or other JSON, is a ValueError naming it
    try:
        with open(path, encoding="utf-8") as f:
            d = json.load(f)
        if not isinstance(d, dict):
            raise ValueError(f"a {type(d).__name__}, not an object")
    except ValueError as e:  # UnicodeDecodeError too
        raise ValueError(f"{path} is not the JSON these scripts write ({e})") from None
    return d

# -----------------------------------------------------------------------------
# a run's folder: whether it may be written, the run it holds, and the lock of the run writing it


def check_out_dir(path, flag="--out_dir"):
    """Before any work: say in one line why files cannot be written under path (creates nothing)."""
    p = os.path.abspath(path)
    while not os.path.exists(p):  # the folder that would hold the new ones
        if os.path.islink(p):  # a link to nowhere: os.makedirs would say only "File exists"
            to = os.path.join(os.path.dirname(p), os.readlink(p))  # a link there too: a loop
            raise ValueError(f"{flag} {path}: cannot write there ({p} is a symbolic link to {os.readlink(p)}, "
                             f"{'a loop of links' if os.path.lexists(to) else 'which does not exist'})")
        p = os.path.dirname(p)
    if not os.path.isdir(p) or not os.access(p, os.W_OK | os.X_OK):
        what = "a file" if os.path.isfile(p) else "not writable"
        raise ValueError(f"{flag} {path}: cannot write there ({p} is {what})")


def check_out_file(path, flag):
    """check_out_dir for a file of its own (bench.py's --json): its folder writable, and path not a folder."""
    check_out_dir(os.path.dirname(path) or ".", flag)
    if os.path.isdir(path):
        raise ValueError(f"{flag} {path}: is a folder; give a file name")


# a run's settings that do not change the weights it ends with: where and how it ran, how often it reported;
# and those of its evaluation, which change its metrics only
HOW_IT_RAN = {"out_dir", "device", "dtype", "compile", "data_device", "data_chunk", "log_interval", "ckpt_schedule",
              "resume", "overwrite", "eval_only"}
EVALUATION = {"eval_interval", "eval_samples", "eval_samples_during", "eval_batch_size", "eval_seed",
              "eval_seed_during", "eval_K", "stop_at", "patience"}


def setting_differs(was, now, ignore=HOW_IT_RAN):
    """The first setting but those in `ignore` in which two runs' configs (results.json's `config`) differ, as
    (name, was, now): the task, the model, or a flag; None if none. Compared where both record it (a run from
    before a setting existed lacks it)."""
    part = lambda d, key: d.get(key) if isinstance(d.get(key), dict) else {}
    pairs = [(k, was.get(k), now.get(k)) for k in ("task", "model") if k in was and k in now]
    pairs += [(f"--{k}", part(was, p)[k], v) for p in ("task_opts", "model_opts", "train")
              for k, v in part(now, p).items() if k in part(was, p) and k not in ignore]
    return next(((k, a, b) for k, a, b in pairs if a != b), None)


def run_files(out_dir):
    """What a run writes to its folder, and what geometry.py wrote of its model: another run there would mix with it."""
    names = [os.path.join(out_dir, f) for f in RUN_FILES]
    return [p for p in names if os.path.exists(p)] + sorted(p for g in RUN_GLOBS
                                                            for p in glob.glob(os.path.join(glob.escape(out_dir), g)))


def run_tmp_files(out_dir):
    """The temporary files a killed write of a run leaves (not another script's, e.g. geometry.py's)."""
    return [p for f in RUN_FILES + ("ckpt_*.pt",) for p in glob.glob(os.path.join(glob.escape(out_dir), f + "*.tmp"))]


def pid_alive(pid):
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:  # another user's process
        return True
    return True


def _mtime(path):
    try:
        return os.path.getmtime(path)
    except OSError:
        return time.time()


def lock_out_dir(out_dir):
    """Take <out_dir>/.lock, holding this process's pid, for the run's lifetime: a second run into the folder is
    refused at once, naming the owner; a lock whose pid is gone (kill -9) is taken over, and so is one that this
    process or its parent holds (reproduce.py locks a cell before writing its log, then starts train.py). -> its
    path."""
    path = os.path.join(out_dir, ".lock")
    for attempt in range(2):
        try:
            fd = os.open(path, os.O_CREAT | os.O_EXCL | os.O_WRONLY, 0o644)
        except FileExistsError:
            try:
                with open(path) as f:
                    owner = int(f.read().strip() or 0)
            except (OSError, ValueError):
                owner = 0
            if owner in (os.getpid(), os.getppid()):  # handed over: now this process's, should the parent die
                write_text(path, f"{os.getpid()}\n")
                return path
            stale = not owner and time.time() - _mtime(path) > 5  # empty for seconds: its owner died writing it
            if (not owner and not stale) or (owner and pid_alive(owner)) or attempt:  # empty: pid being written
                raise ValueError(f"{out_dir} is in use by another run (pid {owner or 'unknown'}, lock {path}): "
                                 f"wait for it to end, or use another --out_dir") from None
            print0(f"{path}: taking over the lock of pid {owner}, which is no longer running" if owner else
                   f"{path}: taking over an empty lock left by a run that died before writing its pid")
            with suppress(FileNotFoundError):
                os.remove(path)
            continue
        try:
            with os.fdopen(fd, "w") as f:
                f.write(f"{os.getpid()}\n")
        except OSError as e:  # a full disk: no empty lock left behind to block the folder
            with suppress(OSError):
                os.remove(path)
            raise OSError(e.errno, e.strerror, path) from None
        return path


def unlock_out_dir(path):
    """Remove the lock if it is still this process's."""
    with suppress(OSError, ValueError):
        with open(path) as f:
            if int(f.read().strip()) == os.getpid():
                os.remove(path)


def set_aside(out_dir):
    """--overwrite: the old run's files go to <out_dir>/.replaced, kept until the new run has saved ckpt.pt."""
    aside = os.path.join(out_dir, ".replaced")
    os.makedirs(aside, exist_ok=True)
    for f in run_files(out_dir):
        os.replace(f, os.path.join(aside, os.path.basename(f)))


def set_aside_note(out_dir):
    """Where a folder's ckpt.pt is missing because an --overwrite run was killed (kill -9, power) before its first
    checkpoint: where the old run is, and the command that puts it back (as the next train.py run there would)."""
    aside = os.path.join(out_dir or ".", ".replaced")
    if not os.path.exists(os.path.join(aside, "ckpt.pt")):
        return ""
    return (f"(an --overwrite run killed before its first checkpoint left the run it replaced in {aside}: restore "
            f"it with `mv {shlex.quote(aside)}/* {shlex.quote(out_dir or '.')}/ && rmdir {shlex.quote(aside)}`)")


def settle_aside(out_dir, keep_new):
    """Delete the old run set aside (keep_new: the new run saved a checkpoint or finished), or put it back in
    place of the new run's files (it ended before its first checkpoint). Nothing set aside: nothing to do."""
    aside = os.path.join(out_dir, ".replaced")
    if not os.path.isdir(aside):
        return False
    if not keep_new:
        for f in run_files(out_dir):
            os.remove(f)
        for f in os.listdir(aside):
            os.replace(os.path.join(aside, f), os.path.join(out_dir, f))
    shutil.rmtree(aside)
    return not keep_new

