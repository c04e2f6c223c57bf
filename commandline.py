"""
What every script's command line shares, importing nothing but the standard library, so that a script takes it
before torch loads:

- before_torch(prog): Ctrl-C or SIGTERM while torch loads (seconds) is one line and exit code 2, as cli() says it
  later;
- Parser: argparse with one-line errors (exit code 2) and a did-you-mean hint, negative numbers as values;
- load_class: a class named on the command line, `PATH.py:Class` or `module:Class` (a model, a task), its file's own
  failures on import said in one line with their file and line;
- cli(main, prog, kept): main() from the shell, its Ctrl-C, out of memory or full disk one line saying what was kept;
- run_in_process(main, argv, log): a script's main(argv) in this process, its output to a log (reproduce.py's
  cells, conditioning.py's runs), and log_error: the line of that log saying why it stopped.
"""
import argparse
from contextlib import redirect_stderr, redirect_stdout
import difflib
import errno
import functools
import importlib
import importlib.util
import os
import re
import signal
import sys
import traceback


def before_torch(prog):
    """A signal before cli() takes over (while torch loads): one line, exit code 2, nothing written yet."""
    stop = lambda *_: os._exit(sys.stderr.write(f"{prog}: error: interrupted; nothing was written\n") and 2)
    for s in (signal.SIGINT, signal.SIGTERM):
        signal.signal(s, stop)


class Parser(argparse.ArgumentParser):
    """One-line errors (exit code 2) with a did-you-mean hint, instead of the usage block."""
    elsewhere = {}  # flag -> the tasks/models that have it, for a flag of another task or model

    def error(self, message):
        m = re.search(r"unrecognized arguments: (\S+)", message)
        if m:
            flag = m.group(1).split("=")[0]
            known = [o for a in self._actions for o in a.option_strings]
            close = difflib.get_close_matches(flag, known, n=3)
            message += (f" ({flag} is an option of {self.elsewhere[flag]} only)" if flag in self.elsewhere else
                        f" (did you mean {' / '.join(close)}?)" if close else " (see --help for the valid flags)")
        self.exit(2, f"{self.prog}: error: {message}\n")

    def parse_known_args(self, args=None, namespace=None):
        return super().parse_known_args(join_negative(sys.argv[1:] if args is None else args), namespace)


def join_negative(argv):
    """'--lr -1e-3' -> '--lr=-1e-3': argparse reads a negative number in exponent form as a flag."""
    out = []
    for a in argv:
        if out and re.fullmatch(r"--\w+", out[-1]) and re.fullmatch(r"-(\d+\.?\d*|\.\d+)(e[-+]?\d+)?|-inf", a, re.I):
            out[-1] += "=" + a
        else:
            out.append(a)
    return out


def str2bool(s):
    if isinstance(s, bool) or s.lower() in ("1", "true", "yes"):
        return True if isinstance(s, str) else s
    if s.lower() in ("0", "false", "no"):
        return False
    raise argparse.ArgumentTypeError(f"expected true or false, got {s!r}")


def seed_arg(s):
    """argparse type of a seed flag: an integer in torch's 0..2**63-1."""
    if not (s.isdigit() and int(s) < 2**63):
        raise argparse.ArgumentTypeError(f"{s!r}: a seed must be an integer in 0..2**63-1")
    return int(s)


def check_sizes(p, threads=None, seeds=(), seed_flag="--seed", **sizes):
    """A script's common flags, refused with p.error naming the flag: --threads above 4 per core (torch
    crashes far above), a seed outside torch's 0..2**63-1, a size flag (name=value or list) below 1."""
    top = (os.cpu_count() or 1) * 4
    if threads is not None and threads > top:
        p.error(f"--threads {threads}: at most {top} here (4 per core)")
    bad = [s for s in seeds if not 0 <= s < 2**63]
    if bad:
        p.error(f"{seed_flag} {bad[0]}: a seed must be in 0..2**63-1")
    for flag, v in sizes.items():
        if min(v if isinstance(v, list) else [v]) < 1:
            p.error(f"--{flag} must be >= 1, got {' '.join(map(str, v if isinstance(v, list) else [v]))}")

# -----------------------------------------------------------------------------
# a class from a file or a module: --model PATH.py:Class, --task PATH.py:Class


def is_spec(s):
    """Whether s names a class in a file or a module (PATH.py:Class, module:Class), not a built-in's name."""
    where, _, name = s.rpartition(":")
    return bool(where) and name.isidentifier()


def load_class(spec, what):
    """The class `spec` names (PATH.py:Class or module:Class), or a ValueError saying in one line why not; what:
    "model" or "task", for the message."""
    where, _, name = spec.rpartition(":")
    if not (where and name.isidentifier()):
        raise ValueError(f"{spec}: not a {what}; give PATH.py:Class or module:Class")
    try:
        module = load_module(os.path.abspath(where) if where.endswith(".py") else where)
    except (FileNotFoundError, ModuleNotFoundError) as e:  # the file or module, or a module that the file imports
        which = f"file {e.filename}" if isinstance(e, OSError) else f"module named {e.name}"
        how = (f" (put its folder on PYTHONPATH, or give its file: {where.replace('.', '/')}.py:{name})"
               if isinstance(e, ModuleNotFoundError) and (where + ".").startswith(e.name + ".") else "")
        raise ValueError(f"{spec}: no {which}{how}") from None
    except (Exception, SystemExit) as e:  # the file's own code fails on import (a syntax error too): its error, line
        raise ValueError(f"{spec}: importing it raised {raised(e)}") from None
    cls = getattr(module, name, None)
    if not isinstance(cls, type):
        raise ValueError(f"{spec}: {where} has no class {name}")
    return cls


@functools.cache  # a file (where: its absolute path) is loaded once: every caller gets the same classes
def load_module(where):
    if not where.endswith(".py"):
        return importlib.import_module(where)
    name = "user_file_" + re.sub(r"\W", "_", where)  # a name of its own: a file called tasks.py shadows nothing
    module = sys.modules[name] = importlib.util.module_from_spec(importlib.util.spec_from_file_location(name, where))
    try:
        module.__spec__.loader.exec_module(module)  # registered first: dataclasses and inspect look for it there
    except BaseException:
        del sys.modules[name]
        raise
    return module


def in_file(e, path):
    """Whether an exception passed through the code of the file at path (a user's model or task)."""
    return any(os.path.abspath(f.filename) == os.path.abspath(path) for f in traceback.extract_tb(e.__traceback__))


def raised(e, inside=None):
    """`Type: message at FILE:LINE` of an exception from a user's code: the deepest frame in `inside` (a file)
    where given, else the deepest (a syntax error: its own file and line)."""
    if isinstance(e, SyntaxError):
        at = (e.filename, e.lineno)
    else:
        frames = traceback.extract_tb(e.__traceback__)
        mine = [f for f in frames if inside and os.path.abspath(f.filename) == os.path.abspath(inside)]
        at = (mine or frames or [("?", "?")])[-1][:2]
    return f"{type(e).__name__}: {(str(e) or '?').splitlines()[0]} at {at[0]}:{at[1]}"

# -----------------------------------------------------------------------------
# a script from the shell: its faults in one line


def is_oom(e):
    """Out of memory: Python's, or torch's (CUDA's OutOfMemoryError, the CPU allocator's RuntimeError)."""
    return isinstance(e, MemoryError) or any(c.__name__ == "OutOfMemoryError" for c in type(e).__mro__) or \
        isinstance(e, RuntimeError) and re.search(r"out of memory|can't allocate memory", str(e)) is not None


def stdout_fault(e):
    """A print's "No space left on device" names no file: stdout's, when stdout refuses even an empty write
    (`> /dev/full`) or its disk is full, is said so, naming where stdout goes. Else None."""
    if not isinstance(e, OSError) or e.filename or e.errno != errno.ENOSPC:
        return None
    try:
        os.write(1, b"")
        full = os.fstatvfs(1).f_bavail == 0
    except OSError as err:
        full = err.errno == errno.ENOSPC
    where = os.path.realpath("/proc/self/fd/1") if os.path.exists("/proc/self/fd/1") else "its file"
    return f"stdout ({where}) is full: {e.strerror}" if full else None


def fault(e):
    """What happened, for the one-line report of a fault: Ctrl-C, out of memory (with the hint of where, set by
    runtime.oom_hint, else the training's), or an OSError such as a full disk (naming its file)."""
    if isinstance(e, KeyboardInterrupt):
        return "interrupted"
    if is_oom(e):
        return "out of memory " + getattr(e, "hint", "(try a smaller --batch_size or model)")
    return stdout_fault(e) or (f"{e.filename}: {e.strerror}" if e.filename else str(e))


def interrupt(signum, frame):
    """Ctrl-C or SIGTERM: KeyboardInterrupt, once; a second one, while the run saves and says so, is ignored."""
    for s in (signal.SIGINT, signal.SIGTERM):
        signal.signal(s, signal.SIG_IGN)
    raise KeyboardInterrupt


def cli(main, prog, kept):
    """A script's main() from the shell: Ctrl-C, or SIGTERM (kill, a scheduler's stop), ends it with one line
    (what was kept) and exit code 2; a full or read-only disk, or no memory, with one line and exit code 1."""
    before = {s: signal.signal(s, interrupt) for s in (signal.SIGINT, signal.SIGTERM)}  # the script's, for imports
    for stream in (sys.stdout, sys.stderr):  # a C or Latin-1 locale: "−" and "—" as \u2212, not a traceback
        getattr(stream, "reconfigure", lambda **kw: None)(errors="backslashreplace")
    threads = os.environ.get("OMP_NUM_THREADS")
    try:
        if threads is not None and not re.fullmatch(r"[1-9]\d*(,[1-9]\d*)*", threads.strip()):  # else libgomp
            print(f"{prog}: error: environment variable OMP_NUM_THREADS={threads!r} must be a number of threads "
                  f">= 1 (unset it to use every core)", file=sys.stderr)  # warns, and the run goes on with a default
            sys.exit(2)
        sys.exit(main())
    except KeyboardInterrupt as e:
        if getattr(e, "reported_to", None) is not sys.stderr:
            print(f"{prog}: error: interrupted; {kept}", file=sys.stderr)
        sys.exit(2)
    except BrokenPipeError:  # its reader went away (`--dry_run | head`): it had read what it wanted; nothing to say
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())  # the exit's flush would raise it again
        sys.exit(1)
    except (OSError, MemoryError, RuntimeError) as e:  # a full or read-only disk, no memory: one line
        if not (isinstance(e, OSError) or is_oom(e)):
            raise
        if is_oom(e) and not hasattr(e, "hint"):  # outside a training run: the script's sizes, not a batch
            e.hint = "(try smaller sizes)"
        print(f"{prog}: error: {fault(e).splitlines()[0]}; {kept}", file=sys.stderr)
        sys.exit(1)
    finally:  # the work is over: a late signal is ignored, not a traceback from the exit's clean-up (called
        for s, handler in before.items():  # from Python, as a test does, the caller's handlers come back)
            signal.signal(s, handler if handler in (signal.default_int_handler, signal.SIG_DFL) else signal.SIG_IGN)


def run_in_process(main, argv, log, mode="a", contain=True):
    """main(argv), a script's (train.main), in this process with its output to the file log (mode "a" adds to it,
    "w" starts it afresh); returns its exit code. contain: a crash is its traceback in the log and exit code 1, and
    an argument error's SystemExit its code, so that a sweep goes on (reproduce.py); else both reach the caller."""
    with open(log, mode, buffering=1, encoding="utf-8") as f, redirect_stdout(f), redirect_stderr(f):
        if not contain:
            return main(argv)
        try:
            return main(argv)
        except SystemExit as e:
            return e.code
        except Exception:  # a crashed cell must not stop the sweep
            traceback.print_exc()
            return 1


def log_error(log):
    """The line of a run's log that says why it stopped: its last "error:" line, else its last line."""
    try:
        with open(log, encoding="utf-8", errors="replace") as f:
            lines = [line.strip() for line in f if line.strip()]
    except OSError:
        return f"{log} cannot be read"
    return next((line for line in reversed(lines) if ": error: " in line), lines[-1] if lines else "its log is empty")
