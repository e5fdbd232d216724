"""Will a command game's program start, and can its Python import the SDK? Asked once per
distinct command by `rlsup check-config` and `rlsup run` (docs/own-trainer.md), never by a
read-only command: the first-day trap is a `command = ["python", "train.py"]` that names an
interpreter without rlsup's SDK on its path, or none at all on the service's PATH.

Each finding says what is wrong and how to fix it. An error is a game that cannot start (its
program is missing, or its script imports rlsup and this interpreter cannot); a warning is one
that may not do what the operator thinks (another `python` under systemd's PATH)."""

from __future__ import annotations

import dataclasses
import json
import os
import re
import shutil
import subprocess
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path

from supervisor.config import HOOK_PROGRAM_PATH, Config, GameSpec

PROJECT_ROOT = Path(__file__).resolve().parent.parent.parent
PROBE_TIMEOUT_S = 20.0
# What a command's first word is when it is a Python interpreter (python, python3.11, pypy3).
_PYTHON = re.compile(r"(python|pypy)[0-9.]*")
# Run in the game's interpreter: its version, and `import rlsup` (the SDK's whole closure).
_PROBE = """\
import json, sys
out = {"version": ".".join(map(str, sys.version_info[:3])), "executable": sys.executable}
try:
    import rlsup
    out["rlsup"] = "ok"
    out["rlsup_file"] = getattr(rlsup, "__file__", "")
except BaseException as exc:
    out["rlsup"] = f"{type(exc).__name__}: {exc}"
print("RLSUP-PROBE " + json.dumps(out))
"""
_IMPORTS_SDK = re.compile(r"^\s*(import\s+rlsup\b|from\s+rlsup\b)", re.MULTILINE)


@dataclass(frozen=True)
class Finding:
    """One thing a command game's start would trip on."""

    game: str
    error: bool  # it cannot start (or cannot use the SDK it imports); else a warning
    message: str  # what is wrong, and how to fix it

    def line(self) -> str:
        return f"{'error' if self.error else 'warning'}: game {self.game}: {self.message}"


def probe_command_games(
    cfg: Config, environ: Mapping[str, str] | None = None, timeout_s: float = PROBE_TIMEOUT_S
) -> list[Finding]:
    """Findings for every command game of `cfg`, each distinct command probed once (the seeds
    of one game share it). `environ`: the supervisor's environment (default: this process's)."""
    base = dict(os.environ if environ is None else environ)
    findings: list[Finding] = []
    seen: set[tuple[object, ...]] = set()
    for spec in cfg.games:
        if spec.command is None:
            continue
        key = (spec.command, spec.cwd, spec.env)
        if key in seen:
            continue
        seen.add(key)
        found = probe_game(cfg, spec, base, timeout_s)
        if cfg.cluster.backend == "ray":  # the program runs on a host of the cluster
            found = [dataclasses.replace(f, message=f"{f.message} (checked on this host, the "
                     "supervisor's; each Ray host is checked again when the game is placed "
                     "there)") for f in found]  # fmt: skip
        findings.extend(found)
    return findings


def child_env(base: Mapping[str, str], spec: GameSpec) -> dict[str, str]:
    """The environment a command game's program sees, as far as finding programs and modules
    goes (the supervisor's, the game's `env`, and rlsup's checkout on PYTHONPATH)."""
    env = {**base, **dict(spec.env)}
    env["PYTHONPATH"] = os.pathsep.join(
        p for p in (str(PROJECT_ROOT), env.get("PYTHONPATH", "")) if p
    )
    return env


def probe_game(
    cfg: Config, spec: GameSpec, base: Mapping[str, str], timeout_s: float = PROBE_TIMEOUT_S
) -> list[Finding]:
    assert spec.command is not None
    name = spec.name.split("/")[0]
    env = child_env(base, spec)
    cwd = _cwd(cfg, spec)
    prog = spec.command[0]
    path, problem = resolve_program(prog, cwd, env.get("PATH", os.defpath))
    if problem:
        return [Finding(name, True, problem)]
    findings = []
    under_systemd = bool(base.get("INVOCATION_ID"))
    if "/" not in prog and not under_systemd:
        findings.extend(_service_path_warning(name, prog, path))
    if _PYTHON.fullmatch(os.path.basename(path)):
        findings.extend(_probe_python(name, spec, path, cwd, env, timeout_s))
    return findings


def resolve_program(prog: str, cwd: Path, search_path: str) -> tuple[str, str]:
    """(the program's path, "") as the spawn will find it (a bare name on PATH, a relative
    path from the game's cwd), or ("", what is wrong and how to fix it)."""
    if "/" not in prog:
        found = shutil.which(prog, path=search_path)
        if found is None:
            return "", (
                f"command[0] {prog!r} is not on the PATH the game gets ({search_path}): give "
                "its absolute path, e.g. the `python` of the virtual environment your script "
                "needs (`which python` with it active)"
            )
        return found, ""
    path = Path(prog) if os.path.isabs(prog) else cwd / prog
    if not path.exists():
        return "", f"command[0] {prog!r}: no such file ({path})"
    if not path.is_file() or not os.access(path, os.X_OK):
        return "", f"command[0] {prog!r}: not an executable file ({path})"
    return str(path), ""


def _service_path_warning(name: str, prog: str, here: str) -> list[Finding]:
    """A bare program name means whatever the PATH finds: under systemd that is its own
    PATH, not the operator's shell's, and another (or no) interpreter."""
    there = shutil.which(prog, path=HOOK_PROGRAM_PATH)
    if there is not None and os.path.realpath(there) == os.path.realpath(here):
        return []
    under = f"{there}" if there else "nothing"
    return [
        Finding(
            name,
            False,
            f"command[0] {prog!r} is {here} here, but under the systemd service (PATH "
            f"{HOOK_PROGRAM_PATH}) it is {under}: give the absolute path, "
            f'command = ["{here}", ...], so both run the same program',
        )
    ]


def _cwd(cfg: Config, spec: GameSpec) -> Path:
    if spec.cwd:
        return Path(spec.cwd)
    run_dir = cfg.run_dir(spec.name)
    return run_dir if run_dir.is_dir() else cfg.path.parent


def _probe_python(
    name: str, spec: GameSpec, python: str, cwd: Path, env: dict[str, str], timeout_s: float
) -> list[Finding]:
    uses_sdk = _script_imports_sdk(spec, cwd) or spec.heartbeat or bool(spec.knobs)
    try:
        done = subprocess.run(
            [python, "-c", _PROBE],
            cwd=cwd if cwd.is_dir() else None,
            env=env,
            stdin=subprocess.DEVNULL,
            capture_output=True,
            timeout=timeout_s,
            check=False,
        )
    except subprocess.TimeoutExpired:
        return [Finding(name, False, f"{python} did not answer within {timeout_s:g} s")]
    except OSError as exc:
        return [Finding(name, True, f"{python} cannot be started: {exc}")]
    report = _report(done.stdout)
    if report is None:
        tail = done.stderr.decode("utf-8", "replace").strip().splitlines()[-1:]
        why = tail[0] if tail else f"exit status {done.returncode}"
        return [Finding(name, True, f"{python} fails to start in {cwd}: {why}")]
    if report.get("rlsup") == "ok":
        return []
    message = (
        f"{python} (Python {report.get('version')}) cannot `import rlsup`: "
        f"{report.get('rlsup')}. {_fix(report)}"
    )
    return [Finding(name, uses_sdk, message if uses_sdk else message + " (if it uses the SDK)")]


def _fix(report: dict[str, object]) -> str:
    version = str(report.get("version", ""))
    parts = version.split(".")
    digits = len(parts) >= 2 and parts[0].isdigit() and parts[1].isdigit()
    if digits and (int(parts[0]), int(parts[1])) < (3, 11):
        return "rlsup's SDK needs Python >= 3.11: point `command` at a newer interpreter"
    return (
        "The SDK needs only the standard library (numpy for arrays) and finds itself through "
        f"PYTHONPATH={PROJECT_ROOT}: is something in the game's `env` or `cwd` shadowing it?"
    )


def _report(stdout: bytes) -> dict[str, object] | None:
    for line in stdout.decode("utf-8", "replace").splitlines():
        if line.startswith("RLSUP-PROBE "):
            try:
                value = json.loads(line[len("RLSUP-PROBE ") :])
            except ValueError:
                return None
            return value if isinstance(value, dict) else None
    return None


def _script_imports_sdk(spec: GameSpec, cwd: Path) -> bool:
    """Does the script the command runs (its first `*.py` argument) import rlsup?"""
    assert spec.command is not None
    for arg in spec.command[1:]:
        if arg.endswith(".py"):
            path = Path(arg) if os.path.isabs(arg) else cwd / arg
            try:
                with path.open("r", encoding="utf-8", errors="replace") as f:
                    return _IMPORTS_SDK.search(f.read(1 << 20)) is not None
            except OSError:
                return False
    return False
