// rlsup dashboard: polls /api/status and updates the games table in place; draws one uPlot
// chart per [[games]] table of the metric picked (its variants overlaid, each variant's seeds
// with their mean and min..max band, against agent steps) with the incident markers; for each
// sweep, its ranked trials (refreshed), the best value so far over trials and the value against
// each parameter. Read-only.
"use strict";
(function () {
  const body = document.body;
  const pollMs = Number(body.dataset.pollMs) || 2000;
  const token = body.dataset.token || "";
  const CHART_REFRESH_MS = 30000;

  function api(path, params) {
    const q = new URLSearchParams(params || {});
    if (token) q.set("token", token);
    const s = q.toString();
    return path + (s ? "?" + s : "");
  }

  function num(v, digits) {
    if (typeof v !== "number" || !isFinite(v)) return "-";
    return v.toLocaleString("en-US", {
      minimumFractionDigits: digits,
      maximumFractionDigits: digits,
    });
  }

  function count(v) {
    return typeof v === "number" ? v.toLocaleString("en-US") : "-";
  }

  // The same cells as the server's game_cells (supervisor/observe/dashboard.py).
  function cells(g) {
    let ev = "-";
    if (g.eval_return !== null && g.eval_return !== undefined) {
      ev = num(g.eval_return, 1) + (g.eval_step ? " @" + count(g.eval_step) : "");
    }
    return {
      state: g.state,
      steps: count(g.global_step) + " / " + count(g.total_steps),
      percent: num(g.percent, 1),
      sps: num(g.sps, 0),
      mean_return: num(g.mean_return, 1),
      eval: ev,
      restarts: String(g.restarts),
      checkpoint: g.last_checkpoint_step === null ? "-" : count(g.last_checkpoint_step),
      mode: g.mode || "-",
      device: g.device || "-",
    };
  }

  function supervisorLine(doc) {
    const s = doc.supervisor;
    if (s.state === "absent") {
      return doc.db_present
        ? "supervisor not started"
        : "no state yet: no state database in " + doc.state_dir + " (never run)";
    }
    if (s.state === "running") return "supervisor running (pid " + s.pid + ")";
    if (s.state === "stale") return "supervisor STALE (pid " + s.pid + " alive but not ticking)";
    return "supervisor stopped" + (s.clean_stop ? " cleanly" : " (no clean stop)");
  }

  function applyStatus(doc) {
    const rows = new Map();
    document.querySelectorAll("#games tr[data-game]").forEach((tr) => {
      rows.set(tr.dataset.game, tr);
    });
    for (const g of doc.games) {
      const tr = rows.get(g.name);
      if (!tr) continue;
      const c = cells(g);
      tr.querySelectorAll("td[data-field]").forEach((td) => {
        const field = td.dataset.field;
        if (!(field in c) || td.textContent === c[field]) return;
        td.textContent = c[field];
        if (field === "state") td.className = "state state-" + c.state;
      });
    }
    const sup = document.getElementById("supervisor");
    if (sup) {
      sup.textContent = supervisorLine(doc);
      sup.className = "sup-" + doc.supervisor.state;
    }
  }

  const stamp = document.getElementById("stamp");
  async function poll() {
    try {
      const r = await fetch(api("/api/status"), { cache: "no-store" });
      if (!r.ok) throw new Error("HTTP " + r.status);
      applyStatus(await r.json());
      stamp.textContent = "updated " + new Date().toLocaleTimeString();
      stamp.classList.remove("error");
    } catch (e) {
      stamp.textContent = "cannot reach the dashboard (" + e.message + ")";
      stamp.classList.add("error");
    }
  }

  function markersPlugin(markers) {
    return {
      hooks: {
        draw: [
          (u) => {
            const ctx = u.ctx;
            const top = u.bbox.top;
            const bottom = top + u.bbox.height;
            const seen = new Set();
            for (const m of markers) {
              const x = Math.round(u.valToPos(m.x, "x", true));
              if (x < u.bbox.left || x > u.bbox.left + u.bbox.width) continue;
              if (seen.has(x + m.colour)) continue;
              seen.add(x + m.colour);
              ctx.save();
              ctx.strokeStyle = m.colour;
              ctx.lineWidth = 1.5 * devicePixelRatio;
              ctx.setLineDash([6, 4]);
              ctx.beginPath();
              ctx.moveTo(x, top);
              ctx.lineTo(x, bottom);
              ctx.stroke();
              ctx.restore();
            }
          },
        ],
      },
    };
  }

  const metricSelect = document.getElementById("metric");
  function metric() {
    return metricSelect && metricSelect.value ? metricSelect.value : "mean_return";
  }

  // The legend under a chart: one swatch per variant (the runs' colour), what is drawn.
  function drawLegend(table, doc) {
    const box = document.querySelector('.chart-legend[data-legend="' + CSS.escape(table) + '"]');
    if (!box) return;
    box.replaceChildren();
    for (const v of doc.variants) {
      const item = document.createElement("span");
      item.className = "variant";
      item.dataset.group = v.group;
      const swatch = document.createElement("span");
      swatch.className = "swatch";
      swatch.style.background = v.colour;
      item.appendChild(swatch);
      const what = v.band
        ? ": " + v.runs + " seeds, mean and min..max band"
        : v.runs > 1
          ? ": " + v.runs + " seeds (no common range yet)"
          : "";
      item.appendChild(document.createTextNode(v.group + what));
      box.appendChild(item);
    }
    if (doc.superseded) {
      const note = document.createElement("span");
      note.className = "muted";
      note.textContent = doc.superseded.toLocaleString("en-US") + " point(s) redone after a resume dropped";
      box.appendChild(note);
    }
  }

  // One chart per [[games]] table: every run of every variant against agent steps; a variant
  // of several seeds also its mean (bold) and its min..max band (filled).
  const charts = new Map();
  async function drawChart(el) {
    const table = el.dataset.table;
    const name = metric();
    let doc;
    try {
      const r = await fetch(api("/api/curves", { game: table, metric: name }), {
        cache: "no-store",
      });
      if (!r.ok) throw new Error("HTTP " + r.status);
      doc = await r.json();
    } catch (e) {
      if (charts.has(table)) charts.get(table).destroy();
      charts.delete(table);
      el.textContent = "cannot load the curves (" + e.message + ")";
      return;
    }
    if (name !== metric()) return; // another metric was picked meanwhile: its draw wins
    const old = charts.get(table);
    if (old) {
      old.destroy();
      charts.delete(table);
    }
    drawLegend(table, doc);
    if (!doc.x.length) {
      el.textContent = "no " + name + " values yet";
      el.classList.add("empty");
      return;
    }
    el.classList.remove("empty");
    el.textContent = "";
    const banded = new Set(doc.variants.filter((v) => v.band).map((v) => v.group));
    const data = [doc.x];
    const series = [{}];
    const edges = new Map();
    for (const s of doc.series) {
      data.push(s.values);
      const i = data.length - 1;
      if (s.role === "run") {
        const thin = banded.has(s.group);
        series.push({ label: s.run, stroke: s.colour + (thin ? "59" : ""), width: thin ? 1 : 1.6,
                      spanGaps: true, points: { show: false } });
      } else if (s.role === "mean") {
        series.push({ label: s.group + " mean", stroke: s.colour, width: 2.4, spanGaps: true,
                      points: { show: false } });
      } else {
        series.push({ label: s.group + " " + s.role, stroke: "transparent", width: 0,
                      spanGaps: true, points: { show: false } });
        const e = edges.get(s.group) || { colour: s.colour };
        e[s.role] = i;
        edges.set(s.group, e);
      }
    }
    const bands = [];
    for (const e of edges.values()) {
      if (e.max !== undefined && e.min !== undefined) {
        bands.push({ series: [e.max, e.min], fill: e.colour + "2e" });
      }
    }
    const opts = {
      width: Math.max(300, el.clientWidth || 560),
      height: 260,
      scales: { x: { time: false } },
      legend: { show: false },
      series: series,
      bands: bands,
      axes: [{ label: "agent steps" }, { label: name }],
      plugins: [markersPlugin(doc.markers || [])],
    };
    el.dataset.metric = name;
    el.dataset.series = String(series.length - 1);
    el.dataset.bands = String(bands.length);
    charts.set(table, new uPlot(opts, data, el));
  }

  function drawCharts() {
    if (typeof uPlot === "undefined") return;
    document.querySelectorAll(".chart[data-table]").forEach((el) => {
      drawChart(el);
    });
  }

  // The metric picked is kept in the URL's fragment (#metric=NAME): a reload or a shared link
  // shows the same one, picked from the same list (a name not in it is ignored).
  if (metricSelect) {
    const wanted = new URLSearchParams(location.hash.slice(1)).get("metric");
    if (wanted && Array.from(metricSelect.options).some((o) => o.value === wanted)) {
      metricSelect.value = wanted;
    }
    metricSelect.addEventListener("change", () => {
      history.replaceState(null, "", "#metric=" + encodeURIComponent(metricSelect.value));
      drawCharts();
    });
  }

  // ---- sweeps: each one's ranked trials, the best so far over trials, value per parameter ----

  // Python's format(v, ".4g"), as the server writes a parameter (dashboard_sweeps.param_text).
  function fmtG(v) {
    if (!isFinite(v)) return String(v);
    if (v === 0) return "0";
    const parts = v.toExponential(3).split("e");
    const e = Number(parts[1]);
    if (e < -4 || e >= 4) {
      const m = parts[0].replace(/\.?0+$/, "");
      return m + "e" + (e < 0 ? "-" : "+") + String(Math.abs(e)).padStart(2, "0");
    }
    return v.toFixed(Math.max(0, 3 - e)).replace(/(\.\d*?)0+$/, "$1").replace(/\.$/, "");
  }

  function paramText(v, space) {
    if (v === undefined || v === null) return "-";
    if (typeof v === "boolean") return v ? "true" : "false";
    if (typeof v === "number") {
      const float = space && space.kind === "float";
      return !float && Number.isInteger(v) ? String(v) : fmtG(v);
    }
    return String(v);
  }

  // The same cells as the server's trial_cells (supervisor/observe/dashboard_sweeps.py).
  function sweepCells(t, space) {
    let value = num(t.value, 2);
    if (t.value !== null && t.std !== null) value += " ± " + num(t.std, 2);
    return [
      t.rank === null ? "-" : String(t.rank), t.name, t.state, value,
      ...space.map((p) => paramText(t.params[p.name], p)),
      count(t.steps), num(t.hours, 2), num(t.money, 2), t.message || "",
    ];
  }

  const STATES = ["complete", "pruned", "running", "fail", "waiting"];
  function sweepLine(doc) {
    const counts = STATES.filter((s) => doc.counts[s]).map((s) => doc.counts[s] + " " + s);
    const best = doc.trials.find((t) => t.trial === doc.best);
    let said = "none complete yet";
    if (best) {
      said = best.name + ", " + doc.metric + " " + num(best.value, 2) +
        (best.std === null ? "" : " ± " + num(best.std, 2));
    }
    return doc.direction + " " + doc.metric + " over " + doc.trials_configured +
      " trial(s), sampler " + doc.sampler + ", pruner " + doc.pruner + ": " +
      counts.join(", ") + "; best: " + said;
  }

  function td(text, cls) {
    const cell = document.createElement("td");
    if (cls) cell.className = cls;
    cell.textContent = text;
    return cell;
  }

  function fillSweepTable(box, doc) {
    const tbody = box.querySelector("table.sweep-trials tbody");
    if (!tbody) return;
    const rows = [];
    const waiting = doc.trials.filter((t) => t.state === "waiting");
    for (const t of doc.trials) {
      if (t.state === "waiting") continue;
      const tr = document.createElement("tr");
      tr.dataset.trial = String(t.trial);
      if (t.trial === doc.best) tr.className = "best";
      const c = sweepCells(t, doc.space);
      c.forEach((text, i) => {
        const cls = i === 2 ? "state state-" + text : i === c.length - 1 ? "detail" : "";
        tr.appendChild(td(text, cls));
      });
      rows.push(tr);
    }
    if (waiting.length) {
      const tr = document.createElement("tr");
      tr.className = "waiting-rest";
      const first = waiting[0].name;
      const last = waiting[waiting.length - 1].name;
      const span = waiting.length === 1 ? first : first + " .. " + last;
      const cell = td(waiting.length + " trial(s) not started yet: " + span);
      cell.colSpan = 8 + doc.space.length;
      tr.appendChild(cell);
      rows.push(tr);
    }
    tbody.replaceChildren(...rows);
    const line = box.querySelector(".sweep-summary");
    if (line) line.textContent = sweepLine(doc);
  }

  const SWEEP_COLOURS = { best: "#0550ae", complete: "#1a7f37", pruned: "#8a8f98" };
  function pointsSeries(label, colour, hollow) {
    return {
      label: label, stroke: colour, width: 0, paths: () => null,
      points: { show: true, size: 8, width: 1.5, stroke: colour, fill: hollow ? "#fff" : colour },
    };
  }

  // x: trial number (up to the newest asked); the best complete value after each trial (a
  // step line), each complete trial's value (dots), each pruned trial's last value (rings).
  function bestChart(el, doc) {
    const asked = doc.trials.filter((t) => t.state !== "waiting");
    const scored = asked.filter((t) => t.value !== null && (t.state === "complete" ||
                                                            t.state === "pruned"));
    if (!scored.length) {
      el.textContent = "no trial has a value yet";
      el.classList.add("empty");
      return null;
    }
    const last = Math.max(...asked.map((t) => t.trial));
    const byTrial = new Map(doc.trials.map((t) => [t.trial, t]));
    const x = [];
    const best = [];
    const complete = [];
    const pruned = [];
    const soFar = new Map(doc.best_so_far.map((p) => [p[0], p[1]]));
    for (let n = 0; n <= last; n++) {
      const t = byTrial.get(n);
      x.push(n);
      best.push(soFar.has(n) ? soFar.get(n) : null);
      complete.push(t && t.state === "complete" ? t.value : null);
      pruned.push(t && t.state === "pruned" ? t.value : null);
    }
    const stepped = uPlot.paths && uPlot.paths.stepped ? uPlot.paths.stepped({ align: 1 }) : undefined;
    const series = [
      {},
      { label: "best so far", stroke: SWEEP_COLOURS.best, width: 2, paths: stepped,
        points: { show: false } },
      pointsSeries("complete", SWEEP_COLOURS.complete, false),
      pointsSeries("pruned", SWEEP_COLOURS.pruned, true),
    ];
    el.dataset.trials = String(x.length);
    el.dataset.complete = String(complete.filter((v) => v !== null).length);
    el.dataset.pruned = String(pruned.filter((v) => v !== null).length);
    return {
      opts: {
        scales: { x: { time: false } },
        axes: [{ label: "trial", incrs: [1, 2, 5, 10, 20, 50, 100, 200, 500, 1000] },
               { label: doc.metric }],
        series: series,
      },
      data: [x, best, complete, pruned],
    };
  }

  // x: the parameter's value (a log axis for a range searched on a log scale; a list of
  // values that are not all numbers, one slot per value); y: the trial's value.
  function paramChart(el, doc, name) {
    const space = doc.space.find((p) => p.name === name);
    if (!space) return null;
    const pts = doc.trials.filter((t) => t.value !== null && name in t.params &&
      (t.state === "complete" || t.state === "pruned"));
    if (!pts.length) {
      el.textContent = "no trial has a value yet";
      el.classList.add("empty");
      return null;
    }
    const labels = space.kind === "choice" && !space.choices.every((c) => typeof c === "number")
      ? space.choices.map((c) => paramText(c, space)) : null;
    const xOf = (v) => (labels ? space.choices.findIndex((c) => c === v) : v);
    const rows = pts.map((t) => [xOf(t.params[name]), t]).filter((r) => typeof r[0] === "number" &&
      (!space.log || r[0] > 0));
    rows.sort((a, b) => a[0] - b[0]);
    const x = rows.map((r) => r[0]);
    const complete = rows.map((r) => (r[1].state === "complete" ? r[1].value : null));
    const pruned = rows.map((r) => (r[1].state === "pruned" ? r[1].value : null));
    const xScale = { time: false };
    const xAxis = { label: name };
    if (labels) {
      xScale.range = [-0.5, labels.length - 0.5];
      xAxis.splits = () => labels.map((_, i) => i);
      xAxis.values = (u, splits) => splits.map((v) => (labels[v] === undefined ? "" : labels[v]));
      el.dataset.scale = "category";
    } else {
      // The searched range (a list's smallest and largest value), a little wider: where in
      // the space the trials fell, each point whole.
      const ends = space.choices ? space.choices : [space.low, space.high];
      const lo = Math.min(...ends, ...x);
      const hi = Math.max(...ends, ...x);
      xAxis.values = (u, splits) => splits.map((v) => (v === null ? "" : fmtG(v)));
      if (space.log) {
        const f = hi > lo ? Math.pow(hi / lo, 0.04) : 2;
        xScale.distr = 3;
        xScale.log = 10;
        xScale.range = [lo / f, hi * f];
        el.dataset.scale = "log";
      } else {
        const pad = (hi - lo) * 0.04 || Math.abs(lo) * 0.1 || 1;
        xScale.range = [lo - pad, hi + pad];
        el.dataset.scale = "linear";
      }
    }
    el.dataset.complete = String(complete.filter((v) => v !== null).length);
    el.dataset.pruned = String(pruned.filter((v) => v !== null).length);
    return {
      opts: {
        scales: { x: xScale },
        axes: [xAxis, { label: doc.metric }],
        series: [{}, pointsSeries("complete", SWEEP_COLOURS.complete, false),
                 pointsSeries("pruned", SWEEP_COLOURS.pruned, true)],
      },
      data: [x, complete, pruned],
    };
  }

  const sweepPlots = new Map();
  function plotInto(el, key, made, height) {
    const old = sweepPlots.get(key);
    if (old) {
      old.destroy();
      sweepPlots.delete(key);
    }
    if (!made) return;
    el.classList.remove("empty");
    el.textContent = "";
    const opts = Object.assign({ width: Math.max(240, el.clientWidth || 300), height: height,
                                 legend: { show: false } }, made.opts);
    sweepPlots.set(key, new uPlot(opts, made.data, el));
    el.dataset.drawn = "1";
  }

  async function drawSweep(box) {
    const name = box.dataset.sweep;
    const charts = box.querySelectorAll(".sweep-chart");
    let doc;
    try {
      const r = await fetch(api("/api/sweep", { name: name }), { cache: "no-store" });
      if (!r.ok) throw new Error((await r.text()).trim() || "HTTP " + r.status);
      doc = await r.json();
    } catch (e) {
      charts.forEach((el) => {
        const key = name + "\0" + (el.dataset.param || el.dataset.kind);
        plotInto(el, key, null, 0);
        el.textContent = "cannot load the sweep (" + e.message + ")";
        el.classList.add("error");
      });
      return;
    }
    fillSweepTable(box, doc);
    charts.forEach((el) => {
      el.classList.remove("error");
      const key = name + "\0" + (el.dataset.param || el.dataset.kind);
      const made = el.dataset.kind === "best" ? bestChart(el, doc)
        : paramChart(el, doc, el.dataset.param);
      plotInto(el, key, made, el.dataset.kind === "best" ? 240 : 200);
    });
  }

  function drawSweeps() {
    if (typeof uPlot === "undefined") return;
    document.querySelectorAll(".sweep[data-sweep]").forEach((box) => {
      drawSweep(box);
    });
  }

  drawCharts();
  drawSweeps();
  setInterval(poll, pollMs);
  setInterval(() => {
    drawCharts();
    drawSweeps();
  }, CHART_REFRESH_MS);
})();
