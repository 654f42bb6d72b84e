"""Checkpointer.load_into: the newest checkpoint read straight into the state's own tensors
and arrays, the rest replaced, and a clear error naming the key when they do not fit."""

from __future__ import annotations

import shutil
from pathlib import Path
from typing import Any

import pytest

from hafo.checkpoint.errors import CheckpointMismatch, CorruptCheckpoint

from .conftest import make_checkpointer as make

pytestmark = pytest.mark.usefixtures("restore_sigusr1")

np = pytest.importorskip("numpy")
torch = pytest.importorskip("torch")

V3_FIXTURE = Path(__file__).parent / "data" / "checkpoint_v3"


def saved_state() -> dict[str, Any]:
    gen = torch.Generator().manual_seed(1)
    return {
        "model": {"w": torch.randn(64, 32, generator=gen), "b": torch.randn(32, generator=gen),
                  "bf": torch.randn(16, generator=gen).bfloat16()},
        "optim": {"state": {0: {"step": torch.tensor(5.0), "m": torch.randn(64, 32)}},
                  "param_groups": [{"lr": 0.01, "betas": (0.9, 0.99)}]},
        "np": np.arange(20, dtype=np.int64).reshape(4, 5),
        "step": 12, "name": "run-a", "blob": b"rng-state", "pair": (3, b"xy"),
    }


def blank_state() -> dict[str, Any]:
    """The same layout, all zeros and placeholders: what a fresh process builds."""
    return {
        "model": {"w": torch.zeros(64, 32), "b": torch.zeros(32),
                  "bf": torch.zeros(16, dtype=torch.bfloat16)},
        "optim": {"state": {0: {"step": torch.tensor(0.0), "m": torch.zeros(64, 32)}},
                  "param_groups": [{"lr": 1.0, "betas": (0.0, 0.0)}]},
        "np": np.zeros((4, 5), dtype=np.int64),
        "step": 0, "name": "", "blob": b"", "pair": (0, b""),
    }


def test_no_checkpoint_gives_none_and_leaves_the_state(tmp_path: Path) -> None:
    state = blank_state()
    assert make(tmp_path).load_into(state) is None
    assert state["step"] == 0 and float(state["model"]["w"].abs().sum()) == 0.0


def test_restores_in_place_into_the_same_memory(tmp_path: Path) -> None:
    saved = saved_state()
    ck = make(tmp_path)
    path = ck.save(saved, step=12)
    state = blank_state()
    tensors = {"w": state["model"]["w"], "m": state["optim"]["state"][0]["m"]}
    pointers = {k: t.data_ptr() for k, t in tensors.items()}
    array = state["np"]
    restored = ck.load_into(state)
    assert restored is not None and restored.state is state
    assert (restored.step, restored.epoch, restored.path) == (12, 1, path)
    assert state["model"]["w"] is tensors["w"] and state["optim"]["state"][0]["m"] is tensors["m"]
    assert {k: t.data_ptr() for k, t in tensors.items()} == pointers  # no new memory
    assert state["np"] is array
    for key in ("w", "b", "bf"):
        assert torch.equal(state["model"][key], saved["model"][key])
    assert torch.equal(state["optim"]["state"][0]["m"], saved["optim"]["state"][0]["m"])
    assert float(state["optim"]["state"][0]["step"]) == 5.0
    assert np.array_equal(state["np"], saved["np"])
    assert state["optim"]["param_groups"] == [{"lr": 0.01, "betas": (0.9, 0.99)}]
    assert (state["step"], state["name"], state["blob"], state["pair"]) == (
        12, "run-a", b"rng-state", (3, b"xy"))


def test_strided_and_parameter_targets(tmp_path: Path) -> None:
    ck = make(tmp_path)
    weights = torch.arange(12.0).reshape(3, 4)
    ck.save({"t": weights.T, "p": weights, "a": np.arange(6.0).reshape(2, 3).T}, step=1)
    strided = torch.zeros(3, 4).T  # shape (4, 3), not contiguous
    param = torch.nn.Parameter(torch.zeros(3, 4))
    array = np.zeros((3, 2), order="F")  # not C-contiguous
    state = {"t": strided, "p": param, "a": array}
    assert ck.load_into(state) is not None
    assert state["t"] is strided and torch.equal(strided, weights.T)
    assert state["p"] is param and param.requires_grad and torch.equal(param.detach(), weights)
    assert state["a"] is array and np.array_equal(array, np.arange(6.0).reshape(2, 3).T)


@pytest.mark.parametrize(("edit", "message"), [
    (lambda s: s["model"].pop("b"), r"state\['model'\]\['b'\]: in the checkpoint, not in"),
    (lambda s: s["model"].update(extra=torch.zeros(1)),
     r"state\['model'\]\['extra'\]: in the state, not in the checkpoint"),
    (lambda s: s["model"].update(w=torch.zeros(32, 64)),
     r"state\['model'\]\['w'\]: float32 \[64, 32\] in the checkpoint, float32 \[32, 64\] here"),
    (lambda s: s["model"].update(b=torch.zeros(32, dtype=torch.float64)),
     r"state\['model'\]\['b'\]: float32 \[32\] in the checkpoint, float64 \[32\] here"),
    (lambda s: s["optim"]["state"][0].update(m=5),
     r"state\['optim'\]\['state'\]\[0\]\['m'\]: a tensor in the checkpoint, a int here"),
    (lambda s: s.update(step=torch.zeros(1)),
     r"state\['step'\]: a int in the checkpoint, a tensor here"),
    (lambda s: s.update(np=np.zeros((4, 5), dtype=np.int32)),
     r"state\['np'\]: int64 \[4, 5\] in the checkpoint, int32 \[4, 5\] here"),
    (lambda s: s.update(np=torch.zeros(4, 5)),
     r"state\['np'\]: a NumPy array in the checkpoint, a tensor here"),
    (lambda s: s["optim"].update(param_groups=[]),
     r"state\['optim'\]\['param_groups'\]: a list of 1 in the checkpoint, a list of 0 here"),
    (lambda s: s.update(model=[1]),
     r"state\['model'\]: a dict in the checkpoint, a list of 1 here"),
])
def test_mismatch_names_the_key_and_changes_nothing(tmp_path: Path, edit: Any,
                                                    message: str) -> None:
    ck = make(tmp_path)
    ck.save(saved_state(), step=12)
    state = blank_state()
    edit(state)
    with pytest.raises(CheckpointMismatch, match=message) as info:
        ck.load_into(state)
    assert "ckpt-e000000000001-s000000000012 does not fit the state" in str(info.value)
    assert state["step"] == 0 or isinstance(state["step"], torch.Tensor)
    model = state["model"]
    if isinstance(model, dict) and "w" in model:
        assert float(model["w"].abs().sum()) == 0.0  # nothing was read into the state


def test_read_only_array_is_a_mismatch(tmp_path: Path) -> None:
    ck = make(tmp_path)
    ck.save({"a": np.ones(3)}, step=1)
    frozen = np.zeros(3)
    frozen.flags.writeable = False
    with pytest.raises(CheckpointMismatch, match=r"state\['a'\]: the array here is read-only"):
        ck.load_into({"a": frozen})


def test_corrupt_newest_falls_back_to_the_previous(tmp_path: Path) -> None:
    ck = make(tmp_path, keep_last=5)
    first = saved_state()
    ck.save(first, step=1)
    second = saved_state()
    second["model"]["w"] += 1
    newest = Path(ck.save(second, step=2))
    with open(newest / "data.bin", "r+b") as fh:
        fh.seek(100)
        fh.write(b"\xff\xfe")
    state = blank_state()
    restored = ck.load_into(state)
    assert restored is not None and restored.step == 1
    assert torch.equal(state["model"]["w"], first["model"]["w"])


def test_nothing_verifies_after_a_partial_read_raises(tmp_path: Path) -> None:
    ck = make(tmp_path)
    path = Path(ck.save(saved_state(), step=1))
    with open(path / "data.bin", "r+b") as fh:
        fh.seek(64 * 32 * 4 - 10)  # inside the last chunk of the first tensor
        fh.write(b"\x00\x00\x00\x01")
    with pytest.raises(CorruptCheckpoint, match="state was partly overwritten"):
        ck.load_into(blank_state())


def test_format_3_loads_into_a_state(tmp_path: Path) -> None:
    root = tmp_path / "v3"
    shutil.copytree(V3_FIXTURE, root)
    restored = make(root).load_latest()
    assert restored is not None
    blank = {k: (torch.zeros_like(v) if isinstance(v, torch.Tensor) else
                 np.zeros_like(v) if isinstance(v, np.ndarray) else v)
             for k, v in restored.state.items()}
    blank["optim"] = {"state": {0: {"exp_avg": torch.zeros(3)}}, "groups": [{"lr": 0.0}],
                      "pair": (0, "")}
    bf16 = blank["bf16"]
    assert make(root).load_into(blank) is not None
    assert blank["bf16"] is bf16 and torch.equal(bf16, torch.arange(4, dtype=torch.bfloat16))
    assert torch.equal(blank["t32"], restored.state["t32"])
    assert np.array_equal(blank["np"], restored.state["np"])
    assert torch.equal(blank["optim"]["state"][0]["exp_avg"], torch.ones(3))
    assert blank["optim"]["pair"] == (1, "x") and blank["name"] == "v3"
