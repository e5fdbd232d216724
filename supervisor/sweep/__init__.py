"""Sweeps (docs/sweeps.md): a study whose trials are runs. `study` keeps the Optuna study in the
state dir; `keeper` is the supervisor's side (a trial's values drawn at its first start, its
evaluations reported to the pruner, its end told, its runs ended with it)."""
