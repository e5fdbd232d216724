"""The spare worker: `python -m training.worker --standby --channel-fd N [--device D]`.

A process that has already paid the cold start that does not depend on the game (torch,
envpool and the learners imported, the allocator and an Adam step warmed, the CUDA context up
where the device is cuda), then waits on its channel (training/protocol.py) for the argv of the
worker it is to become. On an assignment it becomes exactly what `python -m training.worker
ARGV` started in that run dir would have been: its log, working directory, priority, thread
count and process title are the cold worker's, and from `entry.main(ARGV)` on the code is the
same (locking, heartbeat, checkpoint load, exit codes, config.json).

It warms at low priority with one thread, so that it does not slow the games that train; an
idle spare holds no run-dir lock and exits 0 when the supervisor's end of the channel closes.
"""

from __future__ import annotations

import argparse
import contextlib
import ctypes
import os
import resource
import select
import signal
import socket
import sys
import time
from pathlib import Path
from typing import Any

from training import entry
from training.protocol import (
    SPARE_ALIVE_EVERY_S,
    SPARE_MAX_MESSAGE,
    decode_message,
    encode_message,
)

CAP_SYS_NICE = 23
SPARE_NICE = 19


def can_restore_priority() -> bool:
    """May this process go back to nice 0 once it has niced itself? Root (CAP_SYS_NICE) or
    an RLIMIT_NICE that allows nice 0 (systemd: LimitNICE=+0)."""
    try:
        for line in Path("/proc/self/status").read_text().splitlines():
            if line.startswith("CapEff:") and int(line.split()[1], 16) >> CAP_SYS_NICE & 1:
                return True
    except (OSError, ValueError, IndexError):
        pass
    soft, _ = resource.getrlimit(resource.RLIMIT_NICE)
    return soft == resource.RLIM_INFINITY or soft >= 20


def set_priority_all_threads(nice: int) -> None:
    """Linux nice values are per thread: set every thread of this process."""
    for tid in os.listdir("/proc/self/task"):
        try:
            os.setpriority(os.PRIO_PROCESS, int(tid), nice)
        except (ProcessLookupError, ValueError):
            continue


def warm_up(device: str, mirror: bool = False) -> str:
    """Pay what every worker pays before it knows its game; returns the device warmed.
    `mirror`: also what a worker with a mirror pays at its start (several hosts: each start
    reads the mirror's newest checkpoint): boto3's import and its S3 model."""
    import torch

    torch.set_num_threads(1)
    import gymnasium  # noqa: F401
    import numpy as np

    import checkpoints  # noqa: F401

    # envs: envpool's task registry (the workers' families only) and native module
    from training import dqn, envs, learner, logs, networks, optim, ppo, replay, session  # noqa: F401

    use_cuda = device != "cpu" and torch.cuda.is_available()
    dev = torch.device("cuda" if use_cuda else "cpu")
    # The allocator, the autograd engine, Adam's kernels and a conv on the target device,
    # on constant tensors (no random number is drawn: the worker seeds its own later).
    weight = torch.zeros(16, 4, 8, 8, device=dev, requires_grad=True)
    head = torch.zeros(16, 2, device=dev, requires_grad=True)
    opt = optim.make_adam([weight, head], lr=1e-3)  # the workers' Adam, fused
    frames = torch.zeros(2, 4, 84, 84, device=dev)
    out = torch.nn.functional.conv2d(frames, weight, stride=4).mean(dim=(2, 3)) @ head
    out.sum().backward()
    opt.step()
    np.zeros(4, dtype=np.float32).sum()
    if use_cuda:
        torch.cuda.synchronize()
    if mirror:
        warm_mirror_client()
    return dev.type


def warm_mirror_client() -> None:
    """boto3 imported and one S3 client built (its service model parsed), where boto3 is
    installed: ~0.2 s of a mirrored worker's start. No request is made and no credential
    looked up (the client is given placeholder ones and never used)."""
    try:
        import boto3.session
    except ImportError:
        return
    boto3.session.Session().client(
        "s3",
        region_name="us-east-1",
        endpoint_url="http://127.0.0.1:9",
        aws_access_key_id="warm-up",
        aws_secret_access_key="warm-up",
    )


def parse(argv: list[str]) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="python -m training.worker --standby")
    parser.add_argument("--standby", action="store_true", required=True)
    parser.add_argument("--channel-fd", type=int, required=True)
    parser.add_argument("--device", choices=("auto", "cpu", "cuda"), default="cpu")
    parser.add_argument("--parent-pid", type=int, default=0, help="the supervisor's pid")
    parser.add_argument(
        "--warm-mirror", action="store_true", help="also warm the mirror's S3 client (Ray hosts)"
    )
    return parser.parse_args(argv)


PR_SET_PDEATHSIG = 1


def set_parent_death_signal(sig: int) -> None:
    """Linux prctl(PR_SET_PDEATHSIG): `sig` when the supervisor dies (0: none). A spare still
    importing torch when its supervisor is killed goes at once, not after its warm-up."""
    try:
        libc = ctypes.CDLL(None, use_errno=True)
        libc.prctl(PR_SET_PDEATHSIG, sig, 0, 0, 0)
    except (OSError, AttributeError):  # not Linux: the channel's end of file still ends it
        pass


def main(argv: list[str]) -> int:
    ns = parse(argv)
    chan = socket.socket(fileno=ns.channel_fd)
    parent = ns.parent_pid or os.getppid()
    set_parent_death_signal(signal.SIGTERM)
    if os.getppid() != parent:  # the supervisor died before the signal was armed
        return 0
    restorable = can_restore_priority()
    if restorable:
        os.nice(SPARE_NICE)
    t0 = time.monotonic()
    warmed = warm_up(ns.device, mirror=ns.warm_mirror)
    try:
        send(chan, {
            "type": "ready", "pid": os.getpid(), "warm_s": round(time.monotonic() - t0, 3),
            "device": warmed, "priority": "low" if restorable else "normal",
        })  # fmt: skip
    except OSError:
        return 0  # the supervisor went away while this spare warmed up
    assignment = wait_for_assignment(chan, parent)
    if assignment is None:
        return 0
    assigned = time.monotonic()
    set_parent_death_signal(0)  # a cold worker has none: it checkpoints when orphaned
    with contextlib.suppress(OSError):  # the supervisor's end may be gone already: go on
        send(chan, {"type": "assigned", "mono": assigned})
    chan.close()
    return become(assignment, restorable, assigned)


def send(chan: socket.socket, msg: dict[str, Any]) -> None:
    chan.sendall(encode_message(msg))


def wait_for_assignment(chan: socket.socket, parent: int) -> dict[str, Any] | None:
    """The assignment, or None when the supervisor is gone (end of file, a new parent)."""
    while True:
        ready, _, _ = select.select([chan], [], [], SPARE_ALIVE_EVERY_S)
        if os.getppid() != parent:
            return None
        if not ready:
            try:
                send(chan, {"type": "alive"})
            except OSError:
                return None
            continue
        try:
            raw = chan.recv(SPARE_MAX_MESSAGE)
        except OSError:
            return None
        if not raw:
            return None
        msg = decode_message(raw)
        if msg is not None and msg["type"] == "assign":
            return msg
        print(f"rlsup spare: ignored a message on the channel: {raw[:200]!r}", file=sys.stderr)


def become(msg: dict[str, Any], restorable: bool, assigned: float) -> int:
    """Turn into `python -P -m training.worker ARGV` started in msg["cwd"], logging to
    msg["log"]: the same process a cold start would have made."""
    argv = [str(a) for a in msg.get("argv", [])]
    sys.stdout.flush()
    sys.stderr.flush()
    flags = os.O_WRONLY | os.O_CREAT | os.O_APPEND | os.O_NOFOLLOW | os.O_CLOEXEC
    try:
        fd = os.open(str(msg["log"]), flags, 0o640)
        os.dup2(fd, 1)
        os.dup2(fd, 2)
        os.close(fd)
        os.chdir(str(msg["cwd"]))
    except (OSError, KeyError) as exc:
        print(f"rlsup spare: cannot take the assignment: {exc}", file=sys.stderr)
        return 1
    if restorable:
        set_priority_all_threads(0)
    # What `ps` and the supervisor's leftover check see: the cold worker's command line.
    try:
        from setproctitle import setproctitle
    except ImportError:  # pragma: no cover - a declared dependency; the title is cosmetic
        print("rlsup spare: setproctitle is missing: ps shows --standby", file=sys.stderr)
    else:
        setproctitle(" ".join([sys.executable, "-P", "-m", "training.worker", *argv]))
    sys.argv = [sys.argv[0], *argv]
    return entry.main(argv, start={"served": "spare", "assigned": assigned})
