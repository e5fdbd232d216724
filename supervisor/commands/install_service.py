"""`rlsup install-service [--user] [--config PATH] [--dry-run]`: render and enable the unit."""

from __future__ import annotations

import argparse
import shlex
import shutil
import subprocess
import sys
from pathlib import Path
from string import Template

from supervisor.commands._common import EXIT_FAIL, EXIT_OK, add_config_argument, load_config_or_exit

TEMPLATE = Path(__file__).resolve().parent.parent / "rlsup.service"
UNIT_NAME = "rlsup.service"


def register(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    p = sub.add_parser(
        "install-service",
        help="install and start the systemd unit",
        description="Render systemd/rlsup.service for this install, write it "
        "to /etc/systemd/system (or ~/.config/systemd/user with --user), then "
        "daemon-reload and enable --now.",
    )
    add_config_argument(p)
    p.add_argument("--user", action="store_true", help="a user unit (systemctl --user)")
    p.add_argument(
        "--dry-run", action="store_true", help="print the unit and the commands; touch nothing"
    )
    p.set_defaults(func=run)


def exec_start() -> tuple[str, str]:
    """The absolute command that runs `rlsup` from this very environment, and the
    Environment= line it needs (PYTHONPATH when the project is not pip-installed)."""
    script = Path(sys.executable).parent / "rlsup"
    if script.exists():
        return shlex.quote(str(script)), ""
    root = Path(__file__).resolve().parents[2]
    return f"{shlex.quote(sys.executable)} -m supervisor.cli", f"Environment=PYTHONPATH={root}\n"


def render(config: Path, stop_grace_s: float, user: bool) -> str:
    command, environment = exec_start()
    return Template(TEMPLATE.read_text(encoding="utf-8")).substitute(
        exec_start=command,
        environment=environment,
        config=shlex.quote(str(config)),
        working_directory=str(config.parent),
        timeout_stop_s=int(stop_grace_s + 30),
        wanted_by="default.target" if user else "multi-user.target",
    )


def unit_path(user: bool) -> Path:
    if user:
        return Path.home() / ".config/systemd/user" / UNIT_NAME
    return Path("/etc/systemd/system") / UNIT_NAME


def run(args: argparse.Namespace) -> int:
    cfg = load_config_or_exit(args)
    unit = render(cfg.path, cfg.stop_grace_s, args.user)
    target = unit_path(args.user)
    scope = ["--user"] if args.user else []
    commands = [
        ["systemctl", *scope, "daemon-reload"],
        ["systemctl", *scope, "enable", "--now", UNIT_NAME],
    ]
    if args.dry_run:
        print(f"# would write {target}:")
        print(unit)
        for cmd in commands:
            print("# would run: " + shlex.join(cmd))
        return EXIT_OK
    if shutil.which("systemctl") is None:
        print(
            "rlsup install-service: systemctl not found; is this a systemd host?", file=sys.stderr
        )
        return EXIT_FAIL
    try:
        target.parent.mkdir(parents=True, exist_ok=True)
        target.write_text(unit, encoding="utf-8")
    except OSError as exc:
        print(f"rlsup install-service: cannot write {target}: {exc.strerror}", file=sys.stderr)
        return EXIT_FAIL
    print(f"wrote {target}")
    for cmd in commands:
        print("$ " + shlex.join(cmd))
        if subprocess.run(cmd, check=False).returncode != 0:
            print(f"rlsup install-service: `{shlex.join(cmd)}` failed", file=sys.stderr)
            return EXIT_FAIL
    return EXIT_OK
