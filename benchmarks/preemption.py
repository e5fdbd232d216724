"""A preemption notice against the example config: how fast every game's checkpoint commits,
and the work lost when the machine is taken, with the watcher and without it, in one run.

    .venv/bin/python benchmarks/preemption.py [--warm-s 60] [--window-s 30] [--device cpu]

Each variant runs `rlsup run` on a copy of `supervisor/example.toml` (CartPole PPO, Pong PPO,
Breakout DQN; `max_concurrent` raised so all three train) in a scratch dir, with a loopback
GCE metadata service (harness/fake_metadata.py: `instance/preempted` turns TRUE, then
the machine goes `--window-s` later, GCE's ~30 s). After `--warm-s` of training the notice is
posted; at the deadline every process is SIGKILLed (the machine is gone). Per game it prints:

- with the watcher (`[preemption] provider = "gcp"`): notice posted -> checkpoint committed
  (the worker's `checkpoint_request.committed`), how long before the kill the final request's
  checkpoint (`final_checkpoint_s`, 15 s before the deadline) committed, and the steps past
  the newest committed checkpoint at the kill (the work a resume redoes);
- without it (`provider = "none"`): the same steps lost, the checkpoint interval being
  `checkpoint_every_s` (300 s in the example).

Then the median and worst notice -> commit against the window, and the steps lost summed over
the games with and without. Ends with ONE JSON line of the figures.
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from hostinfo import host_facts, host_line  # noqa: E402

from harness.fake_metadata import FakeMetadata  # noqa: E402


def heartbeat(run: Path) -> dict[str, Any]:
    try:
        return json.loads((run / "heartbeat.json").read_text())
    except (OSError, ValueError):
        return {}


def committed(run: Path) -> int:
    ckpts = run / "checkpoints"
    steps = [
        int(p.name[5:])
        for p in (ckpts.iterdir() if ckpts.is_dir() else [])
        if p.name.startswith("ckpt-") and (p / "MANIFEST.json").exists()
    ]
    return max(steps, default=-1)


def config_text(endpoint: str, provider: str, device: str) -> str:
    text = (REPO / "supervisor" / "example.toml").read_text()
    text = text.replace('state_dir = "var/rlsup"', 'state_dir = "state"')
    text = text.replace("max_concurrent = 2", "max_concurrent = 3")
    text = text.replace('device = "auto"', f'device = "{device}"')
    for total in ("200_000", "1_000_000"):  # none may finish before the machine is taken
        text = text.replace(f"total_steps = {total}", "total_steps = 1_000_000_000")
    text = text.replace('enabled = "auto"', "enabled = false", 1)  # [spare]: no third process
    return text + f'\n[preemption]\nprovider = "{provider}"\nendpoint = "{endpoint}"\npoll_s = 1\n'


def variant(provider: str, warm_s: float, window_s: float, device: str) -> dict[str, Any]:
    meta = FakeMetadata("gcp")
    with tempfile.TemporaryDirectory() as tmp:
        root = Path(tmp)
        (root / "boot_id").write_text("bench-boot\n")
        cfg = root / "rlsup.toml"
        cfg.write_text(config_text(meta.url, provider, device))
        env = {**os.environ, "PYTHONPATH": str(REPO), "RLSUP_BOOT_ID_PATH": str(root / "boot_id")}
        for key in ("NOTIFY_SOCKET", "WATCHDOG_USEC", "RLSUP_CONFIG"):
            env.pop(key, None)
        log = (root / "supervisor.log").open("wb")
        sup = subprocess.Popen(
            [sys.executable, "-m", "supervisor.cli", "run", "--config", str(cfg)],
            env=env, cwd=REPO, stdout=log, stderr=log, start_new_session=True,
        )  # fmt: skip
        runs = {n: root / "state" / "runs" / n for n in ("cartpole", "pong", "breakout")}
        try:
            t0 = time.monotonic()
            while time.monotonic() - t0 < 300:
                if all((heartbeat(r).get("global_step") or 0) > 0 for r in runs.values()):
                    break
                time.sleep(0.5)
            else:
                raise SystemExit(f"{provider}: the games did not all step within 300 s")
            time.sleep(warm_s)
            posted = time.time()
            meta.post_notice(window_s)
            deadline = posted + window_s
            served: dict[str, float] = {}
            final: dict[str, float] = {}  # the final request's commit, seconds before the kill
            while time.time() < deadline:
                for name, run in runs.items():
                    req = heartbeat(run).get("checkpoint_request") or {}
                    if name not in served and req.get("committed"):
                        served[name] = float(req["committed"]) - posted
                    if name not in final and req.get("final") and req.get("committed"):
                        final[name] = deadline - float(req["committed"])
                time.sleep(0.2)
            steps = {n: int(heartbeat(r).get("global_step") or 0) for n, r in runs.items()}
            newest = {n: committed(r) for n, r in runs.items()}
            # The machine is gone: every process of the run, at once.
            os.killpg(sup.pid, signal.SIGKILL)
            subprocess.run(["pkill", "-KILL", "-f", str(root)], check=False)
        finally:
            if sup.poll() is None:
                os.killpg(sup.pid, signal.SIGKILL)
            sup.wait(10)
            subprocess.run(["pkill", "-KILL", "-f", str(root)], check=False)
            meta.close()
            log.close()
    lost = {n: max(0, steps[n] - max(newest[n], 0)) for n in runs}
    return {"provider": provider, "served_s": served, "final_ahead_s": final, "steps": steps,
            "committed": newest, "lost_steps": lost}  # fmt: skip


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--warm-s", type=float, default=60.0, help="training before the notice")
    p.add_argument("--window-s", type=float, default=30.0, help="notice -> the machine goes")
    p.add_argument("--device", default="cpu")
    args = p.parse_args()
    t0 = time.monotonic()
    watched = variant("gcp", args.warm_s, args.window_s, args.device)
    blind = variant("none", args.warm_s, args.window_s, args.device)
    print(host_line())
    print(
        f"example config (cartpole PPO, pong PPO, breakout DQN), {args.warm_s:.0f} s of training, "
        f"then a GCE notice and the machine gone {args.window_s:.0f} s later; "
        f"{(time.monotonic() - t0) / 60:.1f} min in all"
    )
    print(
        f"{'game':<10}{'notice->commit s':>18}{'final, s ahead':>16}{'lost with':>12}"
        f"{'lost without':>14}"
    )
    for name in watched["steps"]:
        s = watched["served_s"].get(name)
        f = watched["final_ahead_s"].get(name)
        print(
            f"{name:<10}{'-' if s is None else f'{s:.2f}':>18}"
            f"{'-' if f is None else f'{f:.2f}':>16}"
            f"{watched['lost_steps'][name]:>12}{blind['lost_steps'][name]:>14}"
        )
    times = list(watched["served_s"].values())
    med = statistics.median(times) if times else None
    worst = max(times) if times else None
    n = len(watched["steps"])
    print(
        f"served {len(times)}/{n} games inside the {args.window_s:.0f} s window; notice -> commit "
        f"median {med if med is None else round(med, 2)} s, worst "
        f"{worst if worst is None else round(worst, 2)} s; steps lost with the watcher "
        f"{sum(watched['lost_steps'].values())}, without {sum(blind['lost_steps'].values())}"
    )
    print(json.dumps({"benchmark": "preemption", "host": host_facts(), "warm_s": args.warm_s,
                      "window_s": args.window_s, "served_games": len(times), "games": n,
                      "commit_median_s": med, "commit_worst_s": worst,
                      "with_watcher": watched, "without_watcher": blind}))  # fmt: skip


if __name__ == "__main__":
    main()
