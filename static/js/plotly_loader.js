// plotly.js is 4.8 MB of JavaScript (1.1 MB on the wire). Loaded as a plain script it held
// the overview's first load from 1.2 s to 3.8 s on a 2-core machine while Chromium parsed
// and ran it (bench/README.md, "The overview's first load"). It is fetched once the page
// has loaded instead, and each chart script draws when it is there:
//
//   <script src="js/plotly_loader.js" data-plotly-src="vendor/plotly.min.js"></script>
//   whenPlotly(function () { Plotly.newPlot(...); });
(function () {
  const loader = document.currentScript;
  let waiting = [];

  window.whenPlotly = function (draw) {
    if (window.Plotly) draw();
    else waiting.push(draw);
  };

  function load() {
    const script = document.createElement("script");
    script.src = loader.dataset.plotlySrc;
    script.nonce = loader.nonce; // the page's CSP allows scripts by nonce
    script.onload = function () {
      const queued = waiting;
      waiting = [];
      queued.forEach(function (draw) { draw(); });
    };
    document.head.appendChild(script);
  }

  if (document.readyState === "complete") load();
  else window.addEventListener("load", load);
})();
