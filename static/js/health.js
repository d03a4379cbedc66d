// The Health checks tab, live: when the cluster's health events change ("health-changed",
// from the live socket in static/js/live.js), re-fetch the event table for the URL's current
// filters and page (the htmx fragment: #event-table, and the counts by signature out of band).
//
// At most one fetch a second; a change that comes sooner is fetched when the second is over.
// While the operator is filling in a form of the table (a field has focus, or holds what they
// typed), the table is left alone and a note says it will update; it does once they leave it.
// Rows whose catalog explanation is open keep it open.
(function () {
  const MIN_INTERVAL_MS = 1000;
  const note = document.getElementById("event-table-held");
  let wanted = false;  // a change not yet fetched
  let fetching = false;
  let lastFetchAt = 0;
  let timer = null;

  function table() {
    return document.getElementById("event-table");
  }

  function operatorIsBusy() {
    const t = table();
    if (!t) return false;
    const active = document.activeElement;
    if (active && t.contains(active) && active.matches("input, select, textarea")) return true;
    return Array.from(t.querySelectorAll("input, textarea")).some(function (field) {
      return field.type !== "hidden" && field.value !== field.defaultValue;
    });
  }

  function refreshSoon() {
    wanted = true;
    if (timer !== null || fetching) return;
    const wait = Math.max(0, lastFetchAt + MIN_INTERVAL_MS - Date.now());
    timer = setTimeout(function () { timer = null; refresh(); }, wait);
  }

  function refresh() {
    if (!wanted || fetching || !table()) return;
    if (operatorIsBusy()) {
      if (note) note.hidden = false;
      return;  // retried when they leave the form (listeners below)
    }
    wanted = false;
    fetching = true;
    lastFetchAt = Date.now();
    const url = location.href;
    fetch(url, { headers: { "HX-Request": "true" }, cache: "no-store", credentials: "same-origin" })
      .then(function (response) {
        if (!response.ok) throw new Error("HTTP " + response.status);
        return response.text();
      })
      .then(function (html) {
        // The filters or the page changed meanwhile: that request brings the table; fetch again.
        if (location.href !== url) { wanted = true; return; }
        // The operator started filling in a form meanwhile: keep what they typed.
        if (operatorIsBusy()) { wanted = true; if (note) note.hidden = false; return; }
        swap(html);
      })
      .catch(function (error) {
        console.warn("health events: refresh failed:", error);
      })
      .finally(function () {
        fetching = false;
        if (wanted) refreshSoon();
      });
  }

  function swap(html) {
    const openDetails = Array.from(table().querySelectorAll("tr[id] details[open]")).map(
      function (details) { return details.closest("tr").id; });
    htmx.swap(table(), html, { swapStyle: "outerHTML" });
    openDetails.forEach(function (rowId) {
      const details = document.querySelector("#" + CSS.escape(rowId) + " details");
      if (details) details.open = true;
    });
    if (note) note.hidden = true;
  }

  function retryIfHeld() {
    // After focus moved, the new active element is known only once the event is over.
    setTimeout(function () { if (wanted && !fetching) refreshSoon(); }, 0);
  }

  document.body.addEventListener("health-changed", refreshSoon);
  // A node changed state (its timeline moved): also what a change made outside the server
  // processes looks like here, e.g. a lost heartbeat opened by the Celery sweep in embedded
  // mode, whose in-memory channel layer cannot reach this page's socket.
  document.body.addEventListener("cluster-changed", refreshSoon);
  document.addEventListener("focusout", retryIfHeld);
  document.addEventListener("input", retryIfHeld);
  document.body.addEventListener("htmx:afterSwap", retryIfHeld);  // e.g. a row after resolve

  // Changes made while the live socket was closed (or before it first opened, after the page
  // was rendered) were never announced: fetch whenever it opens.
  let live = document.body.dataset.live === "on";
  new MutationObserver(function () {
    const now = document.body.dataset.live === "on";
    if (now && !live) refreshSoon();
    live = now;
  }).observe(document.body, { attributes: true, attributeFilter: ["data-live"] });
})();
