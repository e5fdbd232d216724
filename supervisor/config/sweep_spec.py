"""A sweep's definition as the supervisor holds it (frozen dataclasses): its searched
parameters and its study's definition. Parsed and checked by `supervisor.config.sweep`."""

from __future__ import annotations

import json
import math
from dataclasses import dataclass
from typing import Any

Scalar = int | float | str | bool


@dataclass(frozen=True)
class ParamSpace:
    """One searched parameter: a range (`low`..`high`, ints when both ends are ints) or a
    list of values (`choices`)."""

    name: str
    low: float | int | None = None
    high: float | int | None = None
    log: bool = False
    step: float | int | None = None
    choices: tuple[Scalar, ...] = ()

    @property
    def kind(self) -> str:
        """ "int", "float" or "choice"."""
        if self.choices:
            return "choice"
        return "int" if isinstance(self.low, int) and isinstance(self.high, int) else "float"

    def ends(self) -> tuple[Scalar, ...]:
        """The values a drawn one lies between (a range's ends) or among (a list)."""
        if self.choices:
            return self.choices
        assert self.low is not None and self.high is not None
        return (self.low, self.high)

    def grid(self) -> tuple[Scalar, ...] | None:
        """Its points for the grid sampler: a list's values, or an int range (a float range
        needs a `step`); None when it has none."""
        if self.choices:
            return self.choices
        assert self.low is not None and self.high is not None
        if self.kind == "int":
            step = int(self.step or 1)
            return tuple(range(int(self.low), int(self.high) + 1, step))
        if self.step is not None:
            n = math.floor((self.high - self.low) / self.step + 1e-9) + 1
            return tuple(self.low + k * self.step for k in range(n))
        return None

    def as_json(self) -> dict[str, Any]:
        if self.choices:
            return {"choices": list(self.choices)}
        out: dict[str, Any] = {"low": self.low, "high": self.high, "log": self.log}
        if self.step is not None:
            out["step"] = self.step
        return out


@dataclass(frozen=True)
class SweepSpec:
    """A [games.sweep] table: its study's definition (what a stored study must match)."""

    name: str  # the game's: the study's name and its runs' first part
    trials: int
    metric: str
    direction: str
    sampler: str
    pruner: str
    min_trials: int
    seed: int
    space: tuple[ParamSpace, ...]
    seeds: tuple[int, ...]  # each trial's runs
    kind: str  # "builtin" | "command": where the drawn values go (args | params)

    def definition(self) -> dict[str, Any]:
        """What the study is, as stored with it: a study whose definition differs is another
        sweep's (refused at start, never silently reused)."""
        return {
            "metric": self.metric,
            "direction": self.direction,
            "sampler": self.sampler,
            "seed": self.seed,
            "seeds": list(self.seeds),
            "kind": self.kind,
            "space": {p.name: p.as_json() for p in self.space},
        }

    def definition_json(self) -> str:
        return json.dumps(self.definition(), sort_keys=True)

    def trial_name(self, trial: int) -> str:
        return f"{self.name}/t{trial:0{self.width}d}"

    @property
    def width(self) -> int:
        return max(3, len(str(self.trials - 1)))

    def runs_of(self, trial: int) -> list[str]:
        head = self.trial_name(trial)
        return [f"{head}/s{s}" for s in self.seeds] if self.seeds else [head]
