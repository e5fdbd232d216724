"""`rlsup join`: make this host one of the hosts a Ray-backed supervisor places games on (a thin
wrapper over `ray start`), or start the cluster's head with `--head`."""

from __future__ import annotations

import argparse
import os
import re
import socket
import subprocess
import sys

from supervisor.commands._common import EXIT_FAIL, EXIT_USAGE

_NAME_RE = re.compile(r"[A-Za-z0-9]([A-Za-z0-9_.-]{0,61}[A-Za-z0-9])?")


def register(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    p = sub.add_parser(
        "join",
        help="join this host to a Ray cluster (or start its head with --head)",
        description="Start Ray on this host so that a supervisor with [cluster] backend = "
        '"ray" can place games here: `ray start --address HEAD` with the host\'s name and boot '
        "id as node labels and RLSUP_NODE_DIR as where its runs live. With --head: start the "
        "head (it runs no game; the supervisor runs beside it). Checks the Ray version first.",
    )
    where = p.add_mutually_exclusive_group(required=True)
    where.add_argument("--address", help="the head's host:port")
    where.add_argument("--head", action="store_true", help="start the cluster's head here")
    p.add_argument("--port", type=int, default=6379, help="--head: the port (default 6379)")
    p.add_argument("--name", help="this host's name in rlsup (default: its hostname)")
    p.add_argument("--node-dir", help="where this host keeps runs and logs ($RLSUP_NODE_DIR)")
    p.add_argument("--num-cpus", type=int, help="CPUs games may use here (default: all)")
    p.add_argument("--num-gpus", type=int, help="GPUs games may use here (default: all)")
    p.add_argument("--block", action="store_true", help="stay in the foreground (systemd)")
    p.add_argument(
        "--dry-run", action="store_true", help="print the `ray start` command, run nothing"
    )
    p.set_defaults(func=run)


def ray_start_argv(args: argparse.Namespace, name: str, boot_id: str) -> list[str]:
    from supervisor.launch.ray import BOOT_LABEL, HOST_LABEL

    argv = [sys.executable, "-m", "ray.scripts.scripts", "start", "--disable-usage-stats"]
    if args.head:
        # The head places no game (num_cpus 0) and opens no dashboard: no listener but Ray's.
        argv += ["--head", f"--port={args.port}", "--num-cpus=0", "--include-dashboard=false"]
    else:
        labels = f"{HOST_LABEL}={name},{BOOT_LABEL}={boot_id}"
        argv += [f"--address={args.address}", f"--labels={labels}"]
        if args.num_cpus is not None:
            argv.append(f"--num-cpus={args.num_cpus}")
        if args.num_gpus is not None:
            argv.append(f"--num-gpus={args.num_gpus}")
    if args.block:
        argv.append("--block")
    return argv


def run(args: argparse.Namespace) -> int:
    from checkpoints.manifest import read_boot_id
    from supervisor.launch.ray import RAY_VERSION
    from supervisor.launch.ray.host import NODE_DIR_ENV, node_dir

    name = args.name or socket.gethostname().split(".")[0]
    if not _NAME_RE.fullmatch(name):
        print(
            f"rlsup join: host name {name!r} cannot be a Ray label value "
            "(letters, digits, _ . -, at most 63); pass --name",
            file=sys.stderr,
        )
        return EXIT_USAGE
    try:
        import ray
    except ImportError:
        print("rlsup join: Ray is not installed: pip install 'rlsup[ray]'", file=sys.stderr)
        return EXIT_FAIL
    if ray.__version__ != RAY_VERSION:
        print(
            f"rlsup join: Ray {ray.__version__} is installed here; every host of an rlsup "
            f"cluster runs ray=={RAY_VERSION} (pip install 'ray=={RAY_VERSION}')",
            file=sys.stderr,
        )
        return EXIT_FAIL
    boot_id = read_boot_id()
    argv = ray_start_argv(args, name, boot_id)
    env = dict(os.environ)
    if args.node_dir:
        env[NODE_DIR_ENV] = os.path.abspath(args.node_dir)
    env["RLSUP_HOST"] = name
    where = env.get(NODE_DIR_ENV) or str(node_dir())
    py = ".".join(map(str, sys.version_info[:2]))
    print(
        f"rlsup join: {'head' if args.head else f'host {name}'} (boot {boot_id}), Ray "
        f"{ray.__version__}, Python {py}; runs in {where}",
        file=sys.stderr,
    )
    if args.dry_run:
        print(" ".join(argv))
        return 0
    return subprocess.call(argv, env=env)
