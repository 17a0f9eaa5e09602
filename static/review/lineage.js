// The lineage graph zooms: buttons (and their keys, declared with data-key) and Ctrl with the mouse wheel
// set the SVG's drawn size from its own width and height (its viewBox keeps the drawing), so the box
// around it scrolls both ways at any zoom; "fit" shows the whole graph in the box.
(function () {
  "use strict";
  var STEP = 1.25;
  var MIN = 0.1;
  var MAX = 4;

  function parts() {
    var box = document.querySelector(".lineage-scroll");
    var svg = box && box.querySelector("svg.lineage");
    if (!svg) { return null; }
    if (!svg.hasAttribute("data-width")) {
      svg.setAttribute("data-width", svg.getAttribute("width"));
      svg.setAttribute("data-height", svg.getAttribute("height"));
    }
    return {box: box, svg: svg, width: parseFloat(svg.getAttribute("data-width")),
      height: parseFloat(svg.getAttribute("data-height"))};
  }

  function zoomTo(level) {
    var p = parts();
    if (!p) { return; }
    level = Math.max(MIN, Math.min(MAX, level));
    p.svg.setAttribute("data-zoom", String(level));
    p.svg.setAttribute("width", String(Math.round(p.width * level)));
    p.svg.setAttribute("height", String(Math.round(p.height * level)));
    var out = document.querySelector(".js-zoom-level");
    if (out) { out.textContent = Math.round(level * 100) + "%"; }
  }

  function current() {
    var p = parts();
    return p ? parseFloat(p.svg.getAttribute("data-zoom") || "1") : 1;
  }

  function fit() {
    var p = parts();
    if (!p) { return; }
    var level = Math.min((p.box.clientWidth - 2) / p.width, (p.box.clientHeight - 2) / p.height);
    zoomTo(Math.min(level, MAX));
  }

  document.addEventListener("click", function (event) {
    var button = event.target.closest ? event.target.closest("[data-zoom]") : null;
    if (!button) { return; }
    var how = button.getAttribute("data-zoom");
    if (how === "in") { zoomTo(current() * STEP); }
    else if (how === "out") { zoomTo(current() / STEP); }
    else if (how === "fit") { fit(); }
    else { zoomTo(1); }
  });

  document.addEventListener("wheel", function (event) {
    if (!(event.ctrlKey || event.metaKey) || !event.target.closest || !event.target.closest(".lineage-scroll")) {
      return;
    }
    event.preventDefault();
    zoomTo(current() * (event.deltaY < 0 ? STEP : 1 / STEP));
  }, {passive: false});
})();
