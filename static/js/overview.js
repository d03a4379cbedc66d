// The overview's usage chart: the last hour of per-minute rollups, then extended live
// with each second's cluster summary (static/js/live.js).
// The "degraded" line follows each summary's counts: more than the cluster's threshold of
// its nodes paused or unhealthy (Cluster.is_degraded, the same rule).
(function () {
  const line = document.getElementById("degraded");
  if (!line) return;
  const threshold = Number(line.dataset.degradedThreshold);
  document.body.addEventListener("cluster-summary", function (e) {
    const counts = e.detail.counts || {};
    const out = (counts.paused || 0) + (counts.unhealthy || 0);
    const total = Object.values(counts).reduce(function (sum, n) { return sum + n; }, 0);
    line.querySelector('[data-degraded="out"]').textContent = out;
    line.querySelector('[data-degraded="total"]').textContent = total;
    line.hidden = !(total > 0 && out * 100 > total * threshold);
  });
})();

// "no GPU reports it" beside the SM activity figure, while no GPU reports SM activity.
(function () {
  const note = document.getElementById("sm-activity-none");
  if (!note) return;
  document.body.addEventListener("cluster-summary", function (e) {
    const usage = e.detail.usage;
    if (usage) note.hidden = usage.gpu_sm_active_pct !== null && usage.gpu_sm_active_pct !== undefined;
  });
})();

(function () {
  const el = document.getElementById("usage-chart");
  const data = document.getElementById("usage-series");
  if (!el || !data) return;
  // Drawn once plotly.js is there (static/js/plotly_loader.js); live points extend it.
  whenPlotly(function () { drawUsage(JSON.parse(data.textContent)); });

  function drawUsage(s) {
    function lastHour(endMs) {
      return [new Date(endMs - 3600e3).toISOString(), new Date(endMs).toISOString()];
    }
    // The network axis: 0 to a round number (1, 2 or 5 times a power of ten) above the
    // highest value yet, in five steps; it only grows, so its ticks stay put as points arrive.
    function roundCeiling(value) {
      const power = Math.pow(10, Math.floor(Math.log10(Math.max(value, 1))));
      for (const step of [1, 2, 5, 10]) {
        if (step * power >= value) return step * power;
      }
      return 10 * power;
    }
    function networkAxis(top) {
      return { range: [0, top], dtick: top / 5 };
    }
    let networkTop = roundCeiling(Math.max.apply(null, [1].concat(s.net_gbps.filter(Number.isFinite))));
    // SM activity (NVML's GPM, Hopper and later) beside utilization: how hard the GPUs work,
    // not only how often a kernel runs. Null minutes (no GPU reports it) leave a gap.
    const names = ["GPU utilization %", "SM activity %", "GPU memory %", "network Gb/s"];
    const traces = [
      { name: names[0], x: s.minute, y: s.gpu_util_pct, line: { color: "#2f5bd1" } },
      { name: names[1], x: s.minute, y: s.gpu_sm_active_pct, line: { color: "#8a3fc7" } },
      { name: names[2], x: s.minute, y: s.gpu_mem_used_pct, line: { color: "#2e9e5b" } },
      { name: names[3], x: s.minute, y: s.net_gbps, yaxis: "y2", line: { color: "#d59a1c", dash: "dot" } },
    ].map(function (t) { return Object.assign({ type: "scatter", mode: "lines", hovertemplate: "%{y}<extra>" + t.name + "</extra>" }, t); });
    const layout = {
      margin: { l: 40, r: 50, t: 10, b: 30 },
      legend: { orientation: "h", y: 1.15 },
      // Always the last hour, sliding as live points arrive (also before any history exists).
      xaxis: { type: "date", range: lastHour(Date.now()) },
      yaxis: { title: { text: "%" }, range: [0, 100] },
      yaxis2: Object.assign({ title: { text: "Gb/s" }, overlaying: "y", side: "right", showgrid: false },
                            networkAxis(networkTop)),
    };
    Plotly.newPlot(el, traces, layout, { displaylogo: false, responsive: true });

    const HOUR_OF_SECONDS = 3600;
    document.body.addEventListener("cluster-summary", function (e) {
      const usage = e.detail.usage;
      if (!usage) return;
      const smActive = usage.gpu_sm_active_pct === undefined ? null : usage.gpu_sm_active_pct;
      const t = new Date(e.detail.at * 1000).toISOString();
      Plotly.extendTraces(el, {
        x: [[t], [t], [t], [t]],
        y: [[usage.gpu_util_pct], [smActive], [usage.gpu_mem_used_pct], [usage.net_gbps]],
      }, [0, 1, 2, 3], HOUR_OF_SECONDS);
      const update = { "xaxis.range": lastHour(e.detail.at * 1000) };
      if (usage.net_gbps > networkTop) {
        networkTop = roundCeiling(usage.net_gbps);
        const axis = networkAxis(networkTop);
        update["yaxis2.range"] = axis.range;
        update["yaxis2.dtick"] = axis.dtick;
      }
      Plotly.relayout(el, update);
    });
  }
})();
