"""The field parsers every table of the file shares (supervisord's `datatypes.py` beside its
`options.py`): a field's types, default, check and expectation, a table read against its fields,
and `ConfigError` messages that name the file, the line (when it can be found) and the key, the
value found and what was expected.
"""

from __future__ import annotations

import math
import re
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any


class ConfigError(Exception):
    """A bad configuration file; str() is the whole message for the operator."""


NUMBER = (int, float)

# key -> (python types, default (None = required), check, expectation text)
Field = tuple[tuple[type, ...], Any, Callable[[Any], bool] | None, str]


def positive(v: Any) -> bool:
    return bool(v > 0)


def non_negative(v: Any) -> bool:
    return bool(v >= 0)


class ConfigSource:
    """Builds error messages that point at the file, line and key."""

    def __init__(self, path: Path, text: str) -> None:
        self.path = path
        self.lines = text.splitlines()

    def fail(self, where: list[str | int], message: str) -> ConfigError:
        line = _locate(self.lines, where)
        at = f"line {line}: " if line else ""
        return ConfigError(f"{self.path}: {at}{_dotted(where)}: {message}")


def _dotted(where: list[str | int]) -> str:
    out = ""
    for part in where:
        out += f"[{part}]" if isinstance(part, int) else (("." if out else "") + part)
    return out


def _locate(lines: list[str], where: list[str | int]) -> int | None:
    """Best-effort line number of a key path such as ['games', 1, 'env_id']."""
    table: list[str | int] = []
    counts: dict[str, int] = {}
    best: int | None = None
    for no, raw in enumerate(lines, 1):
        line = raw.split("#", 1)[0].strip()
        if m := re.fullmatch(r"\[\[\s*([^\]]+?)\s*\]\]", line):
            name = m.group(1)
            counts[name] = counts.get(name, -1) + 1
            table = [*name.split("."), counts[name]]
        elif m := re.fullmatch(r"\[\s*([^\]]+?)\s*\]", line):
            table = list(m.group(1).split("."))
        else:
            m = re.match(r"([A-Za-z0-9_\-\"]+)\s*=", line)
            if m and [*table, m.group(1).strip('"')] == where[: len(table) + 1]:
                return no
            continue
        if table == where[: len(table)]:
            best = no
    return best


def read_or_empty(path: Path) -> str:
    """The file's text for error messages' line numbers; "" when it cannot be read (again)."""
    try:
        return path.read_text(encoding="utf-8")
    except OSError:
        return ""


def check_keys(
    ctx: ConfigSource, where: list[str | int], data: Mapping[str, Any], known: Mapping[str, Any]
) -> None:
    for key in data:
        if key not in known:
            import difflib  # a misspelt key's message only: not on every load (rlsup status)

            close = difflib.get_close_matches(key, list(known), n=3, cutoff=0.6)
            hint = f"; did you mean {', '.join(close)}?" if close else ""
            raise ctx.fail([*where, key], f"unknown key{hint} (known: {', '.join(known)})")


def read_table(
    ctx: ConfigSource, where: list[str | int], data: Any, fields: Mapping[str, Field]
) -> dict[str, Any]:
    """One table's values by its fields: unknown keys refused, defaults filled in, each value
    of its types (a bool is no number), finite and passing its check; numbers as floats."""
    if not isinstance(data, dict):
        raise ctx.fail(where, f"expected a table, got {data!r}")
    check_keys(ctx, where, data, fields)
    out: dict[str, Any] = {}
    for key, (types, default, check, expect) in fields.items():
        if key not in data:
            if default is None:
                raise ctx.fail([*where, key], f"missing; expected {expect}")
            out[key] = default
            continue
        value = data[key]
        ok = isinstance(value, types) and (bool in types or not isinstance(value, bool))
        if ok and isinstance(value, float) and not math.isfinite(value):
            raise ctx.fail([*where, key], f"got {value!r}; expected a finite number ({expect})")
        if ok and check is not None:
            try:
                ok = bool(check(value))
            except TypeError:
                ok = False
        if not ok:
            raise ctx.fail([*where, key], f"got {value!r}; expected {expect}")
        out[key] = float(value) if types == NUMBER else value
    return out
