"""Bad input to every script: one line naming what to change, exit 2 (usage) or 1 (fault), no traceback,
earlier files whole (issue 44)."""
import json
import os

import pytest

import checkpoints
import presets
import runtime
from cli import exit_code


def test_an_old_empty_lock_is_taken_over(tmp_path, capsys):
    lock = tmp_path / ".lock"
    lock.write_text("")
    os.utime(lock, (1, 1))  # left by a run killed before it wrote its pid
    assert checkpoints.lock_out_dir(str(tmp_path)) == str(lock)
    assert lock.read_text().strip() == str(os.getpid())
    assert "empty lock" in capsys.readouterr().out


def test_a_fresh_empty_lock_still_refuses(tmp_path):
    (tmp_path / ".lock").write_text("")  # its owner may be writing its pid right now
    with pytest.raises(ValueError, match="in use by another run"):
        checkpoints.lock_out_dir(str(tmp_path))


@pytest.mark.parametrize("name", ["WORLD_SIZE", "LOCAL_RANK", "LOCAL_WORLD_SIZE"])
def test_a_torchrun_variable_that_is_not_an_integer_is_named(monkeypatch, name):
    monkeypatch.setenv(name, "abc")
    with pytest.raises(ValueError, match=f"{name}='abc' must be an integer"):
        runtime.env_int(name, 0)


def test_world_size_abc_is_named_by_init_distributed(monkeypatch):
    monkeypatch.setenv("WORLD_SIZE", "abc")
    with pytest.raises(ValueError, match="WORLD_SIZE"):
        runtime.init_distributed({"batch_size": 4}, None)


@pytest.mark.parametrize("spec", ["accuracy>=1e400", "kl<=-1e999"])
def test_stop_at_refuses_an_infinite_threshold(spec):
    with pytest.raises(ValueError, match="finite"):
        presets.parse_stop(spec, None)
