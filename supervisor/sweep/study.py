"""A sweep's Optuna study, kept where a SIGKILL at any point loses nothing.

Storage: Optuna's RDB storage on SQLite, one file per sweep, `<state_dir>/sweeps/<name>.db`
(0600 in a 0700 directory). Chosen over the journal file because every write is one SQLite
transaction (a kill mid-write rolls it back; the same engine and guarantees as the
supervisor's own ledger), and because readers (`rlsup results --sweep`, the dashboard) read it
while the supervisor writes, without a lock file of their own in the state dir.

Trials are re-attached, never re-sampled: the supervisor is the study's only writer and asks
trials in order, so Optuna's trial number N is the sweep's trial N (its runs GAME/tNNN/...). A
trial asked before a crash is RUNNING in the storage with the parameters it had drawn;
`params(N)` re-attaches it (`optuna.trial.Trial(study, id)`: a suggest of a parameter already
drawn returns the stored value) and draws only what it had not drawn yet. `tell` is idempotent
(`skip_if_finished`): a trial told before a crash is not told twice.
"""

from __future__ import annotations

import contextlib
import json
import os
import sqlite3
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, Literal

from supervisor.config.sweep import ParamSpace, SweepSpec

if TYPE_CHECKING:
    import optuna

SWEEPS_DIR = "sweeps"
DEFINITION_ATTR = "rlsup_definition"  # the study's user attribute: SweepSpec.definition_json()
MESSAGE_ATTR = "rlsup_message"  # a trial's user attribute: why it failed or was pruned
RUNS_ATTR = "rlsup_runs"  # a trial's user attribute: its runs' names


class SweepError(RuntimeError):
    """A study that cannot be used as it is (corrupt storage, another sweep's definition):
    refused, naming the file, never silently started afresh."""


def storage_path(state_dir: Path, name: str) -> Path:
    return state_dir / SWEEPS_DIR / f"{name}.db"


@dataclass(frozen=True)
class TrialRow:
    """One trial as the study holds it (`rlsup results --sweep`, the dashboard)."""

    number: int
    state: str  # "running" | "complete" | "pruned" | "fail" | "waiting"
    value: float | None
    params: dict[str, Any]
    intermediate: dict[int, float]
    message: str | None


def _check_storage_file(path: Path) -> None:
    """A file that is there must be an Optuna SQLite store (or empty: made by us, never
    written): anything else is refused, not overwritten."""
    try:
        size = path.stat().st_size
    except FileNotFoundError:
        return
    if size == 0:
        return
    try:
        # Read-write, not mode=ro: a writer SIGKILLed inside a transaction leaves a hot
        # journal, which only a connection that may write rolls back (read-only, SQLite says
        # "attempt to write a readonly database"); its rollback is what makes the kill harmless.
        with contextlib.closing(sqlite3.connect(path, timeout=30)) as conn:
            tables = {r[0] for r in conn.execute("SELECT name FROM sqlite_master")}
    except sqlite3.Error as exc:
        raise SweepError(
            f"{path}: the sweep's study storage is unreadable ({exc}); restore it, or move it "
            "aside to start the sweep afresh (its trials are then lost)"
        ) from None
    if "studies" not in tables or "trials" not in tables:
        raise SweepError(
            f"{path}: not an Optuna study storage (no studies/trials tables); restore it, or "
            "move it aside to start the sweep afresh"
        )


def _private_file(path: Path) -> None:
    path.parent.mkdir(mode=0o700, parents=True, exist_ok=True)
    os.chmod(path.parent, 0o700)
    fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o600)
    os.close(fd)
    os.chmod(path, 0o600)


def _quiet_optuna() -> None:
    import optuna

    optuna.logging.set_verbosity(optuna.logging.WARNING)
    optuna.logging.disable_propagation()


def _storage(path: Path) -> optuna.storages.RDBStorage:
    import optuna

    _quiet_optuna()
    return optuna.storages.RDBStorage(
        f"sqlite:///{path}", engine_kwargs={"connect_args": {"timeout": 30}}
    )


def _sampler(spec: SweepSpec) -> optuna.samplers.BaseSampler:
    import optuna

    if spec.sampler == "random":
        return optuna.samplers.RandomSampler(seed=spec.seed)
    if spec.sampler == "grid":
        grid = {p.name: list(p.grid() or ()) for p in spec.space}

        class Grid(optuna.samplers.GridSampler):
            """Optuna's grid, without its end-of-grid `Study.stop()`: that raises outside
            `optimize` (in the middle of a `tell`, which it would leave undone); the sweep's
            `trials` (at most the grid's size, checked at load) ends it instead."""

            def after_trial(self, *args: Any, **kwargs: Any) -> None:
                return None

        return Grid(grid, seed=spec.seed)
    return optuna.samplers.TPESampler(seed=spec.seed)


def _pruner(spec: SweepSpec) -> optuna.pruners.BasePruner:
    import optuna

    if spec.pruner == "median":
        return optuna.pruners.MedianPruner(n_startup_trials=spec.min_trials, n_warmup_steps=0)
    if spec.pruner == "halving":
        return optuna.pruners.SuccessiveHalvingPruner()
    return optuna.pruners.NopPruner()


def _suggest(trial: optuna.trial.Trial, p: ParamSpace, grid: bool) -> Any:
    if grid or p.kind == "choice":
        choices: list[Any] = list((p.grid() if grid else p.choices) or ())
        return trial.suggest_categorical(p.name, choices)
    assert p.low is not None and p.high is not None
    if p.kind == "int":
        step = int(p.step or 1)
        return trial.suggest_int(p.name, int(p.low), int(p.high), step=step, log=p.log)
    return trial.suggest_float(p.name, float(p.low), float(p.high), log=p.log, step=p.step)


class Study:
    """One sweep's study, opened (created on first use) and checked against its definition."""

    def __init__(self, spec: SweepSpec, state_dir: Path) -> None:
        import optuna

        self.spec = spec
        self.path = storage_path(state_dir, spec.name)
        _check_storage_file(self.path)
        _private_file(self.path)
        try:
            storage = _storage(self.path)
            direction: Literal["maximize", "minimize"] = (
                "maximize" if spec.direction == "maximize" else "minimize"
            )
            self.study = optuna.create_study(
                study_name=spec.name,
                storage=storage,
                sampler=_sampler(spec),
                pruner=_pruner(spec),
                direction=direction,
                load_if_exists=True,
            )
        except Exception as exc:  # sqlalchemy's and Optuna's own: the store is not usable
            raise SweepError(
                f"{self.path}: cannot open the sweep's study storage: {exc}; restore it, or "
                "move it aside to start the sweep afresh (its trials are then lost)"
            ) from None
        stored = self.study.user_attrs.get(DEFINITION_ATTR)
        mine = spec.definition_json()
        if stored is None:
            if self.study.trials:
                raise SweepError(
                    f"{self.path}: study {spec.name!r} has trials but no rlsup definition: "
                    "another program's study; give the sweep another name or move the file aside"
                )
            self.study.set_user_attr(DEFINITION_ATTR, mine)
        elif stored != mine:
            raise SweepError(
                f"{self.path}: study {spec.name!r} was made for another sweep definition "
                f"({_diff(json.loads(stored), spec.definition())}): a changed search is a new "
                "study: give the sweep a new name (its runs are new runs), or restore the "
                "[games.sweep] table it was made with"
            )

    # ---- trials -----------------------------------------------------------------------------

    def _frozen(self, number: int) -> optuna.trial.FrozenTrial | None:
        trials = self.study.get_trials(deepcopy=False)
        return trials[number] if number < len(trials) else None

    def _attach(self, number: int) -> optuna.trial.Trial:
        import optuna

        frozen = self._frozen(number)
        if frozen is None:
            raise KeyError(number)
        return optuna.trial.Trial(self.study, frozen._trial_id)

    def params(self, number: int) -> dict[str, Any]:
        """Trial `number`'s parameters: drawn once (asking any lower trial not asked yet, in
        order), the stored ones ever after."""
        import optuna

        while len(self.study.get_trials(deepcopy=False)) <= number:
            asked = self.study.ask()
            asked.set_user_attr(RUNS_ATTR, self.spec.runs_of(asked.number))
            self._draw(asked)
        frozen = self._frozen(number)
        assert frozen is not None
        if frozen.state is not optuna.trial.TrialState.RUNNING:
            return dict(frozen.params)
        return self._draw(self._attach(number))

    def _draw(self, trial: optuna.trial.Trial) -> dict[str, Any]:
        grid = self.spec.sampler == "grid"
        return {p.name: _suggest(trial, p, grid) for p in self.spec.space}

    def state(self, number: int) -> str:
        """ "waiting" (not asked yet), "running", "complete", "pruned" or "fail"."""
        frozen = self._frozen(number)
        return "waiting" if frozen is None else _state(frozen)

    def report(self, number: int, index: int, value: float) -> bool:
        """Trial `number`'s `index`-th evaluation (the mean over its seeds); True when the
        pruner says to stop it. A report at an index already reported is ignored."""
        frozen = self._frozen(number)
        if frozen is None or _state(frozen) != "running":
            return False
        trial = self._attach(number)
        if index not in frozen.intermediate_values:
            trial.report(value, index)
        return bool(trial.should_prune())

    def tell(self, number: int, state: str, value: float | None, message: str = "") -> str:
        """End trial `number` ("complete" with its value, "pruned" or "fail"); a trial already
        ended keeps its end. Returns the state it has now."""
        import optuna

        frozen = self._frozen(number)
        if frozen is None:
            return "waiting"
        if _state(frozen) != "running":
            return _state(frozen)
        if message:
            self.study._storage.set_trial_user_attr(frozen._trial_id, MESSAGE_ATTR, message)
        states = {
            "complete": optuna.trial.TrialState.COMPLETE,
            "pruned": optuna.trial.TrialState.PRUNED,
            "fail": optuna.trial.TrialState.FAIL,
        }
        values = value if state == "complete" else None
        self.study.tell(number, values, state=states[state], skip_if_finished=True)
        return state

    def rows(self) -> list[TrialRow]:
        return [_row(t) for t in self.study.get_trials(deepcopy=False)]


def _state(frozen: optuna.trial.FrozenTrial) -> str:
    return str(frozen.state.name).lower()


def _row(t: optuna.trial.FrozenTrial) -> TrialRow:
    value = t.value if t.values is not None and len(t.values) == 1 else None
    if value is None and _state(t) == "pruned" and t.intermediate_values:
        value = t.intermediate_values[max(t.intermediate_values)]
    return TrialRow(
        number=t.number,
        state=_state(t),
        value=value,
        params=dict(t.params),
        intermediate=dict(t.intermediate_values),
        message=t.user_attrs.get(MESSAGE_ATTR),
    )


def _diff(old: dict[str, Any], new: dict[str, Any]) -> str:
    keys = sorted(k for k in old.keys() | new.keys() if old.get(k) != new.get(k))
    return "; ".join(f"{k}: {old.get(k)!r} then, {new.get(k)!r} now" for k in keys) or "?"


def read_rows(state_dir: Path, spec: SweepSpec) -> list[TrialRow] | None:
    """The trials of a sweep for a reader (None: the study does not exist yet); raises
    SweepError for a store it cannot read. Never creates or changes the store."""
    import optuna

    path = storage_path(state_dir, spec.name)
    if not path.exists() or path.stat().st_size == 0:
        return None
    _check_storage_file(path)
    storage = None
    try:
        storage = _storage(path)
        study = optuna.load_study(study_name=spec.name, storage=storage)
        return [_row(t) for t in study.get_trials(deepcopy=False)]
    except KeyError:
        return None
    except Exception as exc:
        raise SweepError(f"{path}: cannot read the sweep's study: {exc}") from None
    finally:
        if storage is not None:
            storage.engine.dispose()  # a reader's connection closed now, not at collection
