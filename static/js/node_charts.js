// The node page's charts: one per GPU metric (utilization, SM activity, memory, temperature,
// power), one line per GPU. The per-minute means of the last hour or day come from the charts URL; the
// node's latest sample is fetched from the live URL every 5 s and extends the lines.
(function () {
  const panel = document.getElementById("node-charts-panel");
  if (!panel) return;
  const current = panel.querySelector("[data-range][aria-current]");
  const range = current ? current.dataset.range : "hour";
  const spanMs = range === "day" ? 86400e3 : 3600e3;
  const charts = Array.from(panel.querySelectorAll(".chart[data-metric]"));
  const units = { util_pct: "%", sm_active_pct: "%", mem_used_bytes: "GiB", temp_c: "°C", power_w: "W" };
  const titles = { util_pct: "utilization", sm_active_pct: "SM activity", mem_used_bytes: "memory used",
                   temp_c: "temperature", power_w: "power" };
  // Said on a chart whose metric no GPU reports over the whole range.
  const noneReported = {
    sm_active_pct: "No SM activity from these GPUs: NVML's GPM metrics need Hopper or later",
  };
  const GIB = 1073741824;
  let uuids = [];
  let lastMs = 0; // the newest point drawn: a live sample no newer is not appended

  // Fixed axes in units a person reads: utilization 0-100 %, memory 0 to the GPU's own
  // memory, temperature 0-100 °C, power 0 to a round 100 W above the highest seen.
  function yAxis(metric, data) {
    if (metric === "mem_used_bytes") {
      const total = Math.max.apply(null, [0].concat(data.gpus.map(function (gpu) {
        return gpu.memory_total_bytes || 0;
      })));
      return total ? { range: [0, Math.ceil(total / GIB)] } : { rangemode: "tozero" };
    }
    if (metric === "power_w") {
      let peak = 0;
      data.gpus.forEach(function (gpu) {
        data.series[gpu.uuid].power_w.forEach(function (v) { if (v > peak) peak = v; });
      });
      return { range: [0, Math.max(100, Math.ceil(peak / 100) * 100)] };
    }
    return { range: [0, 100] };
  }

  function value(metric, v) {
    if (v === null || v === undefined) return null;
    return metric === "mem_used_bytes" ? Math.round(v / GIB * 10) / 10 : v;
  }
  function window_(endMs) {
    return [new Date(endMs - spanMs).toISOString(), new Date(endMs).toISOString()];
  }

  function draw(data) {
    uuids = data.gpus.map(function (gpu) { return gpu.uuid; });
    if (data.minute.length) lastMs = Date.parse(data.minute[data.minute.length - 1]);
    document.getElementById("charts-empty").hidden = data.minute.length > 0;
    charts.forEach(function (el) {
      const metric = el.dataset.metric;
      const traces = data.gpus.map(function (gpu) {
        return {
          type: "scatter", mode: "lines", name: "GPU " + gpu.index, x: data.minute.slice(),
          y: data.series[gpu.uuid][metric].map(function (v) { return value(metric, v); }),
          hovertemplate: "%{y} " + units[metric] + "<extra>GPU " + gpu.index + "</extra>",
        };
      });
      const reported = data.gpus.some(function (gpu) {
        return data.series[gpu.uuid][metric].some(function (v) { return v !== null; });
      });
      const layout = {
        title: { text: titles[metric] + " (" + units[metric] + ")", font: { size: 13 } },
        annotations: !reported && data.minute.length && noneReported[metric] ? [{
          text: noneReported[metric], xref: "paper", yref: "paper", x: 0.5, y: 0.5,
          showarrow: false, font: { color: "#666" } }] : [],
        margin: { l: 45, r: 10, t: 30, b: 30 }, showlegend: metric === "util_pct",
        legend: { orientation: "h", y: -0.2 },
        // Times only (the day's date would sit on the legend); the hover says the day.
        xaxis: { type: "date", range: window_(Date.now()),
                 tickformat: range === "day" ? "%b %-d %H:%M" : "%H:%M", hoverformat: "%b %-d %H:%M" },
        yaxis: yAxis(metric, data),
      };
      Plotly.newPlot(el, traces, layout, { displaylogo: false, responsive: true });
    });
  }

  function extend(live) {
    if (!live.at || !uuids.length || live.at * 1000 <= lastMs) return;
    lastMs = live.at * 1000;
    const t = new Date(lastMs).toISOString();
    const indexes = uuids.map(function (_, i) { return i; });
    charts.forEach(function (el) {
      const metric = el.dataset.metric;
      Plotly.extendTraces(el, {
        x: uuids.map(function () { return [t]; }),
        y: uuids.map(function (uuid) {
          const gpu = live.gpus[uuid];
          return [gpu ? value(metric, gpu[metric]) : null];
        }),
      }, indexes, 5000);
      Plotly.relayout(el, { "xaxis.range": window_(live.at * 1000) });
    });
  }

  function poll() {
    fetch(panel.dataset.liveUrl, { headers: { Accept: "application/json" } })
      .then(function (r) { return r.ok ? r.json() : null; })
      .then(function (live) { if (live) extend(live); })
      .catch(function () {})
      .finally(function () { setTimeout(poll, 5000); });
  }

  fetch(panel.dataset.chartsUrl + "?range=" + range, { headers: { Accept: "application/json" } })
    .then(function (r) { return r.json(); })
    .then(function (data) {
      whenPlotly(function () { draw(data); setTimeout(poll, 5000); });
    });
})();
