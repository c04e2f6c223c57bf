"""Hostile input, and what the scripts do with it (issue 44): every bad value, file, environment or signal ends
in one line naming what to change, exit code 2 (usage) or 1 (a fault), with no traceback and the files written
before kept whole. A defect whose fix lies in a file being split elsewhere is an xfail(strict=True) here, with the
fix in its reason, until the split lands."""
import math
import os
import warnings

import pytest
import torch

import mamba
from mamba import Mamba, MambaConfig


def cpp_compiler():
    """The C++ compiler inductor would use on a CPU, or None (then torch.compile's default backend cannot run)."""
    try:
        from torch._inductor.cpp_builder import get_cpp_compiler
        return get_cpp_compiler()
    except Exception:
        return None


# -----------------------------------------------------------------------------
# torch.compile (inductor) takes new lengths without a graph per length


@pytest.mark.skipif(cpp_compiler() is None, reason="inductor needs a C++ compiler on the CPU")
def test_compiled_mamba_takes_five_lengths_under_inductor(monkeypatch):
    # `bench.py gpu --device cpu --dry_run`'s cell `compile mamba, 5 lengths` with the backend users get: the
    # model under torch.compile (inductor) and its scan step compiled by the "compiled" mode, trained at five
    # lengths with dynamo's recompile limit at 2. Before the fix the conv's backward (inductor fixed the length)
    # and the scan's adjoint step (gy[t]'s strides changed with the length) compiled a graph per length.
    monkeypatch.setitem(mamba.OPS, "compiled", {k: mamba.Fused(f) for k, f in mamba.OPS["sequential"].items()})
    torch.manual_seed(0)
    model = Mamba(MambaConfig(vocab_size=8, n_classes=4, n_layer=1, d_model=8, d_state=2, scan="compiled"))
    torch._dynamo.reset()
    fwd = torch.compile(model)
    try:
        with torch._dynamo.config.patch(recompile_limit=2, fail_on_recompile_limit_hit=True), \
                warnings.catch_warnings(record=True) as said:
            warnings.simplefilter("always")
            for T in range(9, 14):
                x = torch.randint(8, (2, T), generator=torch.Generator().manual_seed(T))
                fwd(x).float().logsumexp(-1).mean().backward()
    finally:
        torch._dynamo.reset()
    eager = [str(w.message) for w in said if "running it eager" in str(w.message)]
    assert not eager, eager  # Fused fell back: its step hit the limit
    assert all(f.compiled not in (None, f.fn) for f in mamba.OPS["compiled"].values()
               if f.fn in (mamba.scan_step, mamba.adjoint_step))
