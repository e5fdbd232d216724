"""`rlsup dashboard [--port N] [--listen HOST] [--token-file PATH]`: a read-only web page.

Serves `supervisor.observe.dashboard`'s page and API (each game's state, updated in place every
2 s; the results table; each sweep's ranked trials, best so far and value per parameter; cost;
recent events as sentences; one chart per game of a metric picked from a list, its variants
overlaid and each variant's seeds with their mean and band, with reboots, crashes, hangs and
mode changes marked) from the state directory alone: it reads the database read-only, so it
works whether or not the supervisor runs and never slows it.

Listens on 127.0.0.1 (port 8765 by default; `--port 0` picks a free one) and prints the URL.
`--listen HOST` names another address; anywhere but loopback it needs a token: `--token-file
PATH` (a private file, mode 0600, of at least 16 characters), else one generated into
`<state_dir>/dashboard.token` (0600; kept and reused). With a token every request must carry it
(`?token=` or `Authorization: Bearer`). SIGINT/SIGTERM stop it (exit 0). Exit 2: bad usage or
configuration, or a token that cannot be had; 1: the address cannot be bound.
"""

from __future__ import annotations

import argparse
import contextlib
import ipaddress
import os
import re
import secrets
import signal
import stat
import sys
import threading
from pathlib import Path
from types import FrameType
from typing import Any

from supervisor.commands._common import (
    EXIT_FAIL,
    EXIT_OK,
    EXIT_USAGE,
    add_config_argument,
    load_config_or_exit,
)

DEFAULT_PORT = 8765
DEFAULT_LISTEN = "127.0.0.1"
TOKEN_FILE = "dashboard.token"
MIN_TOKEN_CHARS = 16
_TOKEN_RE = re.compile(r"[A-Za-z0-9._~+/=-]+")


def register(subparsers: Any) -> None:
    p = subparsers.add_parser(
        "dashboard",
        help="a read-only web page: games, curves of any metric with incidents, results, "
        "sweeps, events, cost",
        description="Serve a read-only dashboard of the state directory on 127.0.0.1 "
        "(works whether or not the supervisor runs).",
    )
    add_config_argument(p)
    p.add_argument(
        "--port",
        type=int,
        default=DEFAULT_PORT,
        metavar="N",
        help=f"TCP port (default {DEFAULT_PORT}; 0: a free one, printed)",
    )
    p.add_argument(
        "--listen",
        metavar="HOST",
        default=DEFAULT_LISTEN,
        help="address to listen on (default 127.0.0.1); any other than loopback needs a token",
    )
    p.add_argument(
        "--token-file",
        metavar="PATH",
        default=None,
        help="require the token in PATH (mode 0600) on every request; with a non-loopback "
        f"--listen and no --token-file, one is generated into <state_dir>/{TOKEN_FILE}",
    )
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    cfg = load_config_or_exit(args)
    if not 0 <= args.port <= 65535:
        return _usage(f"--port {args.port}: expected 0..65535")
    listen = str(args.listen).strip()
    if listen.startswith("[") and listen.endswith("]"):
        listen = listen[1:-1]
    if not listen:
        return _usage("--listen: expected an address")
    try:
        if args.token_file:
            token: str | None = read_token_file(Path(args.token_file))
        elif not is_loopback(listen):
            token = ensure_token(cfg.state_dir / TOKEN_FILE)
        else:
            token = None
    except TokenError as exc:
        return _usage(str(exc))

    from supervisor.observe.dashboard import Dashboard
    from supervisor.observe.metrics import start_bounded_wsgi

    app = Dashboard(cfg, token=token, allowed_hosts=(listen, f"[{listen}]"))
    try:
        server = start_bounded_wsgi(listen, args.port, app, "rlsup-dashboard-http")
    except (OSError, OverflowError) as exc:
        reason = getattr(exc, "strerror", None) or exc
        print(f"rlsup dashboard: cannot listen on {listen}:{args.port}: {reason}", file=sys.stderr)
        return EXIT_FAIL
    port = int(server.server_address[1])
    shown = f"[{listen}]" if ":" in listen else listen
    print(f"rlsup dashboard: http://{shown}:{port}/", flush=True)
    how = (
        f"every request needs the token in {args.token_file or cfg.state_dir / TOKEN_FILE} "
        "(?token=... or Authorization: Bearer ...)"
        if token
        else "loopback only, no token"
    )
    print(f"  serving {cfg.state_dir} read-only; {how}; Ctrl-C stops", flush=True)

    stop = threading.Event()

    def on_signal(signum: int, frame: FrameType | None) -> None:
        stop.set()

    previous = {s: signal.signal(s, on_signal) for s in (signal.SIGINT, signal.SIGTERM)}
    try:
        while not stop.wait(1.0):
            pass
    finally:
        server.stop()
        for s, handler in previous.items():
            signal.signal(s, handler)
    print("rlsup dashboard: stopped", flush=True)
    return EXIT_OK


class TokenError(Exception):
    pass


def is_loopback(host: str) -> bool:
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False  # a host name: whatever it resolves to, not loopback by name


def _check_token(text: str, where: Path) -> str:
    token = text.strip()
    if len(token) < MIN_TOKEN_CHARS or not _TOKEN_RE.fullmatch(token):
        raise TokenError(
            f"the token in {where} must be at least {MIN_TOKEN_CHARS} characters of "
            "[A-Za-z0-9._~+/=-] (e.g. from "
            "`python3 -c 'import secrets; print(secrets.token_urlsafe())'`)"
        )
    return token


def _read_private(path: Path) -> str:
    """The file's text, refusing a symlink or a file that others can read."""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC)
    except OSError as exc:
        raise TokenError(f"cannot read the token file {path}: {exc.strerror or exc}") from None
    with os.fdopen(fd, "r", encoding="utf-8", errors="replace") as f:
        st = os.fstat(f.fileno())
        if not stat.S_ISREG(st.st_mode):
            raise TokenError(f"the token file {path} is not a regular file")
        if st.st_mode & 0o077:
            raise TokenError(
                f"the token file {path} is readable by others (mode "
                f"{stat.S_IMODE(st.st_mode):04o}); chmod 600 it"
            )
        return f.read(4096)


def read_token_file(path: Path) -> str:
    return _check_token(_read_private(path), path)


def ensure_token(path: Path) -> str:
    """The token in `path` (the state dir's), created 0600 with a new random one if absent."""
    if not path.parent.is_dir():
        raise TokenError(
            f"a non-loopback --listen needs a token, and the state directory {path.parent} "
            "does not exist to keep one in: pass --token-file PATH"
        )
    token = secrets.token_urlsafe(32)
    flags = os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC
    try:
        fd = os.open(path, flags, 0o600)
    except FileExistsError:
        return read_token_file(path)
    except OSError as exc:
        raise TokenError(
            f"a non-loopback --listen needs a token and {path} cannot be created "
            f"({exc.strerror or exc}): pass --token-file PATH"
        ) from None
    try:
        with os.fdopen(fd, "w") as f:
            f.write(token + "\n")
    except OSError as exc:
        with contextlib.suppress(OSError):
            path.unlink()
        raise TokenError(f"cannot write {path}: {exc.strerror or exc}") from None
    return token


def _usage(message: str) -> int:
    print(f"rlsup dashboard: {message}", file=sys.stderr)
    return EXIT_USAGE
