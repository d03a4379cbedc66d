// Repairs, live: the Repair tab, a repair's page and the node page's Repair section re-fetch
// what shows repairs when one of the cluster's repairs moves ("repair-changed", from the live
// socket in static/js/live.js, or from an action's htmx response).
//
// The page marks what it re-fetches with data-repairs-fetch (its value the URL, empty for the
// page's own URL with its filters: the htmx fragment, whose other sections come out of band)
// and every region such a fetch replaces with data-repairs-live.
//
// The fetching (at most once a second, forms the operator is filling in left alone with
// #repairs-held shown, open <details> kept open) is static/js/refresh.js's. Every move of a
// repair reaches the socket, wherever it was made (a Celery worker too): the publisher reads
// it from the change feed.
(function () {
  liveRefresh({
    name: "repairs",
    // A node changed state: a repair starting or ending pauses or resumes its node.
    events: ["repair-changed", "cluster-changed"],
    target: function () { return document.querySelector("[data-repairs-fetch]"); },
    url: function (target, pageUrl) { return target.dataset.repairsFetch || pageUrl; },
    // HX-Current-URL: the page the fragment's plain forms come back to (their "next").
    headers: function (pageUrl) { return { "HX-Request": "true", "HX-Current-URL": pageUrl }; },
    regions: function () { return Array.from(document.querySelectorAll("[data-repairs-live]")); },
    note: function () { return document.getElementById("repairs-held"); },
  });
})();
