"""A small workload that trains (a counter and a fake loss), checkpoints with the SDK, resumes
after any move, and logs every step to ``$HAFO_CHECKPOINT_DIR/progress.jsonl``. Used by the
demo, the tests and the benchmarks."""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from collections.abc import Mapping
from pathlib import Path

from hafo.agent.procid import boot_id
from hafo.checkpoint import Checkpointer
from hafo.checkpoint.warm import confirm_park, park_requested, take_next_epoch
from hafo.model.warm import STANDBY_ENV, WARM_DIR_ENV

#: The escaped process (``--escape``): it ignores SIGTERM and logs a line every 0.1 s with the
#: instance it came from, for as long as it lives. Standard library only: it runs with an
#: empty environment.
ESCAPED = """
import json, os, signal, sys, time
for sig in (signal.SIGTERM, signal.SIGINT, signal.SIGHUP, signal.SIGUSR1, signal.SIGUSR2):
    signal.signal(sig, signal.SIG_IGN)
log, workload, epoch, node = sys.argv[1], sys.argv[2], int(sys.argv[3]), sys.argv[4]
boot = open("/proc/sys/kernel/random/boot_id").read().strip()
while True:
    with open(log, "a") as fh:
        fh.write(json.dumps({"workload": workload, "node": node, "epoch": epoch,
                             "pid": os.getpid(), "boot": boot, "t": time.time(),
                             "event": "escaped"}) + "\\n")
    time.sleep(0.1)
"""


def escape(log_path: Path, identity: Mapping[str, object]) -> None:
    """Leave a process behind that left the instance every way a process can but its cgroup:
    a double fork in a new session (its parent exits at once), then an exec with an empty
    environment (no ``HAFO_*`` marks), ignoring SIGTERM (as daemonising launchers and ``env
    -i`` wrappers do). Only the instance's cgroup still holds it."""
    child = os.fork()
    if child == 0:
        try:
            os.setsid()
            if os.fork() == 0:
                os.execve(sys.executable, [sys.executable, "-c", ESCAPED, str(log_path),
                                           str(identity["workload"]), str(identity["epoch"]),
                                           str(identity["node"])], {})
        finally:
            os._exit(0)
    os.waitpid(child, 0)


def stand_by(warm_dir: Path) -> None:
    """A warm gang's standby: park at once when asked, and wait to be handed a member."""
    epoch = int(os.environ.get("HAFO_EPOCH", "0"))
    while os.environ.get(STANDBY_ENV) == "1":
        while not park_requested(warm_dir, epoch):
            time.sleep(0.02)
        confirm_park(warm_dir, epoch)
        epoch = take_next_epoch(warm_dir, epoch).epoch


def main(argv: list[str] | None = None) -> int:
    """Run the training loop; exit 0 after ``--steps`` (0 = forever)."""
    parser = argparse.ArgumentParser(prog="hafo-demo-workload")
    parser.add_argument("--steps", type=int, default=0)
    parser.add_argument("--interval", type=float, default=0.05)
    parser.add_argument("--every", type=int, default=10)
    parser.add_argument("--fail-at", type=int, default=0, help="exit 3 at this step once")
    parser.add_argument("--stall-at", type=int, default=0,
                        help="hang at this step once (as a stuck NCCL collective would)")
    parser.add_argument("--escape", action="store_true",
                        help="leave a process behind that escapes the instance's tree and "
                             "environment and ignores SIGTERM")
    parser.add_argument("--warm", action="store_true",
                        help="a warm gang's member: park when asked and take the next epoch "
                             "in this process (the protocol of hafo.model.warm, no torch)")
    args = parser.parse_args(argv)
    warm_dir = Path(os.environ[WARM_DIR_ENV]) if args.warm and os.environ.get(WARM_DIR_ENV) \
        else None
    if warm_dir is not None and os.environ.get(STANDBY_ENV) == "1":
        stand_by(warm_dir)
    ck = Checkpointer()
    def save(state: dict[str, object], step: int) -> None:
        # a gang member: rank 0 alone saves (every rank logs, and stops when asked); a warm
        # member's rank is its current epoch's
        if os.environ.get("HAFO_GANG_RANK", "0") == "0":
            ck.save(state, step=step)
    log_path = ck.root / "progress.jsonl"
    identity = {"workload": os.environ.get("HAFO_WORKLOAD"), "node": os.environ.get("HAFO_NODE"),
                "epoch": int(os.environ.get("HAFO_EPOCH", "0")), "pid": os.getpid(),
                "boot": boot_id()}  # pid and boot: the process, on the node's own numbering
    latest = ck.load_latest()
    step = latest.step if latest else 0
    loss = float(latest.state["loss"]) if latest else 10.0
    failed_once = bool(latest.state.get("failed_once")) if latest else False
    stalled_once = bool(latest.state.get("stalled_once")) if latest else False

    def record(**fields: object) -> None:
        with open(log_path, "a") as fh:
            fh.write(json.dumps({**identity, "t": time.time(), **fields}) + "\n")

    record(event="start", resumed_from=step)
    if args.escape:
        escape(log_path, identity)
    print(f"start at step {step} on {identity['node']} epoch {identity['epoch']}", flush=True)
    while args.steps == 0 or step < args.steps:
        time.sleep(args.interval)
        if warm_dir is not None and park_requested(warm_dir, ck.epoch):
            record(event="parked", step=step)
            confirm_park(warm_dir, ck.epoch)
            take_next_epoch(warm_dir, ck.epoch)
            ck = Checkpointer()  # the new epoch's: it reads HAFO_EPOCH
            identity["epoch"] = ck.epoch
            latest = ck.load_latest()
            step = latest.step if latest else 0
            loss = float(latest.state["loss"]) if latest else 10.0
            record(event="start", resumed_from=step, warm=True)
            continue
        step += 1
        loss *= 0.99
        record(event="step", step=step)
        ck.heartbeat(step)
        if args.stall_at and step == args.stall_at and not stalled_once:
            save({"loss": loss, "failed_once": failed_once, "stalled_once": True}, step=step)
            print(f"stalling on purpose at step {step}", flush=True)
            while True:
                time.sleep(1)
        if args.fail_at and step == args.fail_at and not failed_once:
            save({"loss": loss, "failed_once": True}, step=step)
            print(f"failing on purpose at step {step}", flush=True)
            return 3
        if ck.should_checkpoint():  # a planned move: checkpoint now, then leave
            save({"loss": loss, "failed_once": failed_once, "stalled_once": stalled_once},
                    step=step)
            record(event="preempted", step=step)
            print(f"step {step}: checkpointed for a planned move, exiting", flush=True)
            return 0
        if step % args.every == 0:
            save({"loss": loss, "failed_once": failed_once, "stalled_once": stalled_once},
                    step=step)
            record(event="checkpoint", step=step)
            print(f"step {step} loss {loss:.4f} (checkpointed)", flush=True)
    record(event="done", step=step)
    return 0


if __name__ == "__main__":
    sys.exit(main())
