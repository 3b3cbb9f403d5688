// The run page: the run is embedded; the charts' data (metrics, stats) is fetched on load and polled
// while the run is active, so the page itself stays small whatever the size of the run.
"use strict";
(() => {
  const island = document.getElementById("run-data");
  if (!island) return;
  let state = JSON.parse(island.textContent);
  // The trainer's metric and stage names, as /v1/metric-names serves them (embedded with the run).
  const NAMES = state.names;
  const runId = state.run.id;
  const ACTIVE = ["pending", "running"];
  const POLL_MS = 5000;
  // The charts are 480 px wide (charts.js): more steps than that would be drawn on the same pixels.
  const CHART_POINTS = 480;
  const $ = id => document.getElementById(id);
  const union = (items, key) => [...new Set(items.flatMap(p => Object.keys(p[key] || {})))].sort();
  const episodesUrl = params => "/episodes?" + new URLSearchParams({ run_id: runId, ...params });

  function drawRewards(m) {
    const byVersion = m.axis === "version";
    // A long run is charted at every stride-th step (and its latest): say so wherever steps are the x.
    const sampled = m.stride > 1 ? ` (1 step in ${m.stride} of ${m.total_steps}, and the latest)` : "";
    document.querySelectorAll(".axis-name").forEach(el => { el.textContent = byVersion ? "by policy version" : "by training step" + sampled; });
    $("training-stride").textContent = sampled;
    const envs = union(m.points, "by_environment");
    const series = [{ name: "all", points: m.points.filter(p => p.reward_mean !== null).map(p => [p.x, p.reward_mean]) }];
    if (envs.length > 1) {
      for (const env of envs) {
        series.push({ name: env, points: m.points.filter(p => p.by_environment[env] != null).map(p => [p.x, p.by_environment[env]]) });
      }
    }
    const href = byVersion ? (s, x) => episodesUrl(s.name === "all" ? { policy_version: x } : { policy_version: x, environment: s.name }) : null;
    Charts.line($("chart-reward-env"), { series, href, zero: true });
    const comps = union(m.points, "components");
    Charts.line($("chart-reward-components"), {
      series: comps.map(c => ({ name: c, points: m.points.filter(p => p.components[c] != null).map(p => [p.x, p.components[c]]) })),
      zero: true,
    });
    const reasons = union(m.points, "termination");
    const counts = Object.fromEntries(reasons.map(r => [r, m.points.map(p => p.termination[r] || 0)]));
    Charts.stacked($("chart-termination"), {
      xs: m.points.map(p => p.x), keys: reasons, counts, normalize: true,
      href: (reason, x) => episodesUrl(byVersion ? { termination_reason: reason, policy_version: x } : { termination_reason: reason }),
    });
  }

  function drawStats(s) {
    Charts.bars($("chart-staleness"), {
      labels: s.staleness.map(b => String(b.staleness)), values: s.staleness.map(b => b.episodes),
      colorOf: i => (s.staleness[i].staleness > state.run.max_staleness ? "#d92d20" : "#2f5bd3"),
    });
    const labels = s.throughput.map(t => new Date(t.minute).toLocaleTimeString([], { hour: "2-digit", minute: "2-digit" }));
    Charts.line($("chart-throughput"), {
      series: [{ name: "episodes/min", points: s.throughput.map((t, i) => [i, t.episodes]) }], xLabels: labels, zero: true,
    });
    Charts.split($("chart-time-split"), s.time_split);
  }

  function drawTraining(m) {
    const select = $("training-metric");
    const keys = [...new Set(m.steps.flatMap(st => Object.keys(st.metrics).filter(k => typeof st.metrics[k] === "number")))].sort();
    const chosen = select.value || keys.find(k => k.startsWith("loss")) || keys[0];
    select.textContent = "";
    for (const k of keys) select.appendChild(new Option(k, k, false, k === chosen));
    if (!keys.length) return Charts.empty($("chart-training"), "No training steps yet.");
    Charts.line($("chart-training"), {
      series: [{ name: chosen, points: m.steps.filter(st => typeof st.metrics[chosen] === "number").map(st => [st.step, st.metrics[chosen]]) }],
      width: 1000, height: 220,
    });
  }

  // The trainer's cost/* metrics (trainer/cost.py), shown as recorded: no arithmetic here.
  const COST_STAGES = NAMES.cost_stages;
  const COST_ROWS = 10;
  function drawCost(m) {
    const steps = m.steps.filter(st => typeof st.metrics["cost/step/seconds"] === "number");
    const body = document.querySelector("#cost-table tbody");
    body.textContent = "";
    if (!steps.length) {
      Charts.empty($("chart-cost"), "No step has recorded its cost yet.");
      const cell = body.insertRow().insertCell();
      cell.colSpan = COST_STAGES.length + 5;
      cell.className = "empty";
      cell.textContent = "No step has recorded its cost yet.";
      return;
    }
    const counts = Object.fromEntries(COST_STAGES.map(s => [s, steps.map(st => st.metrics[`cost/${s}/seconds`] || 0)]));
    Charts.stacked($("chart-cost"), { xs: steps.map(st => st.step), keys: COST_STAGES, counts });
    for (const st of steps.slice(-COST_ROWS).reverse()) {
      const v = k => (typeof st.metrics[k] === "number" ? Charts.fmt(st.metrics[k]) : "–");
      const row = body.insertRow();
      row.dataset.step = st.step;
      for (const text of [String(st.step), ...COST_STAGES.map(s => v(`cost/${s}/seconds`)), v("cost/update/tokens"),
                          v("cost/step/seconds"), v("cost/flops_per_s"), v("cost/mfu")]) {
        const cell = row.insertCell();
        cell.className = "num";
        cell.textContent = text;
      }
    }
  }

  function kvs(el, values) {
    el.textContent = "";
    for (const [k, v] of Object.entries(values)) {
      const span = document.createElement("span");
      span.className = "kv";
      const b = document.createElement("b");
      b.textContent = v;
      span.append(k + " ", b);
      el.appendChild(span);
    }
  }

  function drawSummary(run) {
    const badge = document.querySelector("#run-status .badge");
    badge.textContent = run.status;
    badge.className = "badge s-" + run.status;
    $("run-version").textContent = run.policy_version;
    kvs($("sum-episodes"), run.summary.episodes);
    kvs($("sum-groups"), run.summary.groups);
    $("sum-reward").textContent = `${Charts.fmt(run.summary.reward_mean)} ± ${Charts.fmt(run.summary.reward_std)}`;
    $("sum-tokens").textContent = `${run.summary.tokens} · ${run.summary.turns}`;
    $("sum-steps").textContent = run.summary.training_steps + (run.summary.latest_step !== null ? ` (latest ${run.summary.latest_step})` : "");
  }

  function draw() {
    drawRewards(state.metrics);
    drawStats(state.stats);
    drawTraining(state.metrics);
    drawCost(state.metrics);
  }

  async function poll() {
    let failed = false;
    try {
      const get = path => fetch(path, { credentials: "same-origin" }).then(r => (r.ok ? r.json() : Promise.reject(r.status)));
      const [run, metrics, stats] = await Promise.all([get(`/v1/runs/${runId}`), get(`/v1/runs/${runId}/metrics?max_points=${CHART_POINTS}`), get(`/v1/runs/${runId}/stats`)]);
      state = { run, metrics, stats };
      drawSummary(run);
      draw();
    } catch (error) {
      failed = true;
      $("live-note").hidden = false;
      $("live-note").textContent = `loading the charts failed (${error}); retrying`;
    }
    if (failed || ACTIVE.includes(state.run.status)) setTimeout(poll, POLL_MS);
    else $("live-note").hidden = true;
  }

  $("training-metric").addEventListener("change", () => state.metrics && drawTraining(state.metrics));
  $("live-note").hidden = !ACTIVE.includes(state.run.status);
  poll();
})();
