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
    if (checkbox.checked) file.classList.remove("is-open");
    var leaf = document.querySelector('.file-tree a[href="#' + file.id + '"]');
    if (leaf) leaf.classList.toggle("is-viewed", checkbox.checked);
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

  // --- Hidden context: the expand buttons of a hunk header (or of the row
  // after the last change) fetch unchanged lines from the candidate's tree.
  var STEP = 20;

  function gapWords(count, tail) {
    return count + " unchanged line" + (count === 1 ? "" : "s") + (tail ? " below" : " above");
  }

  function expandGap(button, whole) {
    var row = button.closest("tr");
    var table = button.closest("table.diff");
    if (!row || !table || row.classList.contains("is-loading")) return Promise.resolve();
    var first = parseInt(button.getAttribute("data-first"), 10);
    var count = parseInt(button.getAttribute("data-count"), 10);
    var shift = parseInt(button.getAttribute("data-shift"), 10);
    var last = first + count - 1;
    var tail = row.classList.contains("tail");
    var up = button.classList.contains("expand-up");
    var from = first, to = last;
    if (!whole && !button.classList.contains("expand-all")) {
      if (up) from = Math.max(first, last - STEP + 1); else to = Math.min(last, first + STEP - 1);
    }
    var url = table.getAttribute("data-context-url") + "&first=" + from + "&last=" + to + "&shift=" + shift;
    row.classList.add("is-loading");
    return fetch(url, {credentials: "same-origin", headers: {"Accept": "text/html"}}).then(function (response) {
      if (!response.ok) throw new Error("expand: " + response.status);
      return response.text();
    }).then(function (html) {
      row.classList.remove("is-loading");
      // Lines above the change go right after its header; the others before it.
      row.insertAdjacentHTML(up ? "afterend" : "beforebegin", html);
      var left = count - (to - from + 1);
      var nextFirst = from > first ? first : to + 1;
      if (left <= 0) {
        if (tail) { row.remove(); return; }
        var expanders = row.querySelector(".expanders");
        var words = row.querySelector(".gap");
        if (expanders) expanders.remove();
        if (words) words.remove();
        return;
      }
      Array.prototype.forEach.call(row.querySelectorAll("button.expand"), function (b) {
        b.setAttribute("data-first", String(nextFirst));
        b.setAttribute("data-count", String(left));
        if (b.classList.contains("expand-down") && left <= STEP && !tail) b.remove();
      });
      var gap = row.querySelector(".gap");
      if (gap) gap.textContent = gapWords(left, tail);
    }).catch(function () {
      row.classList.remove("is-loading");
    });
  }

  document.addEventListener("click", function (event) {
    var button = event.target.closest ? event.target.closest("button.expand") : null;
    if (button) expandGap(button, false);
  });

  // --- Line permalinks: "#<file>-R12" (new side) or "-L12" (old side). A
  // line inside hidden context is expanded first; a viewed file unfolds.
  var LINE = /^#(file-[0-9a-f]{16}(?:-\d+)?)-([LR])(\d+)$/;

  function showLine() {
    var found = LINE.exec(window.location.hash);
    if (!found) return;
    var file = document.getElementById(found[1]);
    if (!file) return;
    file.classList.add("is-open");
    var target = document.getElementById(found[1] + "-" + found[2] + found[3]);
    if (target) { target.scrollIntoView({block: "center"}); return; }
    var number = parseInt(found[3], 10);
    var buttons = file.querySelectorAll("button.expand-all");
    for (var i = 0; i < buttons.length; i++) {
      var b = buttons[i];
      var first = parseInt(b.getAttribute("data-first"), 10);
      var count = parseInt(b.getAttribute("data-count"), 10);
      var wanted = found[2] === "R" ? number : number - parseInt(b.getAttribute("data-shift"), 10);
      if (wanted >= first && wanted < first + count) {
        expandGap(b, true).then(function () {
          var line = document.getElementById(found[1] + "-" + found[2] + found[3]);
          if (line) {
            // :target applies to the element present when the hash was set: set it again.
            window.location.replace(window.location.hash);
            line.scrollIntoView({block: "center"});
          }
        });
        return;
      }
    }
  }

  document.addEventListener("DOMContentLoaded", showLine);
  window.addEventListener("hashchange", showLine);
  // The review item loads its diff with htmx: look for the line once it is in.
  document.addEventListener("htmx:afterSettle", function (event) {
    if (event.target && event.target.querySelector && event.target.querySelector("section.diff-file")) showLine();
  });
})();
