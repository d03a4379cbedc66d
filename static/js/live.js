// The page's live socket: one cluster summary a second from /ws/live/cluster/<slug>/.
// It fills [data-live-count] and [data-live-usage] in place, shows [data-live-when] and
// the cluster's status (#cluster-status; it touches only these, never another widget's), tells other widgets through
// DOM events ("cluster-summary" with the summary; "cluster-changed" when the timeline moved,
// which htmx widgets listen to with hx-trigger="cluster-changed from:body"), and reconnects
// on loss.
// Other messages name their type and become DOM events too: "health.changed" is dispatched
// as "health-changed" (static/js/health.js).
(function () {
  const slug = document.body.dataset.liveCluster;
  if (!slug) return;
  const scheme = location.protocol === "https:" ? "wss://" : "ws://";
  const url = scheme + location.host + "/ws/live/cluster/" + slug + "/";
  let timelineHead = null;
  let delay = 1000;

  function format(key, value) {
    if (value === null || value === undefined) return key === "gpus_reporting" ? "no" : "–";
    if (key === "net_gbps") return value.toFixed(1) + " Gb/s";
    if (key === "gpus_reporting") return value.toLocaleString();
    return Math.round(value) + " %";
  }

  function apply(summary) {
    Object.entries(summary.counts).forEach(function ([state, n]) {
      document.querySelectorAll('[data-live-count="' + state + '"]').forEach(function (el) {
        el.textContent = n;
      });
    });
    const usage = summary.usage || {};
    document.querySelectorAll("[data-live-usage]").forEach(function (el) {
      el.textContent = format(el.dataset.liveUsage, usage[el.dataset.liveUsage]);
    });
    document.querySelectorAll("[data-live-when]").forEach(function (el) {
      el.hidden = (el.dataset.liveWhen === "reporting") !== Boolean(summary.usage);
    });
    const status = document.getElementById("cluster-status");
    const statusChanged = Boolean(status) && status.dataset.status !== summary.status;
    if (statusChanged) {
      status.dataset.status = summary.status;
      const badge = status.querySelector(".badge");
      badge.className = "badge status-" + summary.status;
      badge.textContent = summary.status;
    }
    const reason = document.getElementById("cluster-status-reason");
    if (reason) reason.textContent = summary.status_reason;
    document.body.dispatchEvent(new CustomEvent("cluster-summary", { detail: summary }));
    // The first summary on each connection counts as a change: the page (or the last
    // connection) may have missed what happened before it.
    if (timelineHead === null || summary.timeline_head !== timelineHead || statusChanged) {
      document.body.dispatchEvent(new CustomEvent("cluster-changed", { detail: summary }));
    }
    timelineHead = summary.timeline_head;
  }

  function connect() {
    const socket = new WebSocket(url);
    socket.onopen = function () {
      delay = 1000;
      timelineHead = null;
      document.body.dataset.live = "on";
    };
    socket.onmessage = function (e) {
      const message = JSON.parse(e.data);
      if (message.type) {
        const name = message.type.replaceAll(".", "-");
        document.body.dispatchEvent(new CustomEvent(name, { detail: message }));
        return;
      }
      apply(message);
    };
    socket.onclose = function () {
      document.body.dataset.live = "off";
      setTimeout(connect, delay);
      delay = Math.min(delay * 2, 30000);
    };
  }
  connect();
})();
