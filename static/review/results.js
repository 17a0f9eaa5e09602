// Results screens: copy a stable link to a trajectory step. Loaded as a file
// (the CSP forbids inline scripts); delegated so steps added by htmx work too.
(function () {
  "use strict";
  document.addEventListener("click", function (event) {
    var button = event.target.closest("button.copy-link[data-copy]");
    if (!button) { return; }
    var url = new URL(button.getAttribute("data-copy"), window.location.href).href;
    var done = function () {
      var label = button.textContent;
      button.textContent = "copied";
      window.setTimeout(function () { button.textContent = label; }, 1200);
    };
    if (navigator.clipboard && window.isSecureContext) {
      navigator.clipboard.writeText(url).then(done, function () { window.prompt("Link to this step:", url); });
    } else {
      window.prompt("Link to this step:", url);
    }
  });
})();

// "?step=N" without "#step-N" (the jump form): scroll to the step once loaded.
(function () {
  "use strict";
  var wanted = new URLSearchParams(window.location.search).get("step");
  if (!wanted || window.location.hash) { return; }
  document.addEventListener("DOMContentLoaded", function () {
    var step = document.getElementById("step-" + wanted);
    if (step) {
      window.history.replaceState(null, "", "#step-" + wanted);
      step.scrollIntoView();
    }
  });
})();

// The trial page: a click on a step (outside its links, buttons and fields)
// picks it for the annotation panel beside the transcript: the form's step
// field takes its id, and the step is outlined.
(function () {
  "use strict";
  document.addEventListener("click", function (event) {
    var step = event.target.closest ? event.target.closest("ol.steps li.step[data-step]") : null;
    if (!step || event.target.closest("a, button, input, select, textarea, summary, label")) { return; }
    var field = document.querySelector("#annotations form.annotation-form:not(.is-edit) input[name=step]");
    if (!field || field.disabled) { return; }
    field.value = step.getAttribute("data-step");
    Array.prototype.forEach.call(document.querySelectorAll("li.step.is-picked"), function (li) { li.classList.remove("is-picked"); });
    step.classList.add("is-picked");
    var note = document.querySelector("#annotations .picked-step");
    if (note) { note.textContent = "Step " + field.value + " picked: the label will point at it."; }
  });
})();

// Keys typed while the annotation panel is still loading (0.1-0.3 s after the page) are kept, never lost:
// the loading line says how many wait, and once htmx has put the panel in they are pressed again, in order,
// so "3" then "s" picks the third label and saves. Only the panel's own keys wait (label keys 1-9, s, n).
(function () {
  "use strict";
  var queued = [];
  var PANEL_KEYS = /^[1-9sn]$/;

  function pending() {
    var host = document.getElementById("annotations");
    return !!(host && host.hasAttribute("hx-get") && !host.querySelector(".annotation-panel"));
  }

  // Like keys.js: no key is kept while the person types or the focus is on a control (its own keys win).
  function typing(target) {
    return !!(target && target.closest && target.closest(
      "input, textarea, select, [contenteditable], button, a[href], summary, [role=button], [role=link]"));
  }

  window.addEventListener("keydown", function (event) {
    if (!pending() || event.ctrlKey || event.metaKey || event.altKey || event.isComposing) { return; }
    if (!PANEL_KEYS.test(event.key) || typing(event.target)) { return; }
    event.preventDefault();
    event.stopImmediatePropagation();
    queued.push(event.key);
    var host = document.getElementById("annotations");
    var note = host.querySelector(".keys-waiting");
    if (!note) {
      note = document.createElement("p");
      note.className = "keys-waiting small";
      note.setAttribute("role", "status");
      host.appendChild(note);
    }
    note.textContent = queued.length + (queued.length === 1 ? " key" : " keys") + " kept (" + queued.join(" ") +
      "): applied as soon as the panel is shown.";
  }, true);

  document.addEventListener("htmx:afterSettle", function (event) {
    if (!queued.length || pending()) { return; }
    var target = event.detail && event.detail.target;
    if (!target || target.id !== "annotations") { return; }
    var keys = queued;
    queued = [];
    keys.forEach(function (key) {
      document.body.dispatchEvent(new KeyboardEvent("keydown", {key: key, bubbles: true, cancelable: true}));
    });
  });
})();

// A transcript search (?q=) marks each match in the matching steps, so the eye finds it: text nodes only,
// each occurrence wrapped in <mark class="search-hit"> (no markup from the page is parsed).
(function () {
  "use strict";
  var wanted = (new URLSearchParams(window.location.search).get("q") || "").trim();
  if (!wanted) { return; }
  function mark() {
    var lower = wanted.toLowerCase();
    Array.prototype.forEach.call(document.querySelectorAll("ol.steps.matches li.step"), function (step) {
      var walker = document.createTreeWalker(step, NodeFilter.SHOW_TEXT);
      var nodes = [];
      while (walker.nextNode()) { nodes.push(walker.currentNode); }
      nodes.forEach(function (node) {
        var text = node.nodeValue;
        var at = text.toLowerCase().indexOf(lower);
        if (at === -1 || (node.parentNode && node.parentNode.closest && node.parentNode.closest("mark, button"))) { return; }
        var fragment = document.createDocumentFragment();
        var from = 0;
        while (at !== -1) {
          fragment.appendChild(document.createTextNode(text.slice(from, at)));
          var hit = document.createElement("mark");
          hit.className = "search-hit";
          hit.textContent = text.slice(at, at + wanted.length);
          fragment.appendChild(hit);
          from = at + wanted.length;
          at = text.toLowerCase().indexOf(lower, from);
        }
        fragment.appendChild(document.createTextNode(text.slice(from)));
        node.parentNode.replaceChild(fragment, node);
      });
    });
  }
  if (document.readyState === "loading") { document.addEventListener("DOMContentLoaded", mark); } else { mark(); }
})();
