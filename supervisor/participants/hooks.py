"""`[[hooks]]`: alert programs run on events; the Recorder hands them every event it records."""

from __future__ import annotations

from supervisor.config import Config
from supervisor.ledger.recorder import Recorder
from supervisor.observe.hooks import HookRunner
from supervisor.participants.tick import Event, TickView

HOOKS_CLOSE_WAIT_S = 5.0  # at shutdown, for the alerts of the last events to go out


class HookAlerts:
    """The runner of the configuration in force, fed by the Recorder; a failed or dropped
    run becomes a `hook_failed` event."""

    def __init__(self, cfg: Config, recorder: Recorder) -> None:
        self.recorder = recorder
        self.runner: HookRunner | None = None
        self.reconfigure(cfg)  # before the first event: a host_reboot alert is one of them

    def start(self) -> None:
        pass

    def reconfigure(self, cfg: Config) -> None:
        """The runner of the configuration now in force (hooks of the old one still running
        finish on their own, bounded by their timeouts)."""
        if self.runner is not None:
            self.runner.close(wait_s=0.0, then_kill=False)
        self.runner = HookRunner(cfg.hooks, log_dir=cfg.logs_dir) if cfg.hooks else None
        self.recorder.on_event = self.runner.fire if self.runner is not None else None

    def tick(self, view: TickView) -> list[Event]:
        runner = self.runner
        if runner is None:
            return []
        results, dropped = runner.drain()
        out: list[Event] = [
            ("hook_failed", r.game, r.detail(runner.hooks[r.hook]))
            for r in results
            if r.failed and r.hook < len(runner.hooks)
        ]
        if dropped:
            out.append(("hook_failed", None, {"dropped": dropped, "error": "queue full"}))
        return out

    def close(self) -> None:
        if self.runner is not None:
            # Alerts of the last events (supervisor_stop, a FATAL) get a moment to go out.
            self.runner.close(wait_s=HOOKS_CLOSE_WAIT_S)
