"""[[hooks]]: a program run on each event of some kinds (the observe wing's alert hooks).
Whether each program exists is a service check (service_checks.resolve_hook_programs)."""

from __future__ import annotations

import re
from collections.abc import Collection
from dataclasses import dataclass
from typing import Any

from supervisor.config.fields import NUMBER, ConfigSource, Field, read_table

# Where a bare hook program is looked up: systemd's PATH for services, the same for every
# caller (an operator's shell PATH says nothing about the service's).
HOOK_PROGRAM_PATH = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"


@dataclass(frozen=True)
class HookSpec:
    """One [[hooks]] table: run `command` (an argv, no shell) on each event of the kinds `on`,
    the event as one JSON object on stdin."""

    on: tuple[str, ...]
    command: tuple[str, ...]
    timeout_s: float = 30.0
    games: tuple[str, ...] = ()  # only these games' events (and host-wide ones); () = all
    pass_env: tuple[str, ...] = ()  # more of the service's environment variables it gets
    program: str = ""  # command[0] resolved to a path once (resolve_hook_programs); "" = not


HOOK_FIELDS: dict[str, Field] = {
    "on": (
        (list,),
        None,
        lambda v: bool(v) and all(isinstance(k, str) for k in v),
        "a non-empty list of event kinds (as `rlsup events` names them)",
    ),
    "command": (
        (list,),
        None,
        lambda v: bool(v) and all(isinstance(a, str) and a for a in v),
        'an argv list of strings, e.g. ["/usr/local/bin/notify", "--urgent"] (no shell)',
    ),
    "timeout_s": (NUMBER, 30.0, lambda v: 0 < v <= 3600, "seconds in (0, 3600]"),
    "games": (
        (list,),
        [],
        lambda v: all(isinstance(g, str) for g in v),
        "a list of game names",
    ),
    "pass_env": (
        (list,),
        [],
        lambda v: all(isinstance(k, str) and re.fullmatch(r"[A-Za-z_][A-Za-z0-9_]*", k) for k in v),
        'a list of environment variable names, e.g. ["SLACK_TOKEN"]',
    ),
}


def parse_hooks(ctx: ConfigSource, data: Any, game_names: Collection[str]) -> tuple[HookSpec, ...]:
    """The [[hooks]] tables; `game_names`: the configured games (runs) a hook may name."""
    if not isinstance(data, list):
        raise ctx.fail(["hooks"], "expected [[hooks]] tables (an array of tables)")
    from supervisor.ledger.schema import EVENT_KINDS  # the contract's event kinds

    hooks: list[HookSpec] = []
    for i, table in enumerate(data):
        v = read_table(ctx, ["hooks", i], table, HOOK_FIELDS)
        for kind in v["on"]:
            if kind not in EVENT_KINDS and kind != "*":
                import difflib  # a misspelt kind's message only

                close = difflib.get_close_matches(kind, sorted(EVENT_KINDS), n=3)
                hint = f"; did you mean {', '.join(close)}?" if close else ""
                raise ctx.fail(
                    ["hooks", i, "on"],
                    f"unknown event kind {kind!r}{hint} (`rlsup events --help` lists them; "
                    '"*" matches every kind)',
                )
        for game in v["games"]:
            if game not in game_names:
                raise ctx.fail(
                    ["hooks", i, "games"],
                    f"unknown game {game!r}; configured: {', '.join(sorted(game_names))}",
                )
        # Whether the program exists is resolve_hook_programs' question, asked by `run`,
        # `check-config` and a reload only: a read-only command never fails on a hook.
        hooks.append(
            HookSpec(
                tuple(v["on"]),
                tuple(v["command"]),
                v["timeout_s"],
                tuple(v["games"]),
                pass_env=tuple(v["pass_env"]),
            )
        )
    return tuple(hooks)
