// Diff screens: "viewed" checkboxes, auto-submitting selects, copy buttons.
// Loaded as a file (the CSP forbids inline scripts). The checkbox's form posts
// itself through htmx (hx-trigger="change"); this file only keeps the page in
// step: it folds a viewed file and updates the "N of M viewed" counters.
(function () {
  "use strict";

  function refreshCounts(root) {
    var body = root.closest ? root.closest(".diff-body") : null;
    var bodies = body ? [body] : document.querySelectorAll(".diff-body");
    Array.prototype.forEach.call(bodies, function (diffBody) {
      var viewed = diffBody.querySelectorAll(".diff-file.is-viewed").length;
      Array.prototype.forEach.call(diffBody.querySelectorAll(".js-viewed-count"), function (el) {
        el.textContent = String(viewed);
      });
    });
  }

  function markFile(checkbox) {
    var file = checkbox.closest(".diff-file");
    if (!file) return;
    file.classList.toggle("is-viewed", checkbox.checked);
    var body = file.closest(".diff-body");
    if (body) {
      var mark = body.querySelector('.js-viewed-mark[data-anchor="' + file.id + '"]');
      if (mark) mark.textContent = checkbox.checked ? "\u2713" : "";
    }
    refreshCounts(file);
  }

  document.addEventListener("change", function (event) {
    var target = event.target;
    if (target.matches && target.matches("input.js-viewed")) {
      markFile(target);
    } else if (target.matches && target.matches("select[data-autosubmit]") && target.form) {
      if (target.form.requestSubmit) target.form.requestSubmit();
      else target.form.submit();
    }
  });

  // The server's answer replaces the form: trust its state over the click.
  // (With an outerHTML swap the event's target is the old, detached form,
  // so resynchronise every checkbox; there are at most a few hundred.)
  document.addEventListener("htmx:afterSettle", function () {
    Array.prototype.forEach.call(document.querySelectorAll("input.js-viewed"), markFile);
  });

  document.addEventListener("click", function (event) {
    var button = event.target.closest ? event.target.closest("button[data-copy]") : null;
    if (!button || !navigator.clipboard) return;
    navigator.clipboard.writeText(button.getAttribute("data-copy")).then(function () {
      button.classList.add("copied");
      button.textContent = "copied";
      window.setTimeout(function () {
        button.classList.remove("copied");
        button.textContent = "copy";
      }, 1500);
    });
  });
})();
