"""The checkpoint benchmark (benchmarks/checkpoint.py) at a tiny size: it runs, every method
is measured and checked, the table and the JSON are complete; its cold-cache helper evicts;
the GPU script refuses a machine without CUDA with one line."""

from __future__ import annotations

import ctypes
import importlib.util
import json
import mmap
import os
import subprocess
import sys
from pathlib import Path

import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("safetensors")

ROOT = Path(__file__).resolve().parents[2]
BENCH = ROOT / "benchmarks"
sys.path.insert(0, str(BENCH))

from ckpt_methods import ASYNCS, LABELS, LOADS, SAVES, layout  # noqa: E402
from cold_cache import evict  # noqa: E402


def run(args: list[str], tmp_path: Path, timeout: float = 100) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "HAFO_BENCH_DIR": str(tmp_path), "PYTHONPATH": str(ROOT),
           "OMP_NUM_THREADS": "1"}
    return subprocess.run([sys.executable, *args], capture_output=True, text=True, env=env,
                          timeout=timeout, check=False, cwd=ROOT)


def test_a_tiny_run_measures_every_method_and_reports_it(tmp_path: Path) -> None:
    out = tmp_path / "out.json"
    done = run([str(BENCH / "checkpoint.py"), "--mib", "4", "--repeat", "2", "--no-rss",
                "--compute-s", "0.05", "--json", str(out)], tmp_path)
    assert done.returncode == 0, done.stderr
    [size] = json.loads(out.read_text())["sizes"]
    assert size["mib"] == 4 and size["tensors"] == 64
    assert size["dtypes"] == ["bfloat16", "float32", "int64"]
    measured = [op for op in LOADS if op not in size["not_available"]]
    keys = [*SAVES, *measured, "memcpy:stall", "hafo_async_bg:copy", "dcp_async_bg:copy",
            *(f"{op}:{part}" for op in ASYNCS if op != "memcpy" for part in ("stall", "total"))]
    for key in keys:
        sec = size["seconds"][key]
        assert len(sec["samples"]) == 2 and sec["min"] <= sec["median"] <= sec["max"], key
        assert sec["min"] > 0, key
    assert size["not_available"] in ([], ["hafo_load_into"])
    for name, value in size["ratios"].items():
        if "load_into" not in name or not size["not_available"]:
            assert value is not None and value > 0, name
    goals = size["goals"]
    assert len(goals) == 14
    # RSS skipped, the stall goals are for >= 1 GiB: those have no verdict; the rest do
    assert [g["pass"] is None for g in goals] == [False] * 7 + [True, True, False, False,
                                                                False, True, True]
    assert size["background_compute_s"] == 0.05
    ranks = size["ranks"]
    if importlib.util.find_spec("hafo.checkpoint.sharded") is None:
        assert "not present" in ranks["skipped"]
    else:
        assert set(ranks["seconds"]) == {"dcp_save", "sharded_save", "dcp_load",
                                         "sharded_load"}
        assert ranks["world"] == 2 and ranks["bytes"] > 0
    text = done.stdout
    for op in (*SAVES, *LOADS, *ASYNCS):
        assert LABELS[op] in text, op
    assert "goals at 4 MiB" in text and text.count("PASS") + text.count("MISS") == 10
    assert sorted(p.name for p in tmp_path.iterdir()) == ["out.json"]  # cleaned up


def test_peak_rss_is_measured_in_a_fresh_process(tmp_path: Path) -> None:
    done = run([str(BENCH / "checkpoint.py"), "--rss-child", "hafo_save", "4",
                str(tmp_path / "rss")], tmp_path)
    assert done.returncode == 0, done.stderr
    result = json.loads(done.stdout.strip().splitlines()[-1])
    assert result["op"] == "hafo_save" and result["growth_bytes"] >= 0
    assert list((tmp_path / "rss" / "hafo").glob("ckpt-*"))  # it really saved


def test_the_state_layout_is_64_mixed_tensors_of_the_size_asked() -> None:
    for mib in (4, 256, 4096):
        tensors = layout(mib)
        assert len(tensors) == 64 and len({name for name, _s, _d in tensors}) == 64
        nbytes = sum(torch.empty(shape, dtype=dtype, device="meta").numel()
                     * torch.empty((), dtype=dtype).element_size() for _n, shape, dtype in tensors)
        assert 0.97 * mib * 2**20 <= nbytes <= mib * 2**20
        assert {dtype for _n, _s, dtype in tensors} == {torch.bfloat16, torch.float32,
                                                        torch.int64}


def _cached(path: Path) -> bool:
    """Whether the first page of ``path`` is in the page cache (mincore(2) of a mapping that
    is never touched: asking does not read the file)."""
    libc = ctypes.CDLL(None, use_errno=True)
    with open(path, "rb") as fh, mmap.mmap(fh.fileno(), 4096, access=mmap.ACCESS_COPY) as mm:
        address = ctypes.addressof(ctypes.c_char.from_buffer(mm))
        vec = (ctypes.c_ubyte * 1)()
        if libc.mincore(ctypes.c_void_p(address), ctypes.c_size_t(4096), vec) != 0:
            pytest.skip(f"mincore failed: errno {ctypes.get_errno()}")
        resident = bool(vec[0] & 1)
    return resident


def test_evict_drops_every_file_of_a_directory_from_the_page_cache(tmp_path: Path) -> None:
    files = [tmp_path / "a.bin", tmp_path / "sub" / "b.bin"]
    files[1].parent.mkdir()
    for file in files:
        file.write_bytes(os.urandom(1 << 20))
    if not all(_cached(f) for f in files):
        pytest.skip("this filesystem does not report page-cache residency")
    assert evict(tmp_path) == 2
    if any(_cached(f) for f in files):
        pytest.skip("this filesystem keeps files in memory (tmpfs?)")
    files[0].read_bytes()
    assert _cached(files[0]) and not _cached(files[1])
    assert evict(files[0]) == 1 and not _cached(files[0])


@pytest.mark.skipif(torch.cuda.is_available(), reason="a CUDA device is present")
def test_the_gpu_script_says_in_one_line_that_there_is_no_cuda(tmp_path: Path) -> None:
    done = run([str(ROOT / "scripts" / "gpu_checkpoint.py")], tmp_path, timeout=60)
    assert done.returncode == 2
    assert done.stdout == ""
    lines = done.stderr.strip().splitlines()
    assert len(lines) == 1 and "no CUDA device" in lines[0], done.stderr
