"""GPU placement in the supervisor's tick loop, with a recorded multi-GPU NVML (the scenario
backend) and real stand-in workers (torch-free): which GPU each worker gets (its
CUDA_VISIBLE_DEVICES, read from /proc), the gate on THAT GPU, a lost GPU, a late driver."""

from __future__ import annotations

import json
import sys
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from harness.runs import REPO, close_supervisors, spin
from supervisor.config import load_config
from supervisor.daemon import Supervisor
from supervisor.gpu.nvml import NvmlProbe, ScenarioBackend
from supervisor.launch.launcher import Launcher
from supervisor.ledger import db
from supervisor.lifecycle.states import WorkerState as S
from supervisor.stability.vitals import VitalsSampler
from training import torchbuild
from training.torchbuild import InstalledTorch

pytestmark = [pytest.mark.e2e, pytest.mark.timeout(60)]

UUIDS = ["GPU-aaaa0000-0000", "GPU-bbbb1111-1111", "GPU-cccc2222-2222", "GPU-dddd3333-3333"]
GIB = 1024
CPU_TORCH = InstalledTorch("2.13.0+cpu", False)

CONFIG = """\
{head}
state_dir = "state"
stop_grace_s = 5
tick_s = 0.05
[modes.light]
num_envs = 2
batch_size = 2
n_steps = 4
max_concurrent = 4
{games}
[restart]
backoff_base_s = 0.05
backoff_max_s = 0.1
budget = 3
budget_window_s = 60
[gpu]
min_free_mb = 4096
poll_s = 0.01
timeout_s = 3600
{tail}
"""
# Two rungs, starting at the heavier, and a cooldown that outlives the test: a move is seen
# as the game keeping its mode.
TWO_MODES = dict(
    head='initial_mode = "heavy"',
    tail="[modes.heavy]\nnum_envs = 4\nbatch_size = 4\nn_steps = 4\nmax_concurrent = 4\n"
    "[stability]\ncooldown_s = 120\n",
)


def game(name: str, device: str = "cuda", gpu: str = "") -> str:
    return (
        f'[[games]]\nname = "{name}"\nenv_id = "CartPole-v1"\ntotal_steps = 10000000\n'
        f'device = "{device}"\n{gpu}\n'
    )


def write_scenario(path: Path, used_gib: list[float], **extra: Any) -> None:
    gpus = [
        {"uuid": UUIDS[i], "total_mb": 80 * GIB, "used_mb": used * GIB, "temp_c": 50}
        for i, used in enumerate(used_gib)
    ]
    path.write_text(json.dumps({"init": "ok", "gpus": gpus, **extra}))


def environ(pid: int) -> dict[str, str]:
    raw = Path(f"/proc/{pid}/environ").read_bytes().split(b"\0")
    return dict(e.decode().split("=", 1) for e in raw if b"=" in e)


@pytest.fixture
def make(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[Callable[..., Supervisor]]:
    (tmp_path / "boot").write_text("boot-1")
    monkeypatch.setenv("RLSUP_BOOT_ID_PATH", str(tmp_path / "boot"))
    monkeypatch.setenv("PYTHONPATH", str(REPO))
    # This host plays one without an NVIDIA kernel driver whatever it has: NVML is the scenario.
    monkeypatch.setenv(torchbuild.DRIVER_PATH_ENV, str(tmp_path / "no-nvidia-driver"))
    made: list[Supervisor] = []

    def factory(
        games: str,
        visible: str | None = None,
        timeout_s: float = 2.0,
        policy: str | None = None,
        head: str = "",
        tail: str = "",
    ) -> Supervisor:
        if visible is None:
            monkeypatch.delenv("CUDA_VISIBLE_DEVICES", raising=False)
        else:
            monkeypatch.setenv("CUDA_VISIBLE_DEVICES", visible)
        path = tmp_path / "rlsup.toml"
        path.write_text(CONFIG.format(games=games, head=head, tail=tail))
        cfg = load_config(path)
        probe = NvmlProbe(ScenarioBackend(tmp_path / "nvml.json"), timeout_s=timeout_s)
        # The sampler reads once at start, then the test refreshes by hand (probe.refresh()).
        sampler = VitalsSampler(cfg.state_dir, 3600, probe=probe)
        launcher = Launcher(python=sys.executable, module="tests.supervisor.fake_worker")
        sup = Supervisor(cfg, launcher=launcher, cores=4, gpu_probe=probe, sampler=sampler,
                         policy=policy)  # fmt: skip
        sup.start()
        made.append(sup)
        return sup

    yield factory
    close_supervisors(made)


def running(sup: Supervisor, *names: str) -> Callable[[], bool]:
    return lambda: all(sup.games[n].state is S.RUNNING for n in names)


def worker_gpu(sup: Supervisor, name: str) -> str:
    proc = sup.games[name].proc
    assert proc is not None
    return environ(proc.pid)["CUDA_VISIBLE_DEVICES"]


def events(sup: Supervisor, kind: str) -> list[Any]:
    assert sup.on.conn is not None
    return db.events(sup.on.conn, kind=kind)


def test_games_spread_over_four_gpus_avoiding_the_busy_one(make, tmp_path) -> None:  # type: ignore[no-untyped-def]
    write_scenario(tmp_path / "nvml.json", [2, 78, 10, 1])  # GPU 1 busy with another job
    sup = make(game("a") + game("b") + game("c", device="auto"))
    spin(sup, running(sup, "a", "b", "c"))
    got = {n: worker_gpu(sup, n) for n in "abc"}
    # One game per GPU, roomiest first (3, 0, 2); never GPU 1, too busy to fit one.
    assert got == {"a": UUIDS[3], "b": UUIDS[0], "c": UUIDS[2]}
    assigned = {e.game: e.detail for e in events(sup, "gpu_assigned")}
    assert assigned["a"] == {"index": 3, "uuid": UUIDS[3], "CUDA_VISIBLE_DEVICES": UUIDS[3]}
    starts = {e.game: e.detail["gpu"] for e in events(sup, "worker_start")}
    assert starts["b"] == {"index": 0, "uuid": UUIDS[0]}
    rows = {w["game"]: w["gpu"] for w in db.workers(sup.on.conn)}  # type: ignore[arg-type]
    assert rows["c"] == {"index": 2, "uuid": UUIDS[2]}


def test_cpu_games_get_no_gpu_and_keep_the_environment(make, tmp_path) -> None:  # type: ignore[no-untyped-def]
    write_scenario(tmp_path / "nvml.json", [0, 0])
    sup = make(game("a", device="cpu"))
    spin(sup, running(sup, "a"))
    proc = sup.games["a"].proc
    assert proc is not None and "CUDA_VISIBLE_DEVICES" not in environ(proc.pid)
    assert events(sup, "gpu_assigned") == []


@pytest.mark.parametrize("visible", ["2,3", f"{UUIDS[2]},GPU-dddd"])
def test_only_gpus_the_supervisor_sees_are_used(make, tmp_path, visible) -> None:  # type: ignore[no-untyped-def]
    write_scenario(tmp_path / "nvml.json", [0, 0, 20, 30])  # 0 and 1 emptier, but hidden
    sup = make(game("a") + game("b") + game("c", gpu="gpu = 1"), visible=visible)
    spin(sup, running(sup, "a", "b", "c"))
    assert {worker_gpu(sup, n) for n in "ab"} == {UUIDS[2], UUIDS[3]}
    assert worker_gpu(sup, "c") == UUIDS[3]  # gpu = 1: the second visible GPU


def test_the_gate_checks_the_placed_gpu_and_a_pinned_game_waits_on_its_gpu(make, tmp_path) -> None:  # type: ignore[no-untyped-def]
    path = tmp_path / "nvml.json"
    write_scenario(path, [0, 79])  # GPU 1: 1 GiB free < 4 GiB needed
    sup = make(game("a", gpu="gpu = 1"))
    spin(sup, lambda: bool(events(sup, "gpu_wait")))
    for _ in range(10):
        sup.safe_tick()
    assert sup.games["a"].state is S.WAITING
    wait = events(sup, "gpu_wait")[0].detail
    assert wait["gpu"] == {"index": 1, "uuid": UUIDS[1]} and "GPU 1:" in wait["reason"]
    write_scenario(path, [0, 10])
    sup.probe.refresh()  # type: ignore[attr-defined]
    spin(sup, running(sup, "a"))
    assert worker_gpu(sup, "a") == UUIDS[1]


def test_a_lost_gpu_stops_its_games_which_move_to_another(make, tmp_path) -> None:  # type: ignore[no-untyped-def]
    path = tmp_path / "nvml.json"
    write_scenario(path, [0, 5])
    sup = make(game("a"))
    spin(sup, running(sup, "a"))
    assert worker_gpu(sup, "a") == UUIDS[0]
    first_pid = sup.games["a"].proc.pid  # type: ignore[union-attr]
    scenario = json.loads(path.read_text())
    scenario["gpus"][0]["lost"] = True  # NVMLError_GpuIsLost on GPU 0
    path.write_text(json.dumps(scenario))
    sup.probe.refresh()  # type: ignore[attr-defined]
    spin(sup, lambda: (p := sup.games["a"].proc) is not None and p.pid != first_pid
         and sup.games["a"].state is S.RUNNING)  # fmt: skip
    assert worker_gpu(sup, "a") == UUIDS[1]
    lost = events(sup, "gpu_lost")
    assert [e.detail["uuid"] for e in lost] == [UUIDS[0]] and lost[0].detail["games"] == ["a"]
    moved = events(sup, "gpu_assigned")[-1].detail
    assert moved["uuid"] == UUIDS[1] and moved["moved_from"] == {"index": 0, "uuid": UUIDS[0]}
    assert sup.games["a"].restarts == 0 and events(sup, "worker_crash") == []  # no failure


def test_a_cuda_game_waits_for_a_late_driver(make, tmp_path) -> None:  # type: ignore[no-untyped-def]
    path = tmp_path / "nvml.json"
    path.write_text(json.dumps({"init": "Driver Not Loaded"}))
    sup = make(game("a") + game("b", device="auto"))
    spin(sup, running(sup, "b"))  # auto: not held back by NVML (the worker decides)
    assert "CUDA_VISIBLE_DEVICES" not in environ(sup.games["b"].proc.pid)  # type: ignore[union-attr]
    assert sup.games["a"].state is S.WAITING
    assert "waiting for the driver" in events(sup, "gpu_wait")[0].detail["reason"]
    write_scenario(path, [0])
    sup.probe._next_init = 0.0  # type: ignore[attr-defined]  # skip the backoff's wait
    sup.probe.refresh()  # type: ignore[attr-defined]
    spin(sup, running(sup, "a"))
    assert worker_gpu(sup, "a") == UUIDS[0]
    drivers = [e.detail["available"] for e in events(sup, "gpu_driver")]
    assert drivers == [False, True]


def test_a_hung_nvml_holds_new_gpu_games_but_not_the_tick(make, tmp_path) -> None:  # type: ignore[no-untyped-def]
    path = tmp_path / "nvml.json"
    write_scenario(path, [0], hang_s=3.0)  # stands for a 30 s hang
    sup = make(game("a") + game("c", device="cpu"), timeout_s=0.1)
    spin(sup, running(sup, "c"))  # ticks go on while NVML's call hangs

    def nvml_named() -> bool:  # once the sampler's call has outlived its timeout
        return any("NVML" in e.detail["reason"] for e in events(sup, "gpu_wait"))

    spin(sup, nvml_named)
    assert sup.games["a"].state is S.WAITING


def test_a_failure_on_a_gpu_names_that_gpu(make, tmp_path) -> None:  # type: ignore[no-untyped-def]
    write_scenario(tmp_path / "nvml.json", [0, 40])
    run = tmp_path / "state" / "runs" / "a"
    run.mkdir(parents=True)
    (run / "fake.json").write_text(json.dumps({"oom_above_envs": 1}))  # OOM at 2 envs
    sup = make(game("a"))
    spin(sup, lambda: bool(events(sup, "worker_oom")))
    oom = events(sup, "worker_oom")[0].detail
    assert oom["gpu"] == {"index": 0, "uuid": UUIDS[0]}
    assert events(sup, "worker_exit")[0].detail["gpu"] == oom["gpu"]


def test_a_game_on_a_hot_gpu_moves_to_the_calm_one_and_keeps_its_mode(make, tmp_path) -> None:  # type: ignore[no-untyped-def]
    path = tmp_path / "nvml.json"
    write_scenario(path, [0, 5])
    sup = make(game("a") + game("c", device="cpu"), policy="default", **TWO_MODES)
    spin(sup, running(sup, "a", "c"))
    assert worker_gpu(sup, "a") == UUIDS[0]
    first_pid, cpu_pid = sup.games["a"].proc.pid, sup.games["c"].proc.pid  # type: ignore[union-attr]
    scenario = json.loads(path.read_text())
    scenario["gpus"][0]["temp_c"] = 93  # over stability.max_gpu_temp_c (85)
    path.write_text(json.dumps(scenario))
    sup.sampler.sample_once()
    sup.policy.request()  # type: ignore[union-attr]  # instead of waiting for its period
    spin(sup, lambda: (p := sup.games["a"].proc) is not None and p.pid != first_pid
         and sup.games["a"].state is S.RUNNING)  # fmt: skip
    assert worker_gpu(sup, "a") == UUIDS[1]
    moved = events(sup, "gpu_moved")
    assert [(e.game, e.detail["from"]["index"], e.detail["to"]["index"]) for e in moved] == [
        ("a", 0, 1)
    ]
    assert "GPU 0 temperature 93C > 85C" in moved[0].detail["causes"][0]
    assert events(sup, "gpu_assigned")[-1].detail["moved_from"] == {"index": 0, "uuid": UUIDS[0]}
    assert events(sup, "scale_down") == []  # neither the game nor the host stepped down
    assert sup.view.game("a").name == "heavy" and sup.view.host.name == "heavy"
    assert sup.games["a"].restarts == 0 and events(sup, "worker_crash") == []
    assert sup.games["c"].proc.pid == cpu_pid  # type: ignore[union-attr]  # CPU game untouched


def test_an_oom_moves_the_game_then_a_second_oom_steps_it_down(make, tmp_path) -> None:  # type: ignore[no-untyped-def]
    write_scenario(tmp_path / "nvml.json", [0, 5])
    run = tmp_path / "state" / "runs" / "a"
    run.mkdir(parents=True)
    (run / "fake.json").write_text(json.dumps({"oom_above_envs": 2}))  # OOM at heavy (4 envs)
    sup = make(game("a"), policy="default", **TWO_MODES)
    spin(sup, running(sup, "a"))
    moved = events(sup, "gpu_moved")
    assert [(e.detail["from"]["index"], e.detail["to"]["index"]) for e in moved] == [(0, 1)]
    assert [e.detail["gpu"]["index"] for e in events(sup, "worker_oom")] == [0, 1]
    downs = events(sup, "scale_down")
    assert [(e.game, e.detail.get("to")) for e in downs] == [("a", "light")]
    assert sup.view.game("a").name == "light" and worker_gpu(sup, "a") == UUIDS[1]


# ---- the device is decided before the gate (issue 24 #11, #12) ------------------------------


def test_an_auto_game_that_will_train_on_the_cpu_skips_the_gpu_gate(  # type: ignore[no-untyped-def]
    make, tmp_path, monkeypatch
) -> None:
    """A host with an NVIDIA driver and a CPU-only torch: rlsup says the auto game trains on
    the CPU (`device_fallback`), so it neither waits for GPU memory nor gets a GPU."""
    driver = tmp_path / "nvidia-version"
    driver.write_text("NVRM version: NVIDIA UNIX x86_64 Kernel Module  550.54.14  Thu Feb 22\n")
    monkeypatch.setenv(torchbuild.DRIVER_PATH_ENV, str(driver))
    monkeypatch.setattr(torchbuild, "installed_torch", lambda: CPU_TORCH)
    write_scenario(tmp_path / "nvml.json", [79])  # 1 GiB free < 4 GiB: a CUDA game would wait
    sup = make(game("a", device="auto"))
    spin(sup, running(sup, "a"), timeout=20)
    assert "CUDA_VISIBLE_DEVICES" not in environ(sup.games["a"].proc.pid)  # type: ignore[union-attr]
    assert events(sup, "gpu_wait") == [] and events(sup, "gpu_assigned") == []
    assert [e.game for e in events(sup, "device_fallback")] == ["a"]


def test_a_cuda_game_on_a_host_without_an_nvidia_driver_is_fatal_at_once(make, tmp_path) -> None:  # type: ignore[no-untyped-def]
    """No NVIDIA driver installed (NVML's library is missing): a CUDA worker can never start,
    so the game ends FATAL naming CUDA and the fix; the others run."""
    (tmp_path / "nvml.json").write_text(json.dumps({"init": "NVML Shared Library Not Found"}))
    sup = make(game("a") + game("c", device="cpu"))
    spin(sup, lambda: sup.games["a"].state is S.FATAL and running(sup, "c")(), timeout=20)
    reason = sup.games["a"].reason
    assert 'device = "cuda"' in reason and "no NVIDIA driver" in reason, reason
    assert 'device = "auto"' in reason and "install the NVIDIA driver" in reason, reason
    [fatal] = events(sup, "fatal")
    assert fatal.game == "a" and fatal.detail["reason"] == reason
    assert [e.game for e in events(sup, "worker_start")] == ["c"], "a never got a worker"


def test_no_spare_is_warmed_for_games_that_start_placed_on_a_gpu(make, tmp_path) -> None:  # type: ignore[no-untyped-def]
    """A placed game's worker starts cold (its own CUDA_VISIBLE_DEVICES), so a CUDA spare
    warmed beside such games would hold a GPU context and RAM for nothing."""
    write_scenario(tmp_path / "nvml.json", [2, 2])
    sup = make(game("a") + game("b", device="auto"), tail="[spare]\nenabled = true\n")
    spin(sup, running(sup, "a", "b"))
    want = sup.on.spare.want(sup.tick_view())
    assert want.want is False and "placed on a GPU" in want.reason, want
    assert sup.launcher.spare_row() is None or sup.launcher.spare_row()["state"] == "stopped"


def test_a_cpu_game_beside_placed_ones_gets_a_cpu_spare(make, tmp_path) -> None:  # type: ignore[no-untyped-def]
    write_scenario(tmp_path / "nvml.json", [2, 2])
    sup = make(game("a") + game("c", device="cpu"), tail="[spare]\nenabled = true\n")
    spin(sup, running(sup, "a", "c"))
    want = sup.on.spare.want(sup.tick_view())
    assert want.want is True and want.device == "cpu", want
