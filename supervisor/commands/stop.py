"""`rlsup stop [--timeout S]`: SIGTERM the running supervisor and wait for it to go."""

from __future__ import annotations

import argparse
import os
import signal
import sqlite3
import sys
import time
from pathlib import Path
from typing import Any

import psutil  # type: ignore[import-untyped]

from supervisor.commands._common import EXIT_FAIL, EXIT_OK, add_config_argument, load_config_or_exit


def register(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    p = sub.add_parser(
        "stop",
        help="stop the running supervisor gracefully",
        description="Send SIGTERM to the supervisor recorded in the state "
        "database (pid and create time verified) and wait until it is gone.",
    )
    add_config_argument(p)
    p.add_argument(
        "--timeout",
        type=float,
        default=None,
        metavar="S",
        help="seconds to wait (default: stop_grace_s + 30)",
    )
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    cfg = load_config_or_exit(args)
    from supervisor.ledger import db

    timeout = args.timeout if args.timeout is not None else cfg.stop_grace_s + 30
    try:
        conn = db.connect(cfg.state_dir, create=False)
    except FileNotFoundError:
        print(f"rlsup stop: no supervisor is running (no state database in {cfg.state_dir})")
        return EXIT_OK
    row = db.supervisor_row(conn)
    conn.close()
    proc = _live_supervisor(row)
    if proc is None:
        print(f"rlsup stop: no supervisor is running for {cfg.state_dir}")
        return EXIT_OK
    how = _ask_to_stop(cfg.state_dir, proc)
    if how is None:
        return EXIT_FAIL
    unit = (row or {}).get("systemd_unit")
    print(
        f"rlsup stop: asked the supervisor (pid {proc.pid}) to stop ({how}); "
        f"waiting up to {timeout:g} s for its workers to checkpoint"
    )
    deadline = time.monotonic() + timeout
    next_print = time.monotonic() + 5
    while time.monotonic() < deadline:
        if not _alive(proc):
            print(f"rlsup stop: supervisor (pid {proc.pid}) stopped")
            if unit:
                print(
                    f"rlsup stop: it ran as the systemd unit {unit}, which does not restart a "
                    f"clean stop (Restart=on-failure): the unit is inactive now and starts "
                    f"again at boot (`systemctl disable {unit}` to prevent that, `systemctl "
                    f"start {unit}` to start it now)"
                )
            return EXIT_OK
        time.sleep(0.2)
        if time.monotonic() >= next_print:
            left = deadline - time.monotonic()
            print(f"rlsup stop: still stopping (pid {proc.pid}), {left:.0f} s left", flush=True)
            next_print += 5
    print(
        f"rlsup stop: timed out after {timeout:g} s; the supervisor (pid {proc.pid}) "
        "is still running",
        file=sys.stderr,
    )
    return EXIT_FAIL


def _ask_to_stop(state_dir: Path, proc: psutil.Process) -> str | None:
    """SIGTERM when we may signal it; else (an operator in the service's group, the service
    running as its own user) a stop request in the state database, which it reads each tick.
    None, after saying why, when neither is allowed."""
    from supervisor.ledger import db

    try:
        proc.send_signal(signal.SIGTERM)
        return "SIGTERM"
    except psutil.AccessDenied:
        pass
    me = f"uid {os.getuid()} ({os.environ.get('USER', '?')}), pid {os.getpid()}"
    try:
        conn = db.connect(state_dir, create=False)
        try:
            with db.transaction(conn):
                db.request(conn, db.STOP_REQUEST, me, time.time())
        finally:
            conn.close()
    except (OSError, sqlite3.Error) as exc:
        print(
            f"rlsup stop: may neither signal the supervisor (pid {proc.pid}) nor write a stop "
            f"request into {state_dir / db.DB_NAME}: {exc}; ask its owner, or "
            "`sudo systemctl stop rlsup`",
            file=sys.stderr,
        )
        return None
    return "a stop request in the state database"


def _alive(proc: psutil.Process) -> bool:
    """False once it is gone, or a zombie its parent has not reaped yet (it has exited)."""
    try:
        return bool(proc.status() != psutil.STATUS_ZOMBIE)
    except psutil.NoSuchProcess:
        return False


def _live_supervisor(row: dict[str, Any] | None) -> psutil.Process | None:
    """The recorded supervisor, if that very process (same create time) still runs."""
    if not row or not row.get("pid") or row.get("state") != "running":
        return None
    from supervisor.launch.process import same_process

    if not same_process(row["pid"], row.get("pid_start_ticks"), row.get("pid_create_time") or 0):
        return None
    try:
        proc = psutil.Process(row["pid"])
        if proc.pid == os.getpid() or not _alive(proc):
            return None
        return proc
    except psutil.Error:
        return None
