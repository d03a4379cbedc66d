// The overview's usage chart: the last hour of per-minute cluster rollups.
(function () {
  const el = document.getElementById("usage-chart");
  const data = document.getElementById("usage-series");
  if (!el || !data || !window.Plotly) return;
  const s = JSON.parse(data.textContent);
  const traces = [
    { name: "GPU utilization %", x: s.minute, y: s.gpu_util_pct, line: { color: "#2f5bd1" } },
    { name: "GPU memory %", x: s.minute, y: s.gpu_mem_used_pct, line: { color: "#2e9e5b" } },
    { name: "network Gb/s", x: s.minute, y: s.net_gbps, yaxis: "y2", line: { color: "#d59a1c", dash: "dot" } },
  ].map(function (t) { return Object.assign({ type: "scatter", mode: "lines", hovertemplate: "%{y}<extra>" + t.name + "</extra>" }, t); });
  const layout = {
    margin: { l: 40, r: 50, t: 10, b: 30 },
    legend: { orientation: "h", y: 1.15 },
    xaxis: { type: "date" },
    yaxis: { title: { text: "%" }, range: [0, 100] },
    yaxis2: { title: { text: "Gb/s" }, overlaying: "y", side: "right", rangemode: "tozero", showgrid: false },
  };
  Plotly.newPlot(el, traces, layout, { displaylogo: false, responsive: true });
})();
