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
