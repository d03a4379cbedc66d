// The Health checks tab, live: when the cluster's health events change ("health-changed",
// from the live socket in static/js/live.js), re-fetch the event table for the URL's current
// filters and page (the htmx fragment: #event-table, and the counts by signature out of band).
//
// The fetching (at most once a second, forms the operator is filling in left alone with
// #event-table-held shown, open catalog explanations kept open) is static/js/refresh.js's.
(function () {
  function table() {
    return document.getElementById("event-table");
  }

  liveRefresh({
    name: "health events",
    // A node changed state (its timeline moved): also what a change made outside the server
    // processes looks like here, e.g. a lost heartbeat opened by the Celery sweep in embedded
    // mode, whose in-memory channel layer cannot reach this page's socket.
    events: ["health-changed", "cluster-changed"],
    target: table,
    regions: function () { return table() ? [table()] : []; },
    note: function () { return document.getElementById("event-table-held"); },
  });
})();
