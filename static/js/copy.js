// A <button data-copy="ID"> copies the text of the element with that id to the clipboard,
// and says for a moment whether it did. Where the browser refuses (no secure context), the
// text is selected instead, for the person to copy.
(function () {
  function say(button, text) {
    const label = button.dataset.label || button.textContent;
    button.dataset.label = label;
    button.textContent = text;
    setTimeout(function () { button.textContent = label; }, 1500);
  }
  function select(element) {
    const range = document.createRange();
    range.selectNodeContents(element);
    const selection = window.getSelection();
    selection.removeAllRanges();
    selection.addRange(range);
  }
  document.addEventListener("click", function (event) {
    const button = event.target.closest("button[data-copy]");
    if (!button) return;
    const source = document.getElementById(button.dataset.copy);
    if (!source) return;
    if (!navigator.clipboard) { select(source); say(button, "Selected: copy it"); return; }
    navigator.clipboard.writeText(source.textContent).then(
      function () { say(button, "Copied"); },
      function () { select(source); say(button, "Selected: copy it"); });
  });
})();
