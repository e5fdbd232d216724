"""`rlsup doctor [--json]`: what this host gives rlsup's workers, and whether the config fits.

Prints the Python, rlsup, envpool, NVIDIA driver, NVML and torch versions (the installed torch
build from its metadata, and what it can do at run time, asked of a subprocess so that this
process never imports torch), then every GPU NVML sees (index, UUID, name, memory, compute
capability) and whether this torch can train on it, then what each configured game will use
(its device, and the arithmetic `--precision` resolves to there).

Exit codes: 0 when what the configuration asks for is usable (without a configuration file:
when torch imports); 1 otherwise, each reason printed; 2 on a bad configuration or usage.

JSON (`--json`; schema 1): {schema, ok, problems, warnings, config, python, rlsup, envpool,
driver, nvml, torch, gpus, games}. Fields may be added; none is renamed or removed.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
from collections.abc import Callable
from typing import Any

import supervisor
from supervisor.commands._common import EXIT_FAIL, EXIT_OK, EXIT_USAGE, add_config_argument
from supervisor.config import Config, ConfigError, GameSpec, load_config, resolve_config_path
from supervisor.observe.preemption_fit import fit_warnings
from training import torchbuild
from training.tasks import is_atari

SCHEMA = 1
TORCH_PROBE_TIMEOUT_S = 120.0  # importing torch and initialising CUDA; slow on a cold disk
MB = 1024 * 1024


def register(subparsers: Any) -> None:
    p = subparsers.add_parser(
        "doctor",
        help="torch, CUDA, driver and GPUs: what rlsup will use, and whether the config fits",
        description="Report the torch build, CUDA, the NVIDIA driver, NVML, envpool and Python, "
        "every GPU and whether this torch can use it, and what each configured game will train "
        "on. Exit 0 when what the configuration asks for is usable, 1 with the reasons if not.",
    )
    add_config_argument(p)
    p.add_argument("--json", action="store_true", help="one JSON document (for scripts)")
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    path = resolve_config_path(getattr(args, "config", None))
    cfg: Config | None = None
    if getattr(args, "config", None) or path.exists():
        try:
            cfg = load_config(path, check_devices=False)  # that check is this command's job
        except ConfigError as exc:
            print(f"rlsup: configuration error: {exc}", file=sys.stderr)
            return EXIT_USAGE
    doc = diagnose(
        config=cfg,
        driver=torchbuild.driver_version(),
        nvml=nvml_report(),
        installed=torchbuild.installed_torch(),
        runtime=torch_runtime(),
    )
    print(json.dumps(doc, indent=2) if args.json else render_human(doc))
    return EXIT_OK if doc["ok"] else EXIT_FAIL


# ---- gathering: NVML in this process, torch in a subprocess ----------------------------------


def nvml_report(nvml: Any = None) -> dict[str, Any]:
    """NVML's view: available, reason, driver and CUDA driver versions, and each GPU."""
    if nvml is None:
        try:
            import pynvml  # type: ignore[import-untyped, unused-ignore]
        except ImportError:  # pragma: no cover - nvidia-ml-py is a dependency
            return {"available": False, "reason": "pynvml not importable", "gpus": []}
        nvml = pynvml
    try:
        nvml.nvmlInit()
    except nvml.NVMLError as exc:  # no library, no driver loaded, …
        return {"available": False, "reason": str(exc), "gpus": []}
    try:
        cuda = int(nvml.nvmlSystemGetCudaDriverVersion())
        return {
            "available": True,
            "reason": "ok",
            "driver_version": _text(nvml.nvmlSystemGetDriverVersion()),
            "cuda_driver_version": f"{cuda // 1000}.{cuda % 1000 // 10}",
            "gpus": [_nvml_gpu(nvml, i) for i in range(int(nvml.nvmlDeviceGetCount()))],
        }
    except nvml.NVMLError as exc:
        return {"available": False, "reason": f"NVML query failed: {exc}", "gpus": []}
    finally:
        nvml.nvmlShutdown()


def _nvml_gpu(nvml: Any, index: int) -> dict[str, Any]:
    handle = nvml.nvmlDeviceGetHandleByIndex(index)
    mem = nvml.nvmlDeviceGetMemoryInfo(handle)
    try:
        major, minor = nvml.nvmlDeviceGetCudaComputeCapability(handle)
        capability: str | None = f"{major}.{minor}"
    except nvml.NVMLError:
        capability = None
    return {
        "index": index,
        "uuid": _text(nvml.nvmlDeviceGetUUID(handle)),
        "name": _text(nvml.nvmlDeviceGetName(handle)),
        "memory_total_mb": round(float(mem.total) / MB, 1),
        "memory_free_mb": round(float(mem.free) / MB, 1),
        "capability": capability,
    }


def _text(value: Any) -> str:
    return value.decode() if isinstance(value, bytes) else str(value)


def torch_runtime(
    runner: Callable[..., subprocess.CompletedProcess[str]] = subprocess.run,
) -> dict[str, Any]:
    """`python -m training.torchbuild` in a subprocess: what this torch can do at run time."""
    try:
        done = runner(
            [sys.executable, "-m", "training.torchbuild"],
            capture_output=True,
            text=True,
            timeout=TORCH_PROBE_TIMEOUT_S,
            check=False,
        )
    except (OSError, subprocess.TimeoutExpired) as exc:
        return {"ok": False, "error": f"the torch probe did not answer: {exc}"}
    try:
        report = json.loads(done.stdout.strip().splitlines()[-1])
    except (IndexError, json.JSONDecodeError):
        tail = (done.stderr or done.stdout).strip()[-500:]
        return {"ok": False, "error": f"the torch probe failed (exit {done.returncode}): {tail}"}
    return report if isinstance(report, dict) else {"ok": False, "error": "bad probe output"}


# ---- the diagnosis: a pure function of what was gathered -------------------------------------


def diagnose(
    *,
    config: Config | None,
    driver: str | None,
    nvml: dict[str, Any],
    installed: torchbuild.InstalledTorch,
    runtime: dict[str, Any],
) -> dict[str, Any]:
    problems: list[str] = []
    warnings: list[str] = []
    if not runtime.get("ok"):
        problems.append(f"torch does not work: {runtime.get('error')}")
    if driver is not None and not nvml.get("available"):
        warnings.append(
            f"the NVIDIA driver ({driver}) is loaded but NVML does not answer "
            f"({nvml.get('reason')}): no GPU memory gate, no GPU vitals"
        )
    gpus = [_gpu_verdict(g, runtime, installed) for g in nvml.get("gpus", [])]
    cuda_usable = bool(runtime.get("cuda_available")) and (
        not gpus or any(g["torch_usable"] for g in gpus)
    )
    fallback = torchbuild.cpu_fallback_reason(
        driver,
        runtime.get("cuda") is not None if runtime.get("ok") else installed.cuda,
        runtime.get("cuda_available") if runtime.get("ok") else None,
    )
    if fallback is not None:
        warnings.append(
            f"this host has an NVIDIA driver ({driver}), but {fallback}: every "
            'device = "auto" game trains on the CPU'
            + (f"; {torchbuild.cuda_install_hint(installed.public_version)}"
               if fallback == "no CUDA torch" else "")
        )  # fmt: skip
    games: list[dict[str, Any]] = []
    for spec in config.games if config is not None else ():
        if spec.command is not None:
            # A command game runs its own program with its own torch (or none): this torch
            # says nothing about it. It is placed on a GPU like any other game.
            games.append({"name": spec.name, "device": spec.device, "ok": True, "note": None,
                          "uses": None, "kind": "command", "precision": None})  # fmt: skip
            continue
        verdict = _game_verdict(spec.name, spec.device, cuda_usable, fallback, installed)
        precision = _game_precision(spec, verdict["uses"], gpus, runtime)
        games.append({**verdict, "precision": precision})
    for g in games:
        if not g["ok"]:
            problems.append(f"game {g['name']}: {g['note']}")
        elif g["note"]:
            warnings.append(f"game {g['name']}: {g['note']}")
    if config is not None:
        warnings += fit_warnings(config)
    if config is not None and config.cluster.backend == "ray":
        warnings.append("[cluster] backend = ray: this report is of this host only")
    return {
        "schema": SCHEMA,
        "ok": not problems,
        "problems": problems,
        "warnings": warnings,
        "config": None if config is None else str(config.path),
        "python": {"version": sys.version.split()[0], "executable": sys.executable},
        "rlsup": supervisor.__version__,
        "envpool": _dist_version("envpool"),
        "driver": {"version": driver},
        "nvml": {k: v for k, v in nvml.items() if k != "gpus"},
        "torch": {
            "installed": installed.version,
            "build": {True: "cuda", False: "cpu", None: "unknown"}[installed.cuda],
            **{k: v for k, v in runtime.items() if k != "driver"},
        },
        "cuda_usable": cuda_usable,
        "gpus": gpus,
        "games": games,
    }


def _gpu_verdict(
    gpu: dict[str, Any], runtime: dict[str, Any], installed: torchbuild.InstalledTorch
) -> dict[str, Any]:
    usable, why = False, "ok"
    seen = _torch_device(gpu, runtime.get("devices") or [])
    if not runtime.get("ok"):
        why = "torch does not import"
    elif runtime.get("cuda") is None:
        why = f"no CUDA torch ({installed.describe()})"
    elif not runtime.get("cuda_available"):
        why = f"torch (CUDA {runtime.get('cuda')}) cannot initialise CUDA with this driver"
    elif seen is None:
        why = "not visible to torch (CUDA_VISIBLE_DEVICES?)"
    elif gpu.get("capability") and not _arch_covers(runtime.get("arch_list") or [], gpu):
        why = (
            f"compute capability {gpu['capability']} is not among this torch's kernels "
            f"({' '.join(runtime.get('arch_list') or [])})"
        )
    else:
        usable = True
    return {**gpu, "torch_index": None if seen is None else seen, "torch_usable": usable,
            "why": why}  # fmt: skip


def _torch_device(gpu: dict[str, Any], devices: list[dict[str, Any]]) -> int | None:
    """torch's index of this NVML GPU: by UUID (torch's order need not be NVML's), else by
    index when torch sees all of them in order (no CUDA_VISIBLE_DEVICES)."""
    uuid = str(gpu.get("uuid", "")).removeprefix("GPU-")
    for d in devices:
        if uuid and str(d.get("uuid", "")).removeprefix("GPU-") == uuid:
            return int(d["index"])
    if "CUDA_VISIBLE_DEVICES" not in os.environ and not any(d.get("uuid") for d in devices):
        index = int(gpu["index"])
        return index if index < len(devices) else None
    return None


def _arch_covers(arch_list: list[str], gpu: dict[str, Any]) -> bool:
    """Whether torch's compiled kernels run on this capability: an sm_XY of the same major
    and a minor not above it (binary compatible), or PTX (compute_XY) not above it to JIT."""
    major, minor = (int(x) for x in str(gpu["capability"]).split("."))
    for arch in arch_list:
        kind, _, num = arch.partition("_")
        digits = "".join(c for c in num if c.isdigit())
        if len(digits) < 2:
            continue
        a_major, a_minor = int(digits[:-1]), int(digits[-1])
        if kind == "sm" and a_major == major and a_minor <= minor:
            return True
        if kind == "compute" and (a_major, a_minor) <= (major, minor):
            return True
    return False


def _game_verdict(
    name: str,
    device: str,
    cuda_usable: bool,
    fallback: str | None,
    installed: torchbuild.InstalledTorch,
) -> dict[str, Any]:
    verdict: dict[str, Any] = {"name": name, "device": device, "ok": True, "note": None}
    if device == "cpu":
        return {**verdict, "uses": "cpu"}
    if cuda_usable:
        return {**verdict, "uses": "cuda"}
    if device == "auto":  # the fix, if any, is in the host's warning
        note = f"trains on the CPU ({fallback})" if fallback else None
        return {**verdict, "uses": "cpu", "fallback": fallback, "note": note}
    why = fallback or "no usable CUDA device on this host"
    hint = torchbuild.cuda_install_hint(installed.public_version)
    note = f'device = "cuda", but {why}' + (f": {hint}" if fallback == "no CUDA torch" else "")
    return {**verdict, "uses": None, "ok": False, "note": note}


def _game_precision(
    game: GameSpec, uses: str | None, gpus: list[dict[str, Any]], runtime: dict[str, Any]
) -> str | None:
    """What the game's `--precision` (its `args`, default "auto") resolves to where it trains,
    by the worker's own rule; None where it cannot train. On CUDA "auto" is bf16 only if every
    usable GPU has it in hardware (compute capability 8.0 or newer): a game may land on any.
    Without NVML, the GPUs torch sees stand in."""
    if uses is None:
        return None
    caps = [g["capability"] for g in gpus if g["torch_usable"]] or [
        d.get("capability") for d in runtime.get("devices") or []
    ]
    cuda_bf16 = bool(caps) and all(_major(c) >= 8 for c in caps)
    mode = str(game.args_dict.get("precision", "auto"))
    return torchbuild.resolve_precision(mode, uses, is_atari(game.env_id), cuda_bf16)


def _major(capability: str | None) -> int:
    try:
        return int(str(capability).split(".")[0])
    except ValueError:
        return 0


def _dist_version(name: str) -> str | None:
    import importlib.metadata

    try:
        return importlib.metadata.version(name)
    except importlib.metadata.PackageNotFoundError:
        return None


# ---- rendering --------------------------------------------------------------------------------


def render_human(doc: dict[str, Any]) -> str:
    t, nv = doc["torch"], doc["nvml"]
    lines = [
        f"python    {doc['python']['version']} ({doc['python']['executable']})",
        f"rlsup     {doc['rlsup']}",
        f"envpool   {doc['envpool'] or 'not installed'}",
        f"driver    {doc['driver']['version'] or 'none (no /proc/driver/nvidia/version)'}",
        "nvml      "
        + (
            f"ok, driver {nv.get('driver_version')}, CUDA {nv.get('cuda_driver_version')}"
            if nv.get("available")
            else f"unavailable ({nv.get('reason')})"
        ),
        f"torch     {t['installed'] or 'not installed'} ({t['build']} build)"
        + (
            f", CUDA {t.get('cuda') or '-'}, cuDNN {t.get('cudnn') or '-'}, "
            f"cuda available: {'yes' if t.get('cuda_available') else 'no'}"
            if t.get("ok")
            else f", does not import: {t.get('error')}"
        ),
    ]
    if doc["gpus"]:
        lines += ["", "GPUs (NVML index, torch index):"]
        for g in doc["gpus"]:
            verdict = "usable" if g["torch_usable"] else f"NOT usable: {g['why']}"
            seen = "-" if g["torch_index"] is None else g["torch_index"]
            lines.append(
                f"  {g['index']} [torch {seen}]"
                f" {g['name']} {g['uuid']}, {g['memory_total_mb'] / 1024:.1f} GiB "
                f"({g['memory_free_mb'] / 1024:.1f} free), sm {g['capability'] or '?'}: {verdict}"
            )
    else:
        lines += ["", "GPUs: none found"]
    if doc["config"] is not None:
        lines += ["", f"games ({doc['config']}):"]
        for g in doc["games"]:
            uses = g["uses"] or "nothing usable"
            if g.get("kind") == "command":
                uses = "its own program's choice (a command game)"
            if g.get("fallback"):
                uses += f" ({g['fallback']})"
            if g.get("precision"):
                uses += f", {g['precision']}"
            lines.append(
                f"  {g['name']}: device = {g['device']} -> {uses}"
                + ("" if g["ok"] else "  [PROBLEM]")
            )
    else:
        lines += ["", "no configuration file: games not checked (pass --config PATH)"]
    lines += ["", *(f"warning: {w}" for w in doc["warnings"])]
    lines += [f"problem: {p}" for p in doc["problems"]]
    lines.append("ok" if doc["ok"] else "NOT ok")
    return "\n".join(lines)
