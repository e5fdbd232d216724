// rlsup dashboard: polls /api/status and updates the games table in place; draws one uPlot
// chart per [[games]] table of the metric picked (its variants overlaid, each variant's seeds
// with their mean and min..max band, against agent steps) with the incident markers. Read-only.
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
  drawCharts();
  setInterval(poll, pollMs);
  setInterval(drawCharts, CHART_REFRESH_MS);
})();
