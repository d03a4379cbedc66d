// The Nodes tab's list: "select all" ticks every node on the page, and the table's live
// refresh (cluster-changed, every 5 s) waits while nodes are selected, so that a refresh
// never drops a selection before its bulk operation is sent.
(function () {
  function boxes() {
    return document.querySelectorAll('#node-table input[name="nodes"]');
  }
  document.addEventListener("change", function (event) {
    if (event.target.id === "select-all") {
      boxes().forEach(function (box) { box.checked = event.target.checked; });
    }
  });
  document.body.addEventListener("htmx:beforeRequest", function (event) {
    const table = document.getElementById("node-table");
    if (event.detail.elt !== table) return;
    if (Array.from(boxes()).some(function (box) { return box.checked; })) {
      event.preventDefault();
    }
  });
})();
