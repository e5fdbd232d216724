"""`rlsup install-service`: install rlsup as a systemd service and start it.

A system unit (the default) runs as a dedicated account (`--run-as`, default `rlsup`, created
when missing) with its state in /var/lib/rlsup and its worker logs in /var/log/rlsup, both
owned by that account and readable by its group: the operators (`sudo` adds the invoking user).
The configuration is installed as /etc/rlsup/rlsup.toml (mode 0640, group of the service),
which every `rlsup` command finds without `--config`. `--user` installs a user unit instead
(`systemctl --user`), with the configuration and state where they are.
"""

from __future__ import annotations

import argparse
import grp
import os
import pwd
import re
import shlex
import shutil
import stat
import subprocess
import sys
import sysconfig
from dataclasses import dataclass, field
from pathlib import Path
from string import Template

from supervisor.commands._common import EXIT_FAIL, EXIT_OK, add_config_argument, load_config_or_exit
from supervisor.config import SYSTEM_CONFIG, Config

TEMPLATE = Path(__file__).resolve().parent.parent / "rlsup.service"
UNIT_NAME = "rlsup.service"
DEFAULT_ACCOUNT = "rlsup"
STATE_DIR = Path("/var/lib/rlsup")  # StateDirectory=rlsup
LOGS_DIR = Path("/var/log/rlsup")  # LogsDirectory=rlsup
UNIT_DIRS = (
    "/etc/systemd/system",
    "/run/systemd/system",
    "/lib/systemd/system",
    "/usr/lib/systemd/system",
)

# What a GPU box can afford: CUDA needs /dev/nvidia* (no PrivateDevices) and W+X memory for
# its JIT (no MemoryDenyWriteExecute); no system-call filter (torch, envpool and the CUDA driver
# were never audited against one). Measured with `systemd-analyze security` (docs/operations.md).
SANDBOXING = """\
StateDirectory=rlsup
StateDirectoryMode=0750
LogsDirectory=rlsup
LogsDirectoryMode=0750
UMask=0027
NoNewPrivileges=yes
CapabilityBoundingSet=
ProtectSystem=full
ProtectHome=read-only
PrivateTmp=yes
ProtectKernelTunables=yes
ProtectKernelModules=yes
ProtectKernelLogs=yes
ProtectControlGroups=yes
ProtectClock=yes
ProtectHostname=yes
RestrictSUIDSGID=yes
RestrictRealtime=yes
RestrictNamespaces=yes
RestrictAddressFamilies=AF_UNIX AF_INET AF_INET6 AF_NETLINK
LockPersonality=yes
SystemCallArchitectures=native
"""


def register(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    p = sub.add_parser(
        "install-service",
        help="install and start the systemd unit",
        description="Install rlsup as a systemd service: the service account (--run-as, "
        "created if missing), /etc/rlsup/rlsup.toml, the unit in /etc/systemd/system; then "
        "daemon-reload and enable --now. --user: a user unit instead.",
    )
    add_config_argument(p)
    p.add_argument("--user", action="store_true", help="a user unit (systemctl --user)")
    p.add_argument(
        "--run-as",
        metavar="NAME",
        default=None,
        help=f"system unit: the account the service runs as (default {DEFAULT_ACCOUNT}, "
        "created if missing; `root` is allowed)",
    )
    p.add_argument("--dry-run", action="store_true", help="print what would be done; touch nothing")
    p.set_defaults(func=run)


@dataclass
class Plan:
    unit: str
    unit_path: Path
    config_text: str | None = None  # the service's /etc/rlsup/rlsup.toml (system units)
    account: str | None = None
    create_account: bool = False
    add_operator: str | None = None
    commands: list[list[str]] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)
    problems: list[str] = field(default_factory=list)


def exec_start() -> tuple[str, str]:
    """The absolute command that runs `rlsup` from this very environment, and the
    Environment= line it needs (PYTHONPATH when the project is not pip-installed)."""
    script = Path(sys.executable).parent / "rlsup"
    if script.exists():
        return shlex.quote(str(script)), ""
    root = Path(__file__).resolve().parents[2]
    return f"{shlex.quote(sys.executable)} -m supervisor.cli", f"Environment=PYTHONPATH={root}\n"


def render(
    config: Path,
    stop_grace_s: float,
    user: bool,
    account: str | None = None,
    working_directory: Path | None = None,
) -> str:
    command, environment = exec_start()
    run_as = "" if user or account in (None, "root") else f"User={account}\nGroup={account}\n"
    sandboxing = "UMask=0077\n" if user else SANDBOXING
    return Template(TEMPLATE.read_text(encoding="utf-8")).substitute(
        exec_start=command,
        environment=environment,
        config=shlex.quote(str(config)),
        working_directory=f"-{working_directory or config.parent}",
        timeout_stop_s=int(stop_grace_s + 30),
        wanted_by="default.target" if user else "multi-user.target",
        run_as=run_as,
        sandboxing=sandboxing,
        unit_deps=gpu_deps(),
    )


def gpu_deps() -> str:
    """Start after the NVIDIA persistence daemon where there is one (wanted, not required)."""
    if any(Path(d, "nvidia-persistenced.service").exists() for d in UNIT_DIRS):
        return "After=nvidia-persistenced.service\nWants=nvidia-persistenced.service\n"
    return ""


def unit_path(user: bool) -> Path:
    if user:
        return Path.home() / ".config/systemd/user" / UNIT_NAME
    return Path("/etc/systemd/system") / UNIT_NAME


def with_service_paths(text: str, state_dir: Path, logs_dir: Path) -> str:
    """The configuration with `state_dir` and `logs_dir` pointing at the service's
    directories: top-level keys, so they go first (any earlier ones are commented out)."""
    head, sep, tables = text.partition("\n[")
    lines = [
        f"# {line}  (replaced by rlsup install-service)"
        if re.match(r"\s*(state_dir|logs_dir)\s*=", line)
        else line
        for line in head.splitlines()
    ]
    top = (
        "# Installed by `rlsup install-service`: the service keeps its state and worker logs\n"
        "# in the directories systemd makes for it (StateDirectory=, LogsDirectory=).\n"
        f'state_dir = "{state_dir}"\nlogs_dir = "{logs_dir}"\n'
    )
    return top + "\n".join(lines) + (sep + tables if sep else "\n")


def unreachable(path: Path, account: str) -> str | None:
    """The first directory on the way to `path` (and to what its symlinks point at) that
    `account` may not search, as a sentence; None when it can. An account that does not exist
    yet has no directory of its own: it needs the world's search permission."""
    if account == "root":
        return None
    try:
        user = pwd.getpwnam(account)
        uid = user.pw_uid
        gids = {user.pw_gid, *(g.gr_gid for g in grp.getgrall() if account in g.gr_mem)}
    except KeyError:
        uid, gids = -1, set()
    for target in (path, path.resolve()):
        for directory in reversed(target.parents):
            try:
                st = directory.stat()
            except FileNotFoundError:
                return f"{directory} does not exist"
            if st.st_uid == uid:
                bit = stat.S_IXUSR
            elif st.st_gid in gids:
                bit = stat.S_IXGRP
            else:
                bit = stat.S_IXOTH
            if not st.st_mode & bit:
                return f"{account} cannot enter {directory} (mode {stat.filemode(st.st_mode)})"
    return None


# PrivateTmp=yes (SANDBOXING) gives the service an empty /tmp and /var/tmp of its own.
PRIVATE_TMP_DIRS = (Path("/tmp"), Path("/var/tmp"))
# Where home directories live: ProtectHome=yes|tmpfs would hide them; read-only only forbids writes.
HOME_DIRS = (Path("/home"), Path("/root"), Path("/run/user"))
SERVICE_VENV = Path("/opt/rlsup")
# Interpreters a service venv can be made from: a distribution's or a local build's, outside
# every home directory (pyenv's and conda's live in one; a venv keeps using its base).
SYSTEM_PYTHON_DIRS = (Path("/usr/bin"), Path("/usr/local/bin"))


def protect_home() -> str:
    """The unit's ProtectHome= value (SANDBOXING)."""
    found = re.search(r"^ProtectHome=(\S+)$", SANDBOXING, re.MULTILINE)
    return found.group(1) if found else "no"


def sandbox_hides(path: Path) -> str | None:
    """Why the unit's sandboxing hides `path` (or what its symlinks point at) from the
    service, whoever it runs as; None when it does not."""
    for target in dict.fromkeys((path, path.resolve())):
        for tmp in PRIVATE_TMP_DIRS:
            if target.is_relative_to(tmp):
                return (
                    f"{target} is under {tmp}, which PrivateTmp=yes replaces with an empty "
                    "directory of the service's own"
                )
        if protect_home() in ("yes", "tmpfs") and any(map(target.is_relative_to, HOME_DIRS)):
            return f"{target} is in a home directory, which ProtectHome={protect_home()} hides"
    return None


def needed_paths(cfg: Config) -> list[tuple[str, Path]]:
    """(what, path) the service must read to run rlsup from this very environment: the
    interpreter, its standard library, the installed packages, rlsup's code (an editable
    install imports it from the checkout) and the hook programs named by absolute path."""
    paths = sysconfig.get_paths()
    needed = [
        ("the interpreter", Path(sys.executable)),
        ("the standard library", Path(paths["stdlib"])),
        ("the installed packages", Path(paths["purelib"])),
        ("rlsup's code", Path(__file__).resolve().parents[2]),
    ]
    for hook in cfg.hooks:
        if Path(hook.command[0]).is_absolute():
            needed.append(("a hook program", Path(hook.command[0])))
    return needed


def hidden_from_service(cfg: Config, account: str) -> list[str]:
    """One sentence per path the service (as `account`, under the unit's sandboxing) could
    not read, each naming the path, why, and the way out; [] when it can read them all."""
    found: list[tuple[str, str, bool]] = []  # (what, why, only permissions hide it)
    for what, path in needed_paths(cfg):
        why = sandbox_hides(path)
        only_permissions = why is None
        why = why or unreachable(path, account)
        if why:
            found.append((what, why, only_permissions))
    if not found:
        return []
    whole = [f"the service could not read {what}: {why}" for what, why, _ in found]
    if all(what == "a hook program" for what, _, _ in found):
        return [f"{line}; install it outside /tmp, /var/tmp and home directories" for line in whole]
    return [*whole, way_out(cfg, account, all(perm for _, _, perm in found))]


def way_out(cfg: Config, account: str, only_permissions: bool) -> str:
    """The commands that install rlsup where the service can run it, from an interpreter a
    service venv may be made from (a pyenv or conda one lives in a home directory)."""
    base = Path(getattr(sys, "_base_executable", sys.executable))
    python = base if visible(base, account) else system_python(account)
    project = Path(__file__).resolve().parents[2]
    source = shlex.quote(str(project)) if (project / "pyproject.toml").exists() else "rlsup"
    if python is None:
        steps = (
            f"no interpreter the service can read was found ({base}, the base of this "
            f"environment, is not; none in {', '.join(map(str, SYSTEM_PYTHON_DIRS))}): install "
            "one outside home directories and /tmp (e.g. `apt install python3-venv`, pyenv with "
            "PYENV_ROOT=/opt/pyenv, or `conda create -p /opt/rlsup-python python=3.11`), make a "
            f"venv in {SERVICE_VENV} from it, `pip install {source}` there and run its "
            "`rlsup install-service`"
        )
    else:
        sudo = "" if os.geteuid() == 0 else "sudo "
        steps = (
            f"`{python} -m venv {SERVICE_VENV} && {SERVICE_VENV}/bin/pip install {source} && "
            f"{sudo}{SERVICE_VENV}/bin/rlsup install-service "
            f"--config {shlex.quote(str(cfg.path))}`"
        )
        if python != base:  # a pyenv or conda interpreter: a venv made from it leads back
            steps += f" (not from {base}: the service cannot read that one either)"
    root = ""
    if only_permissions and account != "root":
        root = (
            "; or --run-as root, which reads it where it is, at a price: the service, every "
            "worker and every hook then run as root, with full power over this host"
        )
    return f"the way out: install rlsup where the service can read it: {steps}{root}"


def visible(python: Path, account: str) -> bool:
    """`python` (and the directory its standard library is in) is readable by the service."""
    return not any(
        sandbox_hides(p) or unreachable(p, account) for p in (python, python.resolve().parent)
    )


def system_python(account: str) -> Path | None:
    """A python3 of at least this version's minor, outside home directories, the service
    can read: the same minor first (the installed wheels fit it), the newest else."""
    major, minor = sys.version_info[:2]
    names = [f"python{major}.{minor}", *(f"python{major}.{m}" for m in range(minor + 9, minor, -1))]
    for name in names:
        for directory in SYSTEM_PYTHON_DIRS:
            candidate = directory / name
            if (
                candidate.is_file()
                and os.access(candidate, os.X_OK)
                and visible(candidate, account)
            ):
                return candidate
    return None


def _exists_user(name: str) -> bool:
    try:
        pwd.getpwnam(name)
    except KeyError:
        return False
    return True


def plan_install(cfg: Config, args: argparse.Namespace) -> Plan:
    scope = ["--user"] if args.user else []
    if args.user:
        plan = Plan(render(cfg.path, cfg.stop_grace_s, True), unit_path(True))
        plan.notes += linger_notes()
    else:
        account = args.run_as or DEFAULT_ACCOUNT
        plan = Plan(
            render(SYSTEM_CONFIG, cfg.stop_grace_s, False, account, STATE_DIR),
            unit_path(False),
            config_text=with_service_paths(
                cfg.path.read_text(encoding="utf-8"), STATE_DIR, LOGS_DIR
            ),
            account=account,
            create_account=not _exists_user(account),
        )
        operator = os.environ.get("SUDO_USER")
        if operator and operator not in ("root", account) and account != "root":
            plan.add_operator = operator
        if cfg.state_dir != STATE_DIR and (cfg.state_dir / "runs").is_dir():
            plan.notes.append(
                f"the service keeps its state in {STATE_DIR}; to carry on the runs in "
                f"{cfg.state_dir / 'runs'}, copy that directory there (owned by {account}) "
                "before it starts them afresh"
            )
        plan.problems += hidden_from_service(cfg, account)
    plan.commands = [
        ["systemctl", *scope, "daemon-reload"],
        ["systemctl", *scope, "enable", "--now", UNIT_NAME],
    ]
    return plan


def linger_notes() -> list[str]:
    """A user unit runs only while its user is logged in, unless lingering is on."""
    user = pwd.getpwuid(os.getuid()).pw_name
    try:
        out = subprocess.run(
            ["loginctl", "show-user", user, "--property=Linger", "--value"],
            capture_output=True,
            text=True,
            timeout=10,
        ).stdout.strip()
    except (OSError, subprocess.SubprocessError):
        out = ""
    if out == "yes":
        return []
    return [
        f"lingering is off for {user}: the service stops at logout and does not start at boot "
        f"until `sudo loginctl enable-linger {user}`"
    ]


def run(args: argparse.Namespace) -> int:
    cfg = load_config_or_exit(args)
    if args.user and args.run_as:
        print("rlsup install-service: --run-as is for system units, not --user", file=sys.stderr)
        return EXIT_FAIL
    plan = plan_install(cfg, args)
    if args.dry_run:
        return _print_plan(plan)
    for problem in plan.problems:
        print(f"rlsup install-service: {problem}", file=sys.stderr)
    if plan.problems:
        return EXIT_FAIL
    if shutil.which("systemctl") is None:
        print(
            "rlsup install-service: systemctl not found; is this a systemd host?", file=sys.stderr
        )
        return EXIT_FAIL
    try:
        _install(plan)
    except (OSError, subprocess.CalledProcessError) as exc:
        print(f"rlsup install-service: {exc}", file=sys.stderr)
        return EXIT_FAIL
    for note in plan.notes:
        print(f"note: {note}")
    return EXIT_OK


def _print_plan(plan: Plan) -> int:
    if plan.create_account:
        print(f"# would create the system account {plan.account} (group {plan.account})")
    if plan.add_operator:
        print(f"# would add {plan.add_operator} to the group {plan.account}")
    if plan.config_text is not None:
        print(f"# would write {SYSTEM_CONFIG} (0640, group {plan.account}):")
        print(plan.config_text)
    print(f"# would write {plan.unit_path}:")
    print(plan.unit)
    for cmd in plan.commands:
        print("# would run: " + shlex.join(cmd))
    for note in plan.notes:
        print(f"# note: {note}")
    for problem in plan.problems:
        print(f"# problem: {problem}")
    return EXIT_OK


def _run(cmd: list[str]) -> None:
    print("$ " + shlex.join(cmd))
    subprocess.run(cmd, check=True)


def _install(plan: Plan) -> None:
    account = plan.account
    if plan.create_account and account:
        _run([
            "useradd", "--system", "--user-group", "--home-dir", str(STATE_DIR),
            "--no-create-home", "--shell", "/usr/sbin/nologin", account,
        ])  # fmt: skip
    if plan.add_operator and account:
        _run(["usermod", "--append", "--groups", account, plan.add_operator])
        plan.notes.append(
            f"{plan.add_operator} is in the group {account} now: `rlsup status`, `events`, "
            "`scale`, `logs` and `stop` work without sudo after a new login"
        )
    if plan.config_text is not None:
        SYSTEM_CONFIG.parent.mkdir(mode=0o755, parents=True, exist_ok=True)
        tmp = SYSTEM_CONFIG.with_name(f".{SYSTEM_CONFIG.name}.tmp")
        tmp.write_text(plan.config_text, encoding="utf-8")
        gid = grp.getgrnam(account).gr_gid if account and account != "root" else 0
        os.chown(tmp, 0, gid)
        os.chmod(tmp, 0o640)
        os.replace(tmp, SYSTEM_CONFIG)
        print(f"wrote {SYSTEM_CONFIG}")
    plan.unit_path.parent.mkdir(parents=True, exist_ok=True)
    unit_tmp = plan.unit_path.with_name(f".{plan.unit_path.name}.tmp")
    unit_tmp.write_text(plan.unit, encoding="utf-8")
    os.chmod(unit_tmp, 0o644)
    os.replace(unit_tmp, plan.unit_path)  # never a half-written unit for systemd to read
    print(f"wrote {plan.unit_path}")
    for cmd in plan.commands:
        _run(cmd)
