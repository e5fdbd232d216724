// rlsup dashboard: polls /api/status and updates the games table in place; draws one uPlot
// chart per game (mean return against wall time) with the incident markers. Read-only.
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
            for (const m of markers) {
              const x = Math.round(u.valToPos(m.ts, "x", true));
              if (x < u.bbox.left || x > u.bbox.left + u.bbox.width) continue;
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

  const charts = new Map();
  async function drawChart(el) {
    const game = el.dataset.game;
    let doc;
    try {
      const r = await fetch(api("/api/progress", { game: game }), { cache: "no-store" });
      if (!r.ok) throw new Error("HTTP " + r.status);
      doc = await r.json();
    } catch (e) {
      el.textContent = "cannot load the curve (" + e.message + ")";
      return;
    }
    const data = [doc.time, doc.mean_return];
    if (!doc.time.length) {
      el.textContent = "no progress yet";
      el.classList.add("empty");
      return;
    }
    el.classList.remove("empty");
    const old = charts.get(game);
    if (old) {
      old.destroy();
    } else {
      el.textContent = "";
    }
    const opts = {
      width: Math.max(300, el.clientWidth || 560),
      height: 220,
      scales: { x: { time: true } },
      legend: { show: false },
      series: [{}, { label: "mean return", stroke: "#1f77b4", width: 1.5, spanGaps: true }],
      axes: [{}, { label: "mean return" }],
      plugins: [markersPlugin(doc.markers || [])],
    };
    charts.set(game, new uPlot(opts, data, el));
  }

  function drawCharts() {
    if (typeof uPlot === "undefined") return;
    document.querySelectorAll(".chart[data-game]").forEach((el) => {
      drawChart(el);
    });
  }

  drawCharts();
  setInterval(poll, pollMs);
  setInterval(drawCharts, CHART_REFRESH_MS);
})();
