"""`supervisor.observe.curves` over crafted progress files (no process): any numeric column,
the points a resume superseded dropped (TensorBoard's purge), bad cells dropped and counted,
headers of other versions, thinning; the seeds' band, a game's chart; events as sentences."""

from __future__ import annotations

import math
from pathlib import Path

import pytest

from harness.state_fixture import SUPERSEDED, build_matrix_state, matrix_return
from supervisor.config import load_config
from supervisor.observe import curves as C
from supervisor.observe.sentences import exit_status, sentence, sentences

HEAD = "time,wall_s,global_step,episodes,sps,mean_return,num_envs,batch_size,resume_count"


def csv(*rows: str, head: str = HEAD) -> list[str]:
    return [head + "\n", *(r + "\n" for r in rows)]


def row(t: float, step: int, ret: str = "1.0", life: int = 0, extra: str = "") -> str:
    return f"{t},{t},{step},0,100.0,{ret},8,256,{life}" + extra


def test_any_numeric_column_is_a_curve_by_step_and_by_time() -> None:
    lines = csv(*(row(1000 + k, 100 * k, str(k / 2), extra=f",{k * k}") for k in range(1, 6)),
                head=HEAD + ",td_loss")  # fmt: skip
    c = C.parse(lines, ["mean_return", "td_loss", "sps"])
    assert c.step == [100, 200, 300, 400, 500] and c.time == [1001, 1002, 1003, 1004, 1005]
    assert c.points("td_loss") == [(100, 1), (200, 4), (300, 9), (400, 16), (500, 25)]
    assert c.points("mean_return", "time")[0] == (1001, 0.5)
    assert c.rows == 5 and c.superseded == 0 and c.resumes == 0
    assert C.numeric_columns_of(lines)[:3] == ["wall_s", "episodes", "sps"]
    assert "td_loss" in C.numeric_columns_of(lines)
    assert "time" not in C.numeric_columns_of(lines)  # the axes are no metrics


def test_a_resume_drops_the_points_it_superseded() -> None:
    """Killed at step 500 after a checkpoint at 300: the next life writes from 300 again. Its
    rows win; the old life's rows at or past the step it went back to are gone."""
    old = [row(1000 + k, 100 * k, "-999") if k > 3 else row(1000 + k, 100 * k) for k in range(1, 6)]
    new = [row(2000 + k, 100 * k, "2.0", life=1) for k in range(4, 9)]
    c = C.parse(csv(*old, *new), ["mean_return"])
    assert c.step == [100, 200, 300, 400, 500, 600, 700, 800]
    assert all(b > a for a, b in zip(c.step, c.step[1:], strict=False))  # strictly increasing
    assert SUPERSEDED not in [v for _, v in c.points("mean_return")]
    assert c.superseded == 2 and c.resumes == 1
    assert c.time[3] == 2004  # step 400 is the new life's


def test_a_second_resume_further_back_drops_more() -> None:
    rows = [row(1 + k, 100 * k) for k in range(1, 11)]  # to 1000
    rows += [row(20 + k, 100 * k, life=1) for k in range(6, 9)]  # back to 600, on to 800
    rows += [row(40 + k, 100 * k, life=2) for k in range(3, 13)]  # back to 300, on to 1200
    c = C.parse(csv(*rows), ["mean_return"])
    assert c.step == [100 * k for k in range(1, 13)] and c.resumes == 2
    assert c.time[2:] == [40 + k for k in range(3, 13)]


def test_a_resume_after_the_last_row_drops_nothing_but_is_counted() -> None:
    rows = [row(1, 100), row(2, 200), row(3, 300, life=1), row(4, 400, life=1)]
    c = C.parse(csv(*rows), ["mean_return"])
    assert c.step == [100, 200, 300, 400] and c.superseded == 0 and c.resumes == 1


def test_cells_that_are_no_finite_number_are_dropped_and_counted() -> None:
    rows = [
        row(1, 100, "1.0"),
        row(2, 200, "nan"),
        row(3, 300, "inf"),
        row(4, 400, "-Infinity"),
        row(5, 500, "abc"),
        row(6, 600, ""),  # no value yet: no point, not counted
        row(7, 700, "1e999"),
        row(8, 800, "9" * 100),  # too long to be a number
        row(9, 900, "2.0"),
        "10,10,inf,0,1,3.0,8,256,0",  # no usable step: the row has no place
        "nan,1,1000,0,1,3.0,8,256,0",  # nor time
        "1e300,1,1100,0,1,3.0,8,256,0",  # a time past any calendar
        "12,12,1200",  # a short row (a torn write): its missing cells are no points
    ]
    c = C.parse(csv(*rows), ["mean_return", "sps"])
    assert c.points("mean_return") == [(100, 1.0), (900, 2.0)]
    assert c.dropped == {"mean_return": 6, "sps": 0}
    assert c.bad_rows == 3 and c.step[-1] == 1200
    assert all(math.isfinite(v) for _, v in c.points("sps"))


def test_files_of_other_versions_and_garbage_never_raise(tmp_path: Path) -> None:
    old = C.parse(["time,global_step,mean_return\n", "1,10,0.5\n", "2,20,0.7\n"], ["policy_loss"])
    assert old.step == [10, 20] and old.points("policy_loss") == []  # a column it lacks
    assert old.columns == ("time", "global_step", "mean_return")
    garbage_files = [
        [],
        ["\n"],
        ["time,global_step\n"],
        ['"unterminated\n', "1,2\n"],
        ["time,global_step,x\n", "1,\0\0,3\n", '1,"2\n'],
        ["\xff\xfe,\x00\n"],
    ]
    for garbage in garbage_files:
        c = C.parse(garbage, ["x"])
        assert c.points("x") == [] or all(math.isfinite(v) for _, v in c.points("x"))
    assert C.read_curve(tmp_path / "nothing", ["mean_return"]).step == []
    assert C.numeric_columns(tmp_path / "nothing") == []
    (tmp_path / "progress.csv").write_bytes(b"time,global_step,m\n1,2,\xff\xfe\n3,4,5\n")
    assert C.read_curve(tmp_path, ["m"]).points("m") == [(4, 5)]
    assert C.numeric_columns(tmp_path) == ["m"]


def test_a_column_with_no_number_yet_is_not_offered() -> None:
    lines = csv(row(1, 100, ""), row(2, 200, "", extra=",x"), head=HEAD + ",loss")
    cols = C.numeric_columns_of(lines)
    assert "mean_return" not in cols and "loss" not in cols and "sps" in cols


def test_thinning_keeps_the_first_and_last_points_and_sparse_columns() -> None:
    rows = [
        row(1 + k, 10 * (k + 1), extra="," + ("7" if k % 1000 == 999 else ""))
        for k in range(50_000)
    ]
    c = C.parse(csv(*rows, head=HEAD + ",eval"), ["mean_return", "eval"], max_points=500)
    pts = c.points("mean_return")
    assert 400 <= len(pts) <= 501 and pts[0][0] == 10 and pts[-1][0] == 500_000
    assert len(c.step) <= 501 and c.step[-1] == 500_000
    assert len(c.points("eval")) == 50  # one in a thousand rows: every one kept


def test_band_is_over_every_run_where_all_reached() -> None:
    a = [(0.0, 0.0), (100.0, 10.0)]
    b = [(0.0, 0.0), (100.0, 20.0)]
    short = [(0.0, 0.0), (50.0, 30.0)]
    band = C.band([a, b, short], points=3)
    assert band is not None and band.x == [0.0, 25.0, 50.0] and band.runs == 3
    assert band.mean[-1] == pytest.approx((5 + 10 + 30) / 3)
    assert (band.lo[-1], band.hi[-1]) == (5, 30)
    assert C.band([a, [(200.0, 1.0), (300.0, 2.0)]]) is None  # no common range
    assert C.band([[(0.0, 1.0)]]) is None


def test_durations_read_as_minutes_hours_days() -> None:
    assert [C.format_duration(s) for s in (0, 45, 60, 90, 3600, 3900, 86400 + 7200)] == [
        "0s", "45s", "1m", "1m30s", "1h00", "1h05", "1d02h",
    ]  # fmt: skip
    ticks = C.duration_ticks(0, 5 * 3600)
    assert ticks[:2] == [0, 3600] and all(t % 3600 == 0 for t in ticks)
    assert C.duration_ticks(0, 600) == [0, 120, 240, 360, 480, 600]


def test_a_matrix_state_gives_a_chart_of_variants_with_seeds_mean_and_band(
    tmp_path: Path,
) -> None:
    fx = build_matrix_state(tmp_path, bad_cells=3)
    cfg = load_config(fx.config)
    tables = C.group_runs((g.name, g.group) for g in cfg.games)
    assert list(tables) == ["cart"]
    assert tables["cart"] == {
        "cart/base": ["cart/base/s1", "cart/base/s2", "cart/base/s3"],
        "cart/lr3": ["cart/lr3/s1", "cart/lr3/s2", "cart/lr3/s3"],
    }
    read = {r: C.read_curve(cfg.run_dir(r), ["mean_return", "my_metric"])
            for runs in tables["cart"].values() for r in runs}  # fmt: skip
    resumed = read["cart/lr3/s2"]
    assert resumed.superseded == 36 and resumed.resumes == 1
    assert SUPERSEDED not in [v for _, v in resumed.points("mean_return")]
    assert read["cart/base/s1"].dropped["my_metric"] == 3
    doc = C.chart("cart", tables["cart"], read, "mean_return", points=50)
    assert [v["group"] for v in doc["variants"]] == ["cart/base", "cart/lr3"]
    assert all(v["runs"] == 3 and v["band"] for v in doc["variants"])
    assert doc["variants"][0]["colour"] != doc["variants"][1]["colour"]
    roles = [(s["group"], s["role"]) for s in doc["series"]]
    assert roles.count(("cart/lr3", "run")) == 3 and ("cart/lr3", "mean") in roles
    assert ("cart/base", "min") in roles and ("cart/base", "max") in roles
    assert len(doc["x"]) == 50 and all(len(s["values"]) == 50 for s in doc["series"])
    assert doc["superseded"] == 36
    mean = next(s for s in doc["series"] if s["role"] == "mean" and s["group"] == "cart/lr3")
    last = mean["values"][-1]  # at the last step: the seeds' mean of variant 1's return
    assert last == pytest.approx(sum(matrix_return(1, s, 1.0) for s in (1, 2, 3)) / 3, rel=1e-3)
    lo = next(s for s in doc["series"] if s["role"] == "min" and s["group"] == "cart/lr3")
    assert lo["values"][-1] == pytest.approx(matrix_return(1, 1, 1.0), rel=1e-3)


# ---- events as sentences ---------------------------------------------------------------------


def test_a_crash_and_its_restart_read_as_sentences() -> None:
    events = [
        {"ts": 100.0, "kind": "worker_exit", "game": "pong", "detail": {
            "returncode": 137, "exit": "crash", "uptime_s": 600, "global_step": 12288,
            "last_checkpoint_step": 12032}},
        {"ts": 100.01, "kind": "worker_crash", "game": "pong", "detail": {
            "returncode": 137, "description": "exit status 137 (crash)"}},
        {"ts": 100.02, "kind": "backoff", "game": "pong", "detail": {
            "reason": "crash", "delay_s": 4.0, "failures": 2, "budget": 5}},
        {"ts": 104.0, "kind": "restart", "game": "pong", "detail": {"restarts": 2}},
    ]  # fmt: skip
    said = sentences(events)
    assert said[0] == "pong's worker crashed (exit 137: SIGKILL) after 10 min at step 12,288; " \
        "its last checkpoint was step 12,032"  # fmt: skip
    assert said[1] == "pong crashed (exit 137: SIGKILL) at step 12,288; its last checkpoint " \
        "was step 12,032"  # fmt: skip
    assert said[2] == "pong restarts in 4 s, 2 failure(s) of a budget of 5: crash"
    assert (
        said[3] == "pong was restarted (restart 2), resuming from its last checkpoint, step 12,032"
    )


def test_sentences_of_other_kinds_and_of_malformed_details() -> None:
    assert exit_status(-9) == "killed by SIGKILL" and exit_status(1) == "exit 1"
    assert exit_status("x") is None and exit_status(float("inf")) is None
    ev = {"ts": 1.0, "kind": "evaluation", "game": "cart/s1",
          "detail": {"step": 4096, "mean": 187.25, "episodes": 10}}  # fmt: skip
    assert (
        sentence(ev) == "cart/s1 was evaluated at step 4,096: mean return 187.25 over 10 episodes"
    )
    reboot = {"ts": 1, "kind": "host_reboot", "game": None, "detail": {"downtime_s": 120}}
    assert sentence(reboot) == "the host rebooted unexpectedly (down 2 min)"
    why = {"from": "medium", "to": "light", "reasons": ["2 worker_oom in 1h"]}
    scale = {"ts": 1, "kind": "scale_down", "game": None, "detail": why}
    assert sentence(scale) == "every game went from mode medium to light: 2 worker_oom in 1h"
    assert sentence({"ts": 1, "kind": "some_new_kind", "game": "g",
                     "detail": {"reason": "why"}}) == "g: some new kind: why"  # fmt: skip
    for detail in ({"returncode": "x", "global_step": [1], "message": 5}, [], "text", None,
                   {"global_step": float("nan"), "last_checkpoint_step": True}):  # fmt: skip
        for kind in ("worker_crash", "worker_exit", "restart", "backoff", "evaluation",
                     "scale_up", "worker_hang", "mode_pinned", "fatal"):  # fmt: skip
            text = sentence({"ts": 1, "kind": kind, "game": "g", "detail": detail})
            assert text.startswith(("g", "an operator")) and "None" not in text, (kind, text)
    long = sentence({"ts": 1, "kind": "fatal", "game": "g", "detail": {"reason": "x" * 5000}})
    assert len(long) < 300
