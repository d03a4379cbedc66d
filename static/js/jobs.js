// The Jobs page's chart: GPU-hours by user and by account in the chosen period, redrawn
// when htmx swaps in new results (filters, pages).
(function () {
  function draw() {
    const el = document.getElementById("jobs-chart");
    if (!el || !el.dataset.chart || !window.Plotly) return; // drawn again when plotly is there
    const s = JSON.parse(el.dataset.chart);
    const traces = [
      { type: "bar", name: "by user", x: s.users, y: s.user_gpu_hours, marker: { color: "#2f5bd1" } },
      { type: "bar", name: "by account", x: s.accounts, y: s.account_gpu_hours, xaxis: "x2", yaxis: "y2", marker: { color: "#2e9e5b" } },
    ];
    const layout = {
      margin: { l: 50, r: 20, t: 30, b: 40 },
      grid: { rows: 1, columns: 2, pattern: "independent" },
      yaxis: { title: { text: "GPU-hours" }, rangemode: "tozero" },
      yaxis2: { rangemode: "tozero" },
      annotations: [
        { text: "by user", showarrow: false, xref: "x domain", yref: "paper", x: 0.5, y: 1.1 },
        { text: "by account", showarrow: false, xref: "x2 domain", yref: "paper", x: 0.5, y: 1.1 },
      ],
      showlegend: false,
    };
    Plotly.react(el, traces, layout, { displaylogo: false, responsive: true });
  }
  whenPlotly(draw);
  // htmx:load fires on the swapped-in results (attached to the page; afterSettle of an
  // outerHTML swap may reach only the replaced element).
  document.body.addEventListener("htmx:load", draw);
})();
