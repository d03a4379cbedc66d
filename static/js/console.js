// Every <time datetime data-style> shows the browser's local time; hovering shows the UTC offset.
(function () {
  function pad(n) { return String(n).padStart(2, "0"); }
  function utcOffset(d) {
    const minutes = -d.getTimezoneOffset();
    const abs = Math.abs(minutes);
    return "UTC" + (minutes >= 0 ? "+" : "-") + pad(Math.floor(abs / 60)) + ":" + pad(abs % 60);
  }
  function format(d, style) {
    const day = pad(d.getMonth() + 1) + "-" + pad(d.getDate());
    const clock = pad(d.getHours()) + ":" + pad(d.getMinutes());
    if (style === "short") return day + " " + clock;
    const text = d.getFullYear() + "-" + day + " " + clock;
    return style === "second" ? text + ":" + pad(d.getSeconds()) : text;
  }
  function localize(root) {
    root.querySelectorAll("time[datetime][data-style]").forEach(function (el) {
      const d = new Date(el.getAttribute("datetime"));
      if (isNaN(d)) return;
      el.textContent = format(d, el.dataset.style);
      el.title = format(d, "second") + " " + utcOffset(d);
    });
  }
  document.addEventListener("DOMContentLoaded", function () { localize(document); });
  document.addEventListener("htmx:afterSettle", function (e) { localize(e.target); });
})();
