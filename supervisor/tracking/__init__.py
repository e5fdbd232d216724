"""Tracking: each run's progress and evaluations sent on to the trackers researchers use
(TensorBoard event files for command games, MLflow for every run), by the supervisor, never by
the training process, and only up to what no resume can redo; and the W&B environment that
lets a command game's own `wandb.init()` continue one run across restarts (`wandb`).

`progress` reads progress.csv incrementally and judges rows final; `state` keeps the bridge's
position; `sinks` writes; `bridge` is the thread that ties them; the daemon's participant
(`supervisor.participants.tracking`) hands it each tick's runs and records its events.
"""
