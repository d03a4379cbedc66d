// The Nodes tab's list: "select all" ticks every node on the page, and the table's live
// refresh (cluster-changed, every 5 s) waits while the operator is using the bulk form
// (nodes selected, a reason typed, a field focused), so that a refresh never drops what
// they chose before they send it, and one already on its way is not swapped in. Sending
// the form swaps in a fresh table.
(function () {
  function boxes() {
    return document.querySelectorAll('#node-table input[name="nodes"]');
  }
  function busy(table) {
    if (Array.from(boxes()).some(function (box) { return box.checked; })) return true;
    const active = document.activeElement;
    if (active && table.contains(active) && active.matches("input, select")) return true;
    return Array.from(table.querySelectorAll('input[type="text"]')).some(function (field) {
      return field.value !== field.defaultValue;
    });
  }
  document.addEventListener("change", function (event) {
    if (event.target.id === "select-all") {
      boxes().forEach(function (box) { box.checked = event.target.checked; });
    }
  });
  document.body.addEventListener("htmx:beforeRequest", function (event) {
    const table = document.getElementById("node-table");
    if (event.detail.elt === table && busy(table)) event.preventDefault();
  });
  // A refresh already on its way when the operator began is not swapped in either.
  document.body.addEventListener("htmx:beforeSwap", function (event) {
    const table = document.getElementById("node-table");
    if (event.detail.elt === table && event.detail.requestConfig.verb === "get" &&
        busy(table)) {
      event.detail.shouldSwap = false;
    }
  });
})();
