"""`rlsup pin GAME STEP`: keep one committed checkpoint of a game whatever retention says (and
in the mirror); `--remove` hands it back to retention; `--list` (or no STEP) shows the game's
checkpoints, their evaluations and why each is kept. `rlsup pin --sweep NAME`: in each run of
the sweep's best complete trial, pin its checkpoint with the best evaluation.

The pins are `<run_dir>/checkpoints/pins.json`, written atomically under the lock that the
worker's retention takes while it reads them and deletes (checkpoints/retention.py): a pin
never lands on a checkpoint retention is deleting. Works whether or not the game is running.
"""

from __future__ import annotations

import argparse
import functools
import sys
from typing import Any

from supervisor.commands._common import (
    EXIT_FAIL,
    EXIT_OK,
    EXIT_USAGE,
    add_config_argument,
    become_state_owner,
    load_config_or_exit,
    retention_of,
)
from training.protocol import CHECKPOINT_DIR


def register(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    p = sub.add_parser(
        "pin",
        help="keep a checkpoint of a game whatever retention says (or --remove, --list)",
        description="Pin the committed checkpoint of GAME at STEP: retention (keep_checkpoints, "
        "keep_best, keep_every_steps) and the mirror's garbage collection never delete it. "
        "--remove unpins it; --list, or no STEP, lists the game's checkpoints, their "
        "evaluations and why each is kept. A STEP with no committed checkpoint changes "
        "nothing (exit 2).",
    )
    add_config_argument(p)
    p.add_argument("game", metavar="GAME", nargs="?", help="the game's name from the configuration")
    p.add_argument("step", metavar="STEP", nargs="?", type=_step, help="the checkpoint's step")
    p.add_argument("--remove", action="store_true", help="unpin STEP")
    p.add_argument("--list", action="store_true", help="list the game's checkpoints and pins")
    p.add_argument(
        "--sweep",
        metavar="NAME",
        help="pin the best checkpoint of each run of the sweep's best trial (docs/sweeps.md)",
    )
    p.set_defaults(func=run)


def _step(text: str) -> int:
    try:
        step = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"not a step number: {text!r}") from None
    if step < 0:
        raise argparse.ArgumentTypeError(f"not a step number: {text!r}")
    return step


def run(args: argparse.Namespace) -> int:
    cfg = load_config_or_exit(args)
    games = {g.name: g for g in cfg.games}
    if args.sweep is not None:
        if args.game is not None or args.step is not None or args.remove or args.list:
            print("rlsup pin: --sweep NAME takes no GAME, STEP, --remove or --list",
                  file=sys.stderr)  # fmt: skip
            return EXIT_USAGE
        return pin_best_trial(cfg, args.sweep)
    if args.game is None:
        print("rlsup pin: give a GAME (or --sweep NAME)", file=sys.stderr)
        return EXIT_USAGE
    if args.game not in games:
        print(f"rlsup pin: no game {args.game!r}; configured: {', '.join(games)}", file=sys.stderr)
        return EXIT_USAGE
    if args.step is None and args.remove:
        print("rlsup pin: --remove needs the STEP to unpin", file=sys.stderr)
        return EXIT_USAGE
    from checkpoints import CheckpointStore
    from checkpoints.retention import PinsUnreadable, pins_locked, read_pins, write_pins

    game = games[args.game]
    root = cfg.run_dir(args.game) / CHECKPOINT_DIR
    store = CheckpointStore(root, **retention_of(game))
    if args.list or args.step is None:
        return _list(args.game, store)
    try:
        become_state_owner(cfg.state_dir)  # pins.json must stay readable by the service
        if not root.is_dir():
            return _no_such_step(args.game, args.step, [])
        with pins_locked(root):
            pinned = read_pins(root)
            steps = [ref.step for ref in store.committed()]
            if args.remove:
                if args.step not in pinned:
                    shown = ", ".join(map(str, sorted(pinned))) or "none"
                    print(
                        f"rlsup pin: {args.game}: step {args.step} is not pinned "
                        f"(pinned: {shown}); nothing changed",
                        file=sys.stderr,
                    )
                    return EXIT_USAGE
                write_pins(root, pinned - {args.step})
                print(f"rlsup pin: {args.game}: unpinned step {args.step}")
                return EXIT_OK
            if args.step not in steps:
                return _no_such_step(args.game, args.step, steps)
            if args.step not in pinned:
                write_pins(root, pinned | {args.step})
    except PinsUnreadable as exc:
        print(f"rlsup pin: {args.game}: {exc}; nothing changed", file=sys.stderr)
        return EXIT_FAIL
    except OSError as exc:
        print(f"rlsup pin: {args.game}: {exc}", file=sys.stderr)
        return EXIT_FAIL
    print(f"rlsup pin: {args.game}: pinned step {args.step} ({store.path_for(args.step)})")
    return EXIT_OK


def pin_best_trial(cfg: Any, sweep: str) -> int:
    """Pin, in each run of the sweep's best complete trial, its checkpoint with the best
    evaluation (the newest when none records one)."""
    from checkpoints import CheckpointStore
    from checkpoints.retention import PinsUnreadable, pins_locked, read_pins, write_pins
    from supervisor.observe.sweeps import SweepError, collect_sweep

    try:
        res = collect_sweep(cfg, sweep)
    except KeyError:
        print(f"rlsup pin: no sweep {sweep!r} in the configuration", file=sys.stderr)
        return EXIT_USAGE
    except SweepError as exc:
        print(f"rlsup pin: {exc}", file=sys.stderr)
        return EXIT_FAIL
    best = next((t for t in res.trials if t.trial == res.best), None)
    if best is None:
        print(f"rlsup pin: sweep {sweep}: no complete trial yet; nothing pinned", file=sys.stderr)
        return EXIT_FAIL
    become_state_owner(cfg.state_dir)
    for run in best.runs:
        root = cfg.run_dir(run) / CHECKPOINT_DIR
        store = CheckpointStore(root, **retention_of(cfg.game(run)))
        refs = store.committed() if root.is_dir() else []
        if not refs:
            print(f"rlsup pin: {run} has no committed checkpoint; nothing pinned for it",
                  file=sys.stderr)  # fmt: skip
            continue

        sign = 1.0 if res.direction == "maximize" else -1.0
        chosen = max(refs, key=functools.partial(_ranked, store, sign=sign))
        try:
            with pins_locked(root):
                write_pins(root, read_pins(root) | {chosen.step})
        except (PinsUnreadable, OSError) as exc:
            print(f"rlsup pin: {run}: {exc}; nothing changed", file=sys.stderr)
            return EXIT_FAIL
        print(f"rlsup pin: {run} (trial {best.trial}, the sweep's best): pinned step "
              f"{chosen.step} ({store.path_for(chosen.step)})")  # fmt: skip
    return EXIT_OK


def _ranked(store: Any, ref: Any, *, sign: float) -> tuple[float, int]:
    """A checkpoint's rank for `--sweep`: its evaluation (by the sweep's direction), then its
    step (the newest among equals, or when none records an evaluation)."""
    from checkpoints.errors import CheckpointError
    from checkpoints.retention import eval_score

    try:
        value = eval_score(store.meta(ref))
    except CheckpointError:
        value = None
    return (-float("inf") if value is None else sign * value), ref.step


def _no_such_step(game: str, step: int, steps: list[int]) -> int:
    have = ", ".join(map(str, steps)) or "none"
    print(
        f"rlsup pin: {game} has no committed checkpoint at step {step} "
        f"(its checkpoints: {have}); nothing changed",
        file=sys.stderr,
    )
    return EXIT_USAGE


def _list(game: str, store: Any) -> int:
    from checkpoints.errors import CheckpointError
    from checkpoints.retention import PinsUnreadable, eval_score

    refs = store.committed()
    try:
        kept = store.kept(refs)
    except PinsUnreadable as exc:
        print(f"rlsup pin: {game}: {exc}", file=sys.stderr)
        return EXIT_FAIL
    if not refs:
        print(f"{game}: no committed checkpoint in {store.root}")
        return EXIT_OK
    print(f"{'STEP':>12}  {'EVAL MEAN':>10}  KEPT BECAUSE")
    for ref in refs:
        try:
            score = eval_score(store.meta(ref))
        except CheckpointError:
            score = None
        shown = "-" if score is None else f"{score:.2f}"
        why = ", ".join(kept.get(ref.step, [])) or "- (deleted at the next checkpoint)"
        print(f"{ref.step:>12}  {shown:>10}  {why}")
    return EXIT_OK
