// Live re-fetch, shared by static/js/health.js and static/js/repairs.js (load this first):
// liveRefresh(options) re-fetches a page region when one of options.events fires on
// document.body, and returns refreshSoon() for other reasons to fetch.
//
// At most one fetch a second; a change that comes sooner is fetched when the second is over.
// While the operator is filling in a form in options.regions() (a field has focus, or holds
// what they typed), they are left alone and options.note() (if any) is shown; they update
// once the operator leaves the form. Open <details> stay open. Changes made while the live
// socket was closed (or before it first opened) were never announced: it fetches whenever
// the socket opens (body[data-live="on"], set by static/js/live.js).
//
// options: name (for the console), events (names), target() (the element the response
// replaces, outerHTML; nothing is fetched without one), url(target, pageUrl) and
// headers(pageUrl) (optional: the page's URL and HX-Request), regions() (the elements the
// swap replaces: where forms and open <details> are looked for), note() (optional).
function liveRefresh(options) {
  const MIN_INTERVAL_MS = 1000;
  let wanted = false;  // a change not yet fetched
  let fetching = false;
  let lastFetchAt = 0;
  let timer = null;

  function operatorIsBusy() {
    const active = document.activeElement;
    return options.regions().some(function (region) {
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
    const n = options.note ? options.note() : null;
    if (n) n.hidden = !shown;
  }

  function refreshSoon() {
    wanted = true;
    if (timer !== null || fetching) return;
    const wait = Math.max(0, lastFetchAt + MIN_INTERVAL_MS - Date.now());
    timer = setTimeout(function () { timer = null; refresh(); }, wait);
  }

  function refresh() {
    const t = options.target();
    if (!wanted || fetching || !t) return;
    if (operatorIsBusy()) {
      showNote(true);
      return;  // retried when they leave the form (listeners below)
    }
    wanted = false;
    fetching = true;
    lastFetchAt = Date.now();
    const pageUrl = location.href;
    const url = options.url ? options.url(t, pageUrl) : pageUrl;
    const headers = options.headers ? options.headers(pageUrl) : { "HX-Request": "true" };
    fetch(url, { headers: headers, cache: "no-store", credentials: "same-origin" })
      .then(function (response) {
        if (!response.ok) throw new Error("HTTP " + response.status);
        return response.text();
      })
      .then(function (html) {
        // The filters or the page changed meanwhile: that request brings the regions.
        if (location.href !== pageUrl) { wanted = true; return; }
        // The operator started filling in a form meanwhile: keep what they typed.
        if (operatorIsBusy()) { wanted = true; showNote(true); return; }
        swap(html);
      })
      .catch(function (error) {
        console.warn(options.name + ": refresh failed:", error);
      })
      .finally(function () {
        fetching = false;
        if (wanted) refreshSoon();
      });
  }

  // An open <details> is remembered as (the id of the nearest element with one, which
  // <details> of it): the swap brings a new element with that id.
  function openDetailsKeys() {
    const keys = [];
    options.regions().forEach(function (region) {
      region.querySelectorAll("details[open]").forEach(function (details) {
        const owner = details.closest("[id]");
        if (!owner) return;
        const siblings = Array.from(owner.querySelectorAll("details"));
        keys.push([owner.id, siblings.indexOf(details)]);
      });
    });
    return keys;
  }

  function swap(html) {
    const open = openDetailsKeys();
    htmx.swap(options.target(), html, { swapStyle: "outerHTML" });
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

  options.events.forEach(function (name) {
    document.body.addEventListener(name, refreshSoon);
  });
  document.addEventListener("focusout", retryIfHeld);
  document.addEventListener("input", retryIfHeld);
  document.body.addEventListener("htmx:afterSwap", retryIfHeld);  // e.g. a row after resolve

  let live = document.body.dataset.live === "on";
  new MutationObserver(function () {
    const now = document.body.dataset.live === "on";
    if (now && !live) refreshSoon();
    live = now;
  }).observe(document.body, { attributes: true, attributeFilter: ["data-live"] });

  return refreshSoon;
}
