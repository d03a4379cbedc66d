// Repairs, live: the Repair tab, a repair's page and the node page's Repair section re-fetch
// what shows repairs when one of the cluster's repairs moves ("repair-changed", from the live
// socket in static/js/live.js, or from an action's htmx response).
//
// The page marks what it re-fetches with data-repairs-fetch (its value the URL, empty for the
// page's own URL with its filters: the htmx fragment, whose other sections come out of band)
// and every region such a fetch replaces with data-repairs-live.
//
// At most one fetch a second; a change that comes sooner is fetched when the second is over.
// While the operator is filling in a form in those regions (a field has focus, or holds what
// they typed), they are left alone and a note says so; they update once the operator leaves.
// While a repair on the page is approved and not finished (data-repairs-moving), the page
// also looks every 5 s: a Celery worker may move its steps where this page's socket cannot
// hear it (the embedded mode's in-memory channel layer). Open <details> stay open.
(function () {
  const MIN_INTERVAL_MS = 1000;
  const MOVING_POLL_MS = 5000;
  let wanted = false;  // a change not yet fetched
  let fetching = false;
  let lastFetchAt = 0;
  let timer = null;

  function target() {
    return document.querySelector("[data-repairs-fetch]");
  }

  function note() {
    return document.getElementById("repairs-held");
  }

  function regions() {
    return Array.from(document.querySelectorAll("[data-repairs-live]"));
  }

  function operatorIsBusy() {
    const active = document.activeElement;
    return regions().some(function (region) {
      if (active && region.contains(active) && active.matches("input, select, textarea")) {
        return true;
      }
      return Array.from(region.querySelectorAll("input, textarea")).some(function (field) {
        return field.type !== "hidden" && field.type !== "checkbox" &&
          field.value !== field.defaultValue;
      });
    });
  }

  function showNote(shown) {
    const n = note();
    if (n) n.hidden = !shown;
  }

  function refreshSoon() {
    wanted = true;
    if (timer !== null || fetching) return;
    const wait = Math.max(0, lastFetchAt + MIN_INTERVAL_MS - Date.now());
    timer = setTimeout(function () { timer = null; refresh(); }, wait);
  }

  function refresh() {
    const t = target();
    if (!wanted || fetching || !t) return;
    if (operatorIsBusy()) {
      showNote(true);
      return;  // retried when they leave the form (listeners below)
    }
    wanted = false;
    fetching = true;
    lastFetchAt = Date.now();
    const pageUrl = location.href;
    const url = t.dataset.repairsFetch || pageUrl;
    // HX-Current-URL: the page the fragment's plain forms come back to (their "next").
    const headers = { "HX-Request": "true", "HX-Current-URL": pageUrl };
    fetch(url, { headers: headers, cache: "no-store", credentials: "same-origin" })
      .then(function (response) {
        if (!response.ok) throw new Error("HTTP " + response.status);
        return response.text();
      })
      .then(function (html) {
        // The filters or the page changed meanwhile: that request brings the sections.
        if (location.href !== pageUrl) { wanted = true; return; }
        // The operator started filling in a form meanwhile: keep what they typed.
        if (operatorIsBusy()) { wanted = true; showNote(true); return; }
        swap(html);
      })
      .catch(function (error) {
        console.warn("repairs: refresh failed:", error);
      })
      .finally(function () {
        fetching = false;
        if (wanted) refreshSoon();
      });
  }

  function openDetailsKeys() {
    return Array.from(document.querySelectorAll("[data-repairs-live] details[open]")).map(
      function (details) {
        const owner = details.closest("[id]");
        const siblings = Array.from(owner.querySelectorAll("details"));
        return [owner.id, siblings.indexOf(details)];
      });
  }

  function swap(html) {
    const open = openDetailsKeys();
    htmx.swap(target(), html, { swapStyle: "outerHTML" });
    open.forEach(function ([id, index]) {
      const owner = document.getElementById(id);
      const details = owner && owner.querySelectorAll("details")[index];
      if (details) details.open = true;
    });
    showNote(false);
  }

  function retryIfHeld() {
    // After focus moved, the new active element is known only once the event is over.
    setTimeout(function () { if (wanted && !fetching) refreshSoon(); }, 0);
  }

  document.body.addEventListener("repair-changed", refreshSoon);
  // A node changed state: a repair starting or ending pauses or resumes its node.
  document.body.addEventListener("cluster-changed", refreshSoon);
  document.addEventListener("focusout", retryIfHeld);
  document.addEventListener("input", retryIfHeld);
  document.body.addEventListener("htmx:afterSwap", retryIfHeld);

  setInterval(function () {
    if (document.querySelector("[data-repairs-moving]")) refreshSoon();
  }, MOVING_POLL_MS);

  // Changes made while the live socket was closed were never announced: fetch when it opens.
  let live = document.body.dataset.live === "on";
  new MutationObserver(function () {
    const now = document.body.dataset.live === "on";
    if (now && !live) refreshSoon();
    live = now;
  }).observe(document.body, { attributes: true, attributeFilter: ["data-live"] });
})();
