// Shared behaviour of the review screens. Loaded as a file (the CSP forbids
// inline scripts); screens add their own files under static/review/.
(function () {
  "use strict";
  // Elements with data-href navigate on click (table rows, chart marks).
  document.addEventListener("click", function (event) {
    var target = event.target.closest("[data-href]");
    if (target && !event.target.closest("a, button, input, select, textarea, label")) {
      window.location.href = target.getAttribute("data-href");
    }
  });

  // A box that scrolls must be reachable by keyboard (WCAG 2.1.1): one that
  // overflows and holds nothing focusable becomes a labelled tab stop.
  function scrollersReachable(root) {
    Array.prototype.forEach.call(root.querySelectorAll("pre, .word-diff, .clip, .scroll"), function (box) {
      if (box.closest("summary, a, button") || box.hasAttribute("tabindex") || box.querySelector("a[href], button, input, select, textarea, [tabindex]")) return;
      if (box.scrollHeight <= box.clientHeight + 1 && box.scrollWidth <= box.clientWidth + 1) return;
      box.setAttribute("tabindex", "0");
      if (!box.hasAttribute("role")) box.setAttribute("role", "region");
      if (!box.hasAttribute("aria-label")) box.setAttribute("aria-label", "scrollable text");
    });
  }
  document.addEventListener("DOMContentLoaded", function () { scrollersReachable(document); });
  document.addEventListener("htmx:afterSettle", function (event) { scrollersReachable(event.target || document); });
})();
