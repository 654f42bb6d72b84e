"""The checkpoint benchmark's results for one state size: statistics, ratios against the
baselines measured in the same run, the issue's goals (PASS/MISS), and the printed table."""

from __future__ import annotations

import statistics
from dataclasses import dataclass, field
from typing import Any

from ckpt_methods import LABELS

GIB = 2**30


def stats(samples: list[float]) -> dict[str, Any]:
    """Median and spread of one measurement's samples (seconds)."""
    return {"samples": samples, "median": statistics.median(samples), "min": min(samples),
            "max": max(samples)}


@dataclass
class SizeResult:
    """Everything measured for one state size."""

    mib: int
    nbytes: int
    tensors: int
    dtypes: list[str]
    repeat: int
    cold: str
    samples: dict[str, list[float]]
    rss: dict[str, float] = field(default_factory=dict)  # op -> growth / state bytes
    missing: list[str] = field(default_factory=list)  # ops this hafo version lacks
    ranks: dict[str, Any] | None = None  # ckpt_ranks.run_ranks's result, with "world"
    ranks_note: str = ""  # why there is no rank measurement
    compute_s: float = 0.0  # the background-snapshot loop's forward and backward, seconds

    def median(self, key: str) -> float | None:
        """Median seconds of ``key`` (an op, or ``<async op>:stall`` / ``:total``)."""
        values = self.samples.get(key)
        return statistics.median(values) if values else None

    def ratio(self, baseline: str, method: str) -> float | None:
        """Throughput of ``method`` over ``baseline`` (>1: faster than the baseline)."""
        base, mine = self.median(baseline), self.median(method)
        return base / mine if base is not None and mine else None

    def best_torch_load(self) -> str:
        """The faster of plain torch.load and torch.load(mmap=True)+touch."""
        plain, mapped = self.median("torch_load"), self.median("torch_load_mmap")
        if mapped is not None and (plain is None or mapped < plain):
            return "torch_load_mmap"
        return "torch_load"

    def ratios(self) -> dict[str, float | None]:
        """Every ratio the table prints, by name."""
        torch_load = self.best_torch_load()
        out: dict[str, float | None] = {
            "save_vs_raw_write": self.ratio("raw_write", "hafo_save"),
            "save_vs_torch_save": self.ratio("torch_save", "hafo_save"),
            "save_vs_dcp_save": self.ratio("dcp_save", "hafo_save"),
            "save_vs_safetensors": self.ratio("st_save", "hafo_save"),
        }
        out["hafo_load_into_vs_torch_load_into"] = self.ratio("torch_load_into",
                                                              "hafo_load_into")
        for op in ("hafo_load", "hafo_load_into"):
            out[f"{op}_vs_raw_read"] = self.ratio("raw_read", op)
            out[f"{op}_vs_torch_load"] = self.ratio(torch_load, op)
            out[f"{op}_vs_dcp_load"] = self.ratio("dcp_load", op)
            out[f"{op}_vs_safetensors"] = self.ratio("st_load", op)
        for op, save in (("hafo_async", "hafo_save"), ("dcp_async", "dcp_save"),
                         ("hafo_async_bg", "hafo_save"), ("dcp_async_bg", "dcp_save"),
                         ("memcpy", "hafo_save")):
            stall, saved = self.median(f"{op}:stall"), self.median(save)
            out[f"{op}_stall_of_save"] = stall / saved if stall is not None and saved else None
        # like against like: a snapshot taken before the call returns against DCP's default
        # (staging before it returns), a background snapshot against DCP's async staging
        for op, dcp_op, key in (("hafo_async", "dcp_async", "stall_vs_dcp_stall"),
                                ("hafo_async_bg", "dcp_async_bg", "bg_stall_vs_dcp_stall")):
            mine, dcp = self.median(f"{op}:stall"), self.median(f"{dcp_op}:stall")
            out[key] = mine / dcp if mine is not None and dcp else None
        # with less compute than the copy takes, the loop waits for the rest of the copy
        mine, dcp = self.median("hafo_async_bg:copy"), self.median("dcp_async_bg:copy")
        out["bg_copy_vs_dcp_copy"] = mine / dcp if mine is not None and dcp else None
        mine, floor = self.median("hafo_async:stall"), self.median("memcpy:stall")
        out["stall_vs_memcpy"] = mine / floor if mine is not None and floor else None
        return out

    def goals(self) -> list[dict[str, Any]]:
        """The issue's goals at this size: value, target and pass (None: not applicable)."""
        r = self.ratios()
        torch_load = "torch.load(mmap=True)" if self.best_torch_load() == "torch_load_mmap" \
            else "torch.load"
        big = self.mib >= 1024
        rows: list[tuple[str, float | None, float, bool, bool]] = [
            ("save >= 0.9x raw write", r["save_vs_raw_write"], 0.9, True, True),
            ("save >= 1.2x torch.save", r["save_vs_torch_save"], 1.2, True, True),
            ("save >= 1.0x DCP save", r["save_vs_dcp_save"], 1.0, True, True),
            ("verified cold load >= 0.8x raw read", r["hafo_load_vs_raw_read"], 0.8, True,
             True),
            ("verified cold load >= 1.0x DCP load", r["hafo_load_vs_dcp_load"], 1.0, True, True),
            (f"verified cold load >= 1.0x {torch_load}", r["hafo_load_vs_torch_load"], 1.0,
             True, True),
            ("  load_into >= 1.0x torch.load(mmap=True) + copy into state",
             r["hafo_load_into_vs_torch_load_into"], 1.0, True, True),
            ("save_async stall <= 0.05 of a save (goal at 1 and 4 GiB)",
             r["hafo_async_stall_of_save"], 0.05, False, big),
            (f"  the same, background snapshot, {self.compute_s:g} s compute",
             r["hafo_async_bg_stall_of_save"], 0.05, False, big),
            ("save_async stall <= DCP async_save stall", r["stall_vs_dcp_stall"], 1.0, False,
             True),
            ("  the same, background snapshot vs DCP's async staging",
             r["bg_stall_vs_dcp_stall"], 1.0, False, True),
            ("  background copy <= DCP's async staging copy (less compute)",
             r["bg_copy_vs_dcp_copy"], 1.0, False, True),
            ("peak RSS growth of save <= 10% of the state", self.rss.get("hafo_save"), 0.10,
             False, True),
            ("peak RSS growth of load_into <= 10% of the state",
             self.rss.get("hafo_load_into"), 0.10, False, True),
        ]
        goals = []
        for text, value, target, at_least, applies in rows:
            ok = None if value is None or not applies else (
                value >= target if at_least else value <= target)
            goals.append({"goal": text, "value": value, "target": target, "pass": ok})
        return goals

    def to_json(self) -> dict[str, Any]:
        """Every number, for ``--json``."""
        return {"mib": self.mib, "bytes": self.nbytes, "tensors": self.tensors,
                "dtypes": self.dtypes, "repeat": self.repeat, "cold_cache": self.cold,
                "seconds": {k: stats(v) for k, v in self.samples.items()},
                "gib_per_s": {k: self.nbytes / statistics.median(v) / GIB
                              for k, v in self.samples.items() if not k.endswith(":stall")},
                "ratios": self.ratios(), "torch_load_baseline": self.best_torch_load(),
                "rss_growth_of_state": self.rss, "not_available": self.missing,
                "ranks": self.ranks_json(), "goals": self.goals(),
                "background_compute_s": self.compute_s}

    def ranks_json(self) -> dict[str, Any]:
        """The multi-rank measurement (or why there is none), for ``--json``."""
        if self.ranks is None:
            return {"skipped": self.ranks_note}
        samples = self.ranks["samples"]
        return {"world": self.ranks["world"], "bytes": self.ranks["bytes"],
                "seconds": {k: stats(v) for k, v in samples.items()},
                "sharded_save_vs_dcp_save": _over(samples, "dcp_save", "sharded_save"),
                "sharded_load_vs_dcp_load": _over(samples, "dcp_load", "sharded_load")}


def _over(samples: dict[str, list[float]], baseline: str, method: str) -> float | None:
    if not samples.get(baseline) or not samples.get(method):
        return None
    return statistics.median(samples[baseline]) / statistics.median(samples[method])


def _x(value: float | None, what: str) -> str:
    return f"{value:5.2f}x {what}" if value is not None else f"  n/a {what}"


def _line(res: SizeResult, key: str, label: str, note: str = "") -> str:
    values = res.samples.get(key)
    if not values:
        return f"  {label:40s} {'n/a':>8s}"
    med = statistics.median(values)
    spread = f"({min(values):.3f}-{max(values):.3f})"
    speed = "" if key.endswith(":stall") else f"{res.nbytes / med / GIB:6.2f}"
    return f"  {label:40s} {med:8.3f} {spread:17s} {speed:>6s}  {note}".rstrip()


def render(res: SizeResult) -> str:
    """The table for one size, then its goals."""
    r = res.ratios()
    tl = "torch.load(mmap)" if res.best_torch_load() == "torch_load_mmap" else "torch.load"
    head = (f"\n{res.mib} MiB state: {res.tensors} tensors ({', '.join(res.dtypes)}), "
            f"{res.nbytes / GIB:.3f} GiB, CPU; median of {res.repeat} (min-max); "
            f"cold reads: {res.cold}")
    lines = [head, f"  {'':40s} {'seconds':>8s} {'(min-max)':17s} {'GiB/s':>6s}  "
             "ratios: throughput vs baseline, >1 is faster"]
    lines.append(" save (durable on return)")
    for op in ("raw_write", "torch_save", "st_save", "dcp_save"):
        lines.append(_line(res, op, LABELS[op]))
    lines.append(_line(res, "hafo_save", LABELS["hafo_save"], "  ".join((
        _x(r["save_vs_raw_write"], "raw"), _x(r["save_vs_torch_save"], "torch.save"),
        _x(r["save_vs_dcp_save"], "DCP"), _x(r["save_vs_safetensors"], "safetensors")))))
    lines.append(" load (cold page cache)")
    for op in ("raw_read", "torch_load", "torch_load_mmap", "torch_load_into", "st_load",
               "dcp_load"):
        lines.append(_line(res, op, LABELS[op]))
    for op in ("hafo_load", "hafo_load_into"):
        if op in res.missing:
            lines.append(f"  {LABELS[op]:40s} {'n/a':>8s}  (not in this hafo version)")
            continue
        into = (_x(r["hafo_load_into_vs_torch_load_into"], "torch.load+copy"),) \
            if op == "hafo_load_into" else ()
        lines.append(_line(res, op, LABELS[op], "  ".join((
            _x(r[f"{op}_vs_raw_read"], "raw"), _x(r[f"{op}_vs_torch_load"], tl), *into,
            _x(r[f"{op}_vs_dcp_load"], "DCP"), _x(r[f"{op}_vs_safetensors"], "safetensors")))))
    lines.append(" async save (stall: what the training loop waits for before it may change "
                 "the state)")
    floor = r["memcpy_stall_of_save"]
    lines.append(_line(res, "memcpy:stall", LABELS["memcpy"],
                       f"{floor:5.3f} of hafo save: the floor of a snapshot taken now"
                       if floor is not None else ""))
    for op, save in (("dcp_async", "DCP save"), ("hafo_async", "hafo save")):
        frac = r[f"{op}_stall_of_save"]
        note = f"{frac:5.3f} of {save}" if frac is not None else ""
        if op == "hafo_async" and r["stall_vs_dcp_stall"] is not None:
            note += f", {r['stall_vs_dcp_stall']:.2f}x DCP's stall"
            if r["stall_vs_memcpy"] is not None:
                note += f", {r['stall_vs_memcpy']:.2f}x memcpy"
        lines.append(_line(res, f"{op}:stall", f"{LABELS[op]} stall", note))
        lines.append(_line(res, f"{op}:total", f"{LABELS[op]} until durable"))
    bg = "hafo_async_bg"
    if res.samples.get(f"{bg}:stall"):
        lines.append(f"  {LABELS[bg]}: the call returns at once; forward and backward "
                     f"({res.compute_s:g} s, host idle as while a GPU computes); the guarded "
                     f"optimizer step waits for the rest of the copy")
        frac = r[f"{bg}_stall_of_save"]
        note = f"{frac:5.3f} of hafo save" if frac is not None else ""
        if r["bg_stall_vs_dcp_stall"] is not None:
            note += f", {r['bg_stall_vs_dcp_stall']:.2f}x DCP's stall"
        lines.append(_line(res, f"{bg}:stall", "hafo stall (call + guarded step's wait)", note))
        lines.append(_line(res, f"{bg}:copy", "hafo background copy (then the write)"))
        lines.append(_line(res, f"{bg}:total", "hafo until durable"))
        dbg = "dcp_async_bg"
        frac = r[f"{dbg}_stall_of_save"]
        lines.append(_line(res, f"{dbg}:stall", f"{LABELS[dbg]} stall",
                           f"{frac:5.3f} of DCP save, the same loop" if frac is not None else ""))
        lines.append(_line(res, f"{dbg}:copy", f"{LABELS[dbg]} copy"))
        lines.append(_line(res, f"{dbg}:total", f"{LABELS[dbg]} durable"))
    if res.rss:
        lines.append(" peak RSS growth in a fresh process, % of the state")
        for ops in (("raw_write", "torch_save", "st_save", "dcp_save", "hafo_save"),
                    ("dcp_async", "dcp_async_bg", "hafo_async", "hafo_async_bg"),
                    ("raw_read", "torch_load", "torch_load_mmap", "torch_load_into", "st_load"),
                    ("dcp_load", "hafo_load", "hafo_load_into")):
            lines.append("  " + "; ".join(
                f"{LABELS[op]} {res.rss[op] * 100:.1f}%" for op in ops if op in res.rss))
    lines.extend(_ranks_lines(res))
    lines.append(f" goals at {res.mib} MiB")
    for goal in res.goals():
        verdict = {True: "PASS", False: "MISS", None: " -- "}[goal["pass"]]
        value = goal["value"]
        shown = "n/a" if value is None else (
            f"{value * 100:.1f}%" if "RSS" in goal["goal"] else f"{value:.3f}")
        lines.append(f"  {verdict}  {goal['goal']:58s} {shown}")
    return "\n".join(lines)


def _ranks_lines(res: SizeResult) -> list[str]:
    if res.ranks is None:
        return [f" sharded: {res.ranks_note}"] if res.ranks_note else []
    samples, nbytes = res.ranks["samples"], res.ranks["bytes"]
    lines = [f" sharded, {res.ranks['world']} ranks (gloo, 127.0.0.1), each its own part, "
             f"{nbytes / GIB:.3f} GiB in all; cold loads"]
    labels = (("dcp_save", "DCP save", None), ("sharded_save", "hafo sharded save", "dcp_save"),
              ("dcp_load", "DCP load (in place)", None),
              ("sharded_load", "hafo sharded load_latest", "dcp_load"))
    for op, label, base in labels:
        values = samples.get(op) or []
        if not values:
            lines.append(f"  {label:40s} {'n/a':>8s}")
            continue
        med = statistics.median(values)
        spread = f"({min(values):.3f}-{max(values):.3f})"
        note = _x(_over(samples, base, op), "DCP") if base else ""
        lines.append(f"  {label:40s} {med:8.3f} {spread:17s} {nbytes / med / GIB:6.2f}  "
                     f"{note}".rstrip())
    return lines
