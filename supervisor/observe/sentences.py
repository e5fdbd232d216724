"""Events as sentences, for people: what happened to which game, and why.

`pong crashed (exit 137: SIGKILL) at step 12,288; its last checkpoint was step 12,032`.

An event's detail is the supervisor's JSON (any version's: a key may be missing or of another
type), so every value is checked before it is used and an event of a kind not known here still
reads as a sentence (its kind in words, and its reason or message when it has one). The raw
detail stays the contract (`rlsup events --json`, `/api/events`); this is only its reading.
Stdlib only.
"""

from __future__ import annotations

import math
import signal
from collections.abc import Iterable
from typing import Any

MAX_TEXT = 240  # a message is cut here (a traceback's first line is enough)
NEAR_S = 5.0  # a crash and its worker_exit are recorded together: within this


def sentences(events: Iterable[dict[str, Any]]) -> list[str]:
    """One sentence per event (oldest first, as given): a crash or a restart also says the
    step and the checkpoint its worker's exit reported just before."""
    last_exit: dict[str, dict[str, Any]] = {}
    out = []
    for e in events:
        game = e.get("game")
        detail = _dict(e.get("detail"))
        if e.get("kind") == "worker_exit" and isinstance(game, str):
            last_exit[game] = {"ts": e.get("ts"), **detail}
        out.append(sentence(e, last_exit.get(game) if isinstance(game, str) else None))
    return out


def sentence(e: dict[str, Any], exit_detail: dict[str, Any] | None = None) -> str:
    """The event as a sentence; `exit_detail`: the detail of its game's latest worker_exit."""
    kind = str(e.get("kind") or "event")
    d = _dict(e.get("detail"))
    who = str(e.get("game")) if e.get("game") else "the host"
    fn = _KINDS.get(kind)
    return fn(who, d, _near(e, exit_detail)) if fn else _generic(who, kind, d)


def _near(e: dict[str, Any], exit_detail: dict[str, Any] | None) -> dict[str, Any]:
    """The worker_exit's detail when it belongs to this event: a crash recorded with it (within
    NEAR_S), or the restart that followed it (however long its backoff); else {}."""
    if not exit_detail:
        return {}
    if e.get("kind") == "restart":
        return exit_detail
    ts, at = _num(e.get("ts")), _num(exit_detail.get("ts"))
    return exit_detail if ts is not None and at is not None and abs(ts - at) <= NEAR_S else {}


def _dict(v: Any) -> dict[str, Any]:
    return v if isinstance(v, dict) else {}


def _int(v: Any) -> int | None:
    if isinstance(v, bool) or not isinstance(v, int | float):
        return None
    if isinstance(v, float) and not math.isfinite(v):
        return None
    return int(v)


def _num(v: Any) -> float | None:
    if isinstance(v, bool) or not isinstance(v, int | float):
        return None
    return float(v) if math.isfinite(v) else None


def _text(v: Any) -> str | None:
    if not isinstance(v, str) or not v.strip():
        return None
    line = v.strip().splitlines()[0]
    return line if len(line) <= MAX_TEXT else line[: MAX_TEXT - 1] + "…"


def _steps(n: int) -> str:
    return f"{n:,}"


def _duration(s: float) -> str:
    s = round(s)
    if s < 120:
        return f"{s} s"
    if s < 7200:
        return f"{s // 60} min"
    return f"{s / 3600:.1f} h"


def exit_status(rc: Any) -> str | None:
    """`exit 137: SIGKILL`, `killed by SIGKILL`, `exit 1`."""
    code = _int(rc)
    if code is None:
        return None
    if code < 0:
        return f"killed by {_signame(-code)}"
    if code > 128 and _signame(code - 128, None):
        return f"exit {code}: {_signame(code - 128)}"
    return f"exit {code}"


def _signame(n: int, default: str | None = "") -> str:
    try:
        return signal.Signals(n).name
    except ValueError:
        return f"signal {n}" if default == "" else (default or "")


def _at(d: dict[str, Any], ex: dict[str, Any]) -> str:
    """` at step 12,288; its last checkpoint was step 12,032` from the detail or its exit's."""
    step = _int(d.get("global_step"))
    step = _int(ex.get("global_step")) if step is None else step
    ckpt = _int(d.get("last_checkpoint_step"))
    ckpt = _int(ex.get("last_checkpoint_step")) if ckpt is None else ckpt
    out = f" at step {_steps(step)}" if step is not None else ""
    if ckpt is not None:
        out += f"; its last checkpoint was step {_steps(ckpt)}"
    return out


def _why(d: dict[str, Any]) -> str:
    for key in ("reason", "message", "error_kind"):
        t = _text(d.get(key))
        if t:
            return t
    return ""


def _crash(who: str, d: dict[str, Any], ex: dict[str, Any], what: str) -> str:
    status = exit_status(d.get("returncode")) or _text(d.get("description"))
    msg = _text(d.get("message"))
    kernel = " (the kernel's OOM killer)" if d.get("kernel_oom") is True else ""
    by_us = " (stopped by the supervisor)" if d.get("killed_by_supervisor") is True else ""
    inner = "; ".join(p for p in (status, msg) if p)
    return f"{who} {what}{kernel}{by_us}" + (f" ({inner})" if inner else "") + _at(d, ex)


def _exit(who: str, d: dict[str, Any], ex: dict[str, Any]) -> str:
    kind = str(d.get("exit") or "")
    words = {
        "done": "finished its steps",
        "stopped": "stopped after a checkpoint",
        "oom": "ran out of memory",
        "config_error": "exited with a configuration error",
        "crash": "crashed",
        "killed_by_signal": "was killed",
        "host_lost": "lost its host",
        "fenced": "was fenced (placed elsewhere since)",
        "start_lost": "lost its start (the spare died first)",
    }.get(kind, "exited")
    status = exit_status(d.get("returncode"))
    up = _num(d.get("uptime_s"))
    tail = f" after {_duration(up)}" if up is not None else ""
    if status and status.startswith("killed by"):
        words, status = f"was {status}", None
    return f"{who}'s worker {words}" + (f" ({status})" if status else "") + tail + _at(d, {})


def _restart(who: str, d: dict[str, Any], ex: dict[str, Any]) -> str:
    n = _int(d.get("restarts"))
    ckpt = _int(ex.get("last_checkpoint_step"))
    out = f"{who} was restarted" + (f" (restart {n})" if n else "")
    if ckpt is not None:
        out += f", resuming from its last checkpoint, step {_steps(ckpt)}"
    if d.get("served") == "spare":
        out += ", on the pre-warmed spare"
    return out


def _start(who: str, d: dict[str, Any], ex: dict[str, Any]) -> str:
    mode = _text(d.get("mode"))
    spare = " on the pre-warmed spare" if d.get("served") == "spare" else ""
    return f"{who} started" + (f" in mode {mode}" if mode else "") + spare


def _backoff(who: str, d: dict[str, Any], ex: dict[str, Any]) -> str:
    delay = _num(d.get("delay_s"))
    n, budget = _int(d.get("failures")), _int(d.get("budget"))
    wait = f"restarts in {_duration(delay)}" if delay else "restarts at once"
    count = f", {n} failure(s) of a budget of {budget}" if n is not None and budget else ""
    why = _why(d)
    return f"{who} {wait}{count}" + (f": {why}" if why else "")


def _fatal(who: str, d: dict[str, Any], ex: dict[str, Any]) -> str:
    return f"{who} gave up for good (FATAL)" + (f": {_why(d)}" if _why(d) else "")


def _done(who: str, d: dict[str, Any], ex: dict[str, Any]) -> str:
    return f"{who} finished"


def _hang(who: str, d: dict[str, Any], ex: dict[str, Any]) -> str:
    phase = _text(d.get("phase"))
    step = _int(d.get("global_step"))
    where = (f" in {phase}" if phase else "") + (f" at step {_steps(step)}" if step else "")
    why = _why(d)
    return f"{who} hung{where} and is stopped" + (f": {why}" if why else "")


def _evaluation(who: str, d: dict[str, Any], ex: dict[str, Any]) -> str:
    step, mean, eps = _int(d.get("step")), _num(d.get("mean")), _int(d.get("episodes"))
    out = f"{who} was evaluated"
    out += f" at step {_steps(step)}" if step is not None else ""
    out += f": mean return {mean:,.2f}" if mean is not None else ""
    return out + (f" over {eps} episodes" if eps else "")


def _mode(who: str, d: dict[str, Any], ex: dict[str, Any]) -> str:
    old, new = _text(d.get("from")), _text(d.get("to"))
    scope = "every game" if who == "the host" else who
    reasons = d.get("reasons")
    why = "; ".join(r for r in reasons if isinstance(r, str)) if isinstance(reasons, list) else ""
    why = why or _why(d)
    return f"{scope} went from mode {old or '?'} to {new or '?'}" + (f": {why}" if why else "")


def _pinned(who: str, d: dict[str, Any], ex: dict[str, Any]) -> str:
    mode = _text(d.get("mode"))
    scope = "every game" if who == "the host" else who
    if d.get("pinned") is False:
        return f"{scope}: the mode is handed back to the policy"
    return f"an operator pinned {scope} to mode {mode or '?'}"


def _reboot(who: str, d: dict[str, Any], ex: dict[str, Any]) -> str:
    down = _num(d.get("downtime_s"))
    return "the host rebooted unexpectedly" + (f" (down {_duration(down)})" if down else "")


def _sup_start(who: str, d: dict[str, Any], ex: dict[str, Any]) -> str:
    pid = _int(d.get("pid"))
    return "the supervisor started" + (f" (pid {pid})" if pid else "")


def _sup_stop(who: str, d: dict[str, Any], ex: dict[str, Any]) -> str:
    return "the supervisor stopped" + (" cleanly" if d.get("clean") is True else "")


def _checkpoint(what: str) -> Any:
    def f(who: str, d: dict[str, Any], ex: dict[str, Any]) -> str:
        why = _why(d)
        return f"{who}: {what}" + (f": {why}" if why else "")

    return f


def _sweep_trial(who: str, d: dict[str, Any], ex: dict[str, Any]) -> str:
    sweep, trial, state = _text(d.get("sweep")), _int(d.get("trial")), _text(d.get("state"))
    out = f"sweep {sweep}: trial {trial} ended {state}"
    value = _num(d.get("value"))
    out += f" with value {value:,.2f}" if value is not None else ""
    why = _text(d.get("message"))
    return out + (f" ({why})" if why else "")


def _generic(who: str, kind: str, d: dict[str, Any]) -> str:
    why = _why(d)
    return f"{who}: {kind.replace('_', ' ')}" + (f": {why}" if why else "")


_KINDS: dict[str, Any] = {
    "worker_crash": lambda w, d, ex: _crash(w, d, ex, "crashed"),
    "worker_oom": lambda w, d, ex: _crash(w, d, ex, "ran out of memory"),
    "worker_exit": _exit,
    "restart": _restart,
    "worker_start": _start,
    "backoff": _backoff,
    "fatal": _fatal,
    "game_done": _done,
    "worker_hang": _hang,
    "evaluation": _evaluation,
    "sweep_trial": _sweep_trial,
    "scale_down": _mode,
    "scale_up": _mode,
    "mode_pinned": _pinned,
    "host_reboot": _reboot,
    "supervisor_start": _sup_start,
    "supervisor_stop": _sup_stop,
    "checkpoint_failed": _checkpoint("a checkpoint failed"),
    "checkpoint_sync_fallback": _checkpoint(
        "a checkpoint was taken synchronously: a background one would not fit in memory"
    ),
    "checkpoint_corrupt": _checkpoint("a corrupt checkpoint was set aside"),
    "checkpoint_unreadable": _checkpoint("a checkpoint could not be read"),
}
