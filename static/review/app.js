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
})();
