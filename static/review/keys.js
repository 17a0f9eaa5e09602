// Keyboard shortcuts of every review screen, and the "?" overlay that lists them.
// Loaded as a file on every page (the CSP forbids inline scripts).
//
// Keys act only when the focus is on the page itself: never while a person
// types (a text field, a text area, a select, an editable element) and never
// while the focus is on a control (a button, a checkbox, a link, a summary,
// any element with a control's role), so a sentence typed with the focus in
// the wrong place cannot become commands or decisions, and a focused
// control's own keys (Enter on a button, Space on a checkbox) always win.
// The one control keys do act on is the one this script moved the focus to
// itself (the current file's name after j, the selected row's link), so
// j j k keeps working. Esc leaves a field or a control: keys work again.
// Nothing fires with Ctrl, Alt or Meta held (the browser's own shortcuts),
// except Ctrl+Enter (or Cmd+Enter) in a form's text area, which submits it;
// in the decision form with edits ticked it rejects those edits only.
//
// Two kinds of keys:
// - declared by the page: an element with data-key="c" is activated by "c"
//   (a link or button is clicked, a form submitted, a field focused);
//   data-key-help says what it does, data-key-group where the overlay lists it.
//   A declared key wins over a built-in one of the same letter.
// - built in: the diff keys wherever a diff is shown (j/k, n/p, v, u, e, x),
//   the difference keys of two trajectories side by side (a table marked
//   data-key-differences: j or n, k or p move between its rows that differ),
//   row selection in tables marked data-key-rows (j/k, o or Enter), and the
//   label keys 1-9 wherever buttons carry data-label-pick.
(function () {
  "use strict";

  var DIFF_KEYS = [
    ["j", "n", "Next file"],
    ["k", "p", "Previous file"],
    ["v", "", "Mark the current file viewed (or not viewed) and go to the next"],
    ["u", "", "Next file not yet viewed"],
    ["e", "", "Expand the current file's hidden context by 20 lines around each change"],
    ["x", "", "Expand the current file's whole context"]
  ];
  var DIFFERENCE_KEYS = [
    ["j", "n", "Next difference"],
    ["k", "p", "Previous difference"]
  ];
  var ROW_KEYS = [
    ["j", "", "Select the next row"],
    ["k", "", "Select the previous row"],
    ["o", "Enter", "Open the selected row"]
  ];

  // Elements that take keys of their own: with the focus on one, page keys rest.
  var CONTROLS = "a[href], area[href], button, input, select, textarea, summary, iframe, audio[controls], " +
    "video[controls], [contenteditable]:not([contenteditable='false']), [role=button], [role=link], " +
    "[role=checkbox], [role=radio], [role=switch], [role=tab], [role=menuitem], [role=option], " +
    "[role=textbox], [role=combobox], [role=slider], [role=spinbutton], [role=searchbox]";

  // The element this script last moved the focus to (j/k on files and rows): keys stay live there.
  var keyFocused = null;

  function focusByKeys(el) {
    el.focus({preventScroll: true});
    keyFocused = el;
    lastControl = null;
  }

  // The control the person last put the focus on. When a swap removes it (an
  // expand button replaced by the lines it fetched), the focus falls to the
  // page, but the person still types "on" it: keys rest until a click or Esc.
  var lastControl = null;
  document.addEventListener("focusin", function (event) {
    var el = control(event.target);
    if (el !== keyFocused) lastControl = el;
  });
  document.addEventListener("mousedown", function () { lastControl = null; }, true);

  function typing(target) {
    if (!target || !target.closest) return false;
    if (target.isContentEditable) return true;
    var field = target.closest("input, textarea, select, [contenteditable], [contenteditable=''], [contenteditable='true']");
    if (!field) return false;
    if (field.tagName === "INPUT") {
      var kind = (field.getAttribute("type") || "text").toLowerCase();
      return ["checkbox", "radio", "button", "submit", "reset", "image", "file", "range", "color"].indexOf(kind) === -1;
    }
    return field.getAttribute("contenteditable") !== "false";
  }

  function control(target) {
    if (!target || !target.closest || target === document.body || target === document.documentElement) return null;
    return target.closest(CONTROLS);
  }

  // Keys rest while the person types or the focus is on a control this script did not put it on.
  function resting(target) {
    if (typing(target)) return true;
    if (lastControl && !lastControl.isConnected && !control(target)) return true;
    var el = control(target);
    return !!el && el !== keyFocused;
  }

  // --- The "keys paused" hint ----------------------------------------------------

  // A person who clicked a button or a checkbox with the mouse has the focus on it, where keys rest
  // (a sentence typed there must never become commands). So that it is not a mystery, a hint says so
  // while it lasts, and that Esc gives the focus back to the page. Not while typing in a field (the
  // cursor shows that) and only on pages with keys of their own.
  function pageHasKeys() {
    return !!document.querySelector("[data-key], [data-key-rows], [data-key-differences], [data-label-pick], section.diff-file");
  }

  function pausedHint() {
    var hint = document.getElementById("keys-paused");
    if (!hint) {
      hint = document.createElement("div");
      hint.id = "keys-paused";
      hint.className = "keys-paused";
      hint.setAttribute("role", "status");
      hint.hidden = true;
      hint.appendChild(document.createTextNode("Keys paused while a control has the focus: press "));
      var kbd = document.createElement("kbd");
      kbd.textContent = "Esc";
      hint.appendChild(kbd);
      hint.appendChild(document.createTextNode(" to use the page's keys again."));
      document.body.appendChild(hint);
    }
    return hint;
  }

  function showPaused() {
    var target = document.activeElement;
    var paused = !document.getElementById("keys-overlay") && !typing(target) && resting(target) && pageHasKeys();
    var hint = document.getElementById("keys-paused");
    if (paused) pausedHint().hidden = false;
    else if (hint) hint.hidden = true;
  }

  document.addEventListener("focusin", function () { window.setTimeout(showPaused, 0); });
  document.addEventListener("focusout", function () { window.setTimeout(showPaused, 0); });
  document.addEventListener("mousedown", function () { window.setTimeout(showPaused, 0); });

  function visible(el) {
    return !!(el && el.getClientRects().length);
  }

  function declared(key) {
    // A key declared inside the selected table row wins (a row's "Claim").
    var selected = document.querySelector("[data-key-rows] tr.is-selected");
    var all = Array.prototype.slice.call(selected ? selected.querySelectorAll("[data-key]") : []);
    all = all.concat(Array.prototype.slice.call(document.querySelectorAll("[data-key]")));
    for (var i = 0; i < all.length; i++) {
      var keys = all[i].getAttribute("data-key").split(" ");
      if (keys.indexOf(key) !== -1 && !all[i].disabled && (visible(all[i]) || all[i].tagName === "FORM")) return all[i];
    }
    return null;
  }

  function activate(el) {
    if (el.tagName === "FORM") {
      if (el.requestSubmit) el.requestSubmit(); else el.submit();
    } else if (el.matches("textarea, select, input:not([type=checkbox]):not([type=radio]):not([type=submit]):not([type=button])")) {
      el.focus();
    } else {
      el.click();
    }
  }

  // --- Diff --------------------------------------------------------------------

  function files() {
    return Array.prototype.filter.call(document.querySelectorAll("section.diff-file"), visible);
  }

  function current(list) {
    var marked = document.querySelector("section.diff-file.is-current");
    if (marked && list.indexOf(marked) !== -1) return marked;
    // Otherwise the first file whose header is at or below the top of the window.
    for (var i = 0; i < list.length; i++) {
      if (list[i].getBoundingClientRect().bottom > 40) return list[i];
    }
    return list[0] || null;
  }

  function focusFile(file) {
    if (!file) return;
    Array.prototype.forEach.call(document.querySelectorAll("section.diff-file.is-current"), function (f) {
      f.classList.remove("is-current");
    });
    file.classList.add("is-current");
    Array.prototype.forEach.call(document.querySelectorAll(".file-tree a"), function (a) {
      a.classList.toggle("is-current", a.getAttribute("href") === "#" + file.id);
    });
    file.scrollIntoView({block: "start"});
    var link = file.querySelector(".diff-file-head a.path");
    if (link) focusByKeys(link);
  }

  function step(delta) {
    var list = files();
    if (!list.length) return false;
    var here = current(list);
    // The first press lands on the file in view; later ones move from the current file.
    if (!document.querySelector("section.diff-file.is-current")) { focusFile(here); return true; }
    var index = Math.max(0, Math.min(list.length - 1, list.indexOf(here) + delta));
    focusFile(list[index]);
    return true;
  }

  function nextUnviewed() {
    var list = files();
    if (!list.length) return false;
    var here = current(list);
    var start = document.querySelector("section.diff-file.is-current") ? list.indexOf(here) + 1 : list.indexOf(here);
    for (var i = 0; i < list.length; i++) {
      var file = list[(start + i) % list.length];
      if (!file.classList.contains("is-viewed")) { focusFile(file); return true; }
    }
    return true;
  }

  function toggleViewed() {
    var list = files();
    if (!list.length) return false;
    var file = current(list);
    var box = file && file.querySelector("input.js-viewed");
    if (!box) return false;
    box.click();
    if (box.checked) {
      var index = list.indexOf(file);
      if (index + 1 < list.length) focusFile(list[index + 1]); else focusFile(file);
    } else {
      focusFile(file);
    }
    return true;
  }

  function expand(whole) {
    var list = files();
    if (!list.length) return false;
    var file = current(list);
    if (!file) return false;
    if (file.classList.contains("is-viewed")) return true;
    // One request per hidden stretch: its row holds up, down and "all" buttons.
    Array.prototype.forEach.call(file.querySelectorAll("tr[data-gap]"), function (row) {
      var button = whole ? null : row.querySelector("button.expand-up, button.expand-down");
      button = button || row.querySelector("button.expand-all");
      if (button) button.dispatchEvent(new MouseEvent("click", {bubbles: true}));
    });
    if (!file.classList.contains("is-current")) focusFile(file);
    return true;
  }

  // --- Differences of two trajectories (the compare view) ------------------------

  function differenceTable() {
    return document.querySelector("[data-key-differences]");
  }

  function differences() {
    var table = differenceTable();
    if (!table) return [];
    return Array.prototype.filter.call(table.querySelectorAll("tbody tr.differs"), visible);
  }

  // The page shows 100 rows: past its last (before its first) difference, the keys go on to the
  // nearest difference of a later (earlier) page, whose address the server put on the table.
  function otherPage(delta) {
    var table = differenceTable();
    var url = table && table.getAttribute(delta > 0 ? "data-next-difference" : "data-previous-difference");
    if (!url) return false;
    window.location.assign(url);
    return true;
  }

  function moveDifference(delta) {
    var list = differences();
    if (!list.length) return otherPage(delta);
    var marked = list.filter(function (row) { return row.classList.contains("is-current"); })[0];
    var index;
    if (marked) {
      index = list.indexOf(marked) + delta;
      if (index < 0 || index >= list.length) return otherPage(delta) || true;
    } else {
      // The first press lands on the first difference not above the window (n), or the last one above it (p).
      index = delta > 0 ? -1 : 0;
      for (var i = 0; i < list.length; i++) {
        var top = list[i].getBoundingClientRect().top;
        if (delta > 0 && top >= 0) { index = i; break; }
        if (delta < 0 && top < 0) index = i;
      }
      if (index < 0) return otherPage(delta) || markDifference(list[list.length - 1]);
    }
    if (marked) { marked.classList.remove("is-current"); marked.removeAttribute("aria-current"); }
    return markDifference(list[index]);
  }

  function markDifference(row) {
    row.classList.add("is-current");
    row.setAttribute("aria-current", "true");
    row.scrollIntoView({block: "start"});
    var link = row.querySelector("th a[href^='#pos-']");
    if (link) focusByKeys(link);
    return true;
  }

  // Arriving at a difference by its address (from the previous or next page, or the first-difference
  // link), that row is the current one, so n and p go on from it.
  function markDifferenceInAddress() {
    var table = differenceTable();
    var id = window.location.hash.slice(1);
    var row = table && id ? document.getElementById(id) : null;
    if (row && table.contains(row) && row.classList.contains("differs") && visible(row)) markDifference(row);
  }
  // After the browser has gone to the fragment itself (going to a row, which takes no focus, clears the focus).
  function afterLoad() { window.setTimeout(markDifferenceInAddress, 0); }
  if (document.readyState === "complete") afterLoad(); else window.addEventListener("load", afterLoad);

  // --- Rows of a table ---------------------------------------------------------

  function rows() {
    var table = document.querySelector("[data-key-rows]");
    if (!table) return [];
    return Array.prototype.filter.call(table.querySelectorAll("tbody tr"), function (row) {
      return row.querySelector("a[href]");
    });
  }

  function moveRow(delta) {
    var list = rows();
    if (!list.length) return false;
    var selected = list.filter(function (row) { return row.classList.contains("is-selected"); })[0];
    var index = selected ? list.indexOf(selected) + delta : 0;
    index = Math.max(0, Math.min(list.length - 1, index));
    if (selected) selected.classList.remove("is-selected");
    list[index].classList.add("is-selected");
    list[index].setAttribute("aria-selected", "true");
    if (selected && selected !== list[index]) selected.removeAttribute("aria-selected");
    list[index].scrollIntoView({block: "nearest"});
    var link = list[index].querySelector("a[href]");
    if (link) focusByKeys(link);
    return true;
  }

  function openRow() {
    var selected = document.querySelector("[data-key-rows] tr.is-selected a[href]");
    if (!selected) return false;
    selected.click();
    return true;
  }

  // --- Labels ------------------------------------------------------------------

  function pickLabel(digit) {
    var picks = Array.prototype.filter.call(document.querySelectorAll("[data-label-pick]"), visible);
    var button = picks[digit - 1];
    if (!button) return false;
    button.click();
    return true;
  }

  document.addEventListener("click", function (event) {
    var button = event.target.closest ? event.target.closest("[data-label-pick]") : null;
    if (!button) return;
    var form = button.closest("[data-label-panel]");
    var select = form && form.querySelector("select[name=label]");
    if (!select) return;
    select.value = button.getAttribute("data-label-pick");
    Array.prototype.forEach.call(form.querySelectorAll("[data-label-pick]"), function (b) {
      b.classList.toggle("active", b === button);
      b.setAttribute("aria-pressed", b === button ? "true" : "false");
    });
  });

  // --- The overlay -------------------------------------------------------------

  function describe(entries, group, key, alt, help) {
    if (!entries[group]) entries[group] = [];
    entries[group].push([key, alt, help]);
  }

  function overlay() {
    var existing = document.getElementById("keys-overlay");
    if (existing) { closeOverlay(); return; }
    var entries = {};
    var order = [];
    function add(group, key, alt, help) {
      if (order.indexOf(group) === -1) order.push(group);
      describe(entries, group, key, alt, help);
    }
    Array.prototype.forEach.call(document.querySelectorAll("[data-key]"), function (el) {
      if (!visible(el) && el.tagName !== "FORM") return;
      var keys = el.getAttribute("data-key").split(" ");
      add(el.getAttribute("data-key-group") || "This page", keys[0], keys[1] || "", el.getAttribute("data-key-help") || el.textContent.trim());
    });
    var picks = Array.prototype.filter.call(document.querySelectorAll("[data-label-pick]"), visible);
    picks.slice(0, 9).forEach(function (button, index) {
      add("Labels", String(index + 1), "", "Label: " + (button.getAttribute("data-label-name") || button.textContent.trim()));
    });
    if (rows().length) ROW_KEYS.forEach(function (k) { add("Table", k[0], k[1], k[2]); });
    if (files().length) DIFF_KEYS.forEach(function (k) { add("Diff", k[0], k[1], k[2]); });
    if (differenceTable()) DIFFERENCE_KEYS.forEach(function (k) { add("Compare", k[0], k[1], k[2] + " (on to the next or previous page)"); });
    add("Everywhere", "?", "", "Show or hide this list");
    add("Everywhere", "Esc", "", "Close this list, or leave the field or control the focus is on");
    if (document.querySelector("form textarea")) add("Everywhere", "Ctrl+Enter", "", "In a text area: submit its form (a decision with edits ticked rejects those edits only)");

    var box = document.createElement("div");
    box.id = "keys-overlay";
    box.className = "keys-overlay";
    box.setAttribute("role", "dialog");
    box.setAttribute("aria-modal", "true");
    box.setAttribute("aria-label", "Keyboard shortcuts");
    var panel = document.createElement("div");
    panel.className = "keys-panel";
    var title = document.createElement("h2");
    title.textContent = "Keyboard shortcuts";
    panel.appendChild(title);
    order.forEach(function (group) {
      var heading = document.createElement("h3");
      heading.textContent = group;
      panel.appendChild(heading);
      var list = document.createElement("dl");
      var shown = {};
      entries[group].forEach(function (entry) {
        var id = entry[0] + "|" + entry[2];
        if (shown[id]) return;
        shown[id] = true;
        var dt = document.createElement("dt");
        [entry[0], entry[1]].forEach(function (k, i) {
          if (!k) return;
          if (i) dt.appendChild(document.createTextNode(" or "));
          var kbd = document.createElement("kbd");
          kbd.textContent = k;
          dt.appendChild(kbd);
        });
        var dd = document.createElement("dd");
        dd.textContent = entry[2];
        list.appendChild(dt);
        list.appendChild(dd);
      });
      panel.appendChild(list);
    });
    var note = document.createElement("p");
    note.className = "muted small";
    note.textContent = "Keys do nothing while you type in a field or while the focus is on a button, a checkbox or a link (Esc leaves it). docs/review.md lists every screen's keys.";
    panel.appendChild(note);
    var close = document.createElement("button");
    close.type = "button";
    close.className = "keys-close";
    close.textContent = "Close";
    close.addEventListener("click", closeOverlay);
    panel.appendChild(close);
    // The dialog takes the focus (and gives it back when it closes); Tab stays inside it.
    panel.setAttribute("tabindex", "-1");
    box.setAttribute("aria-labelledby", "keys-overlay-title");
    title.id = "keys-overlay-title";
    box.removeAttribute("aria-label");
    box.appendChild(panel);
    box.addEventListener("click", function (event) { if (event.target === box) closeOverlay(); });
    overlayReturn = document.activeElement;
    document.body.appendChild(box);
    panel.focus();
  }

  var overlayReturn = null;

  function closeOverlay() {
    var existing = document.getElementById("keys-overlay");
    if (!existing) return;
    existing.remove();
    var back = overlayReturn;
    overlayReturn = null;
    if (back && back !== document.body && document.contains(back) && back.focus) back.focus({preventScroll: true});
  }

  function trapTab(event, box) {
    var stops = Array.prototype.filter.call(box.querySelectorAll("button, a[href], [tabindex]"), visible);
    if (!stops.length) return;
    var index = stops.indexOf(document.activeElement);
    var next = event.shiftKey ? (index <= 0 ? stops.length - 1 : index - 1) : (index + 1) % stops.length;
    event.preventDefault();
    stops[next].focus();
  }

  // --- Deciding ------------------------------------------------------------------

  // The edits ticked for rejection in a decision form, and how many it has.
  function ticked(form) {
    var boxes = Array.prototype.slice.call(
      document.querySelectorAll('input[name="edits"][form="' + form.id + '"], #' + form.id + ' input[name="edits"]'));
    var names = [];
    boxes.forEach(function (box) {
      if (!box.checked) return;
      var edit = box.closest("[id^='edit-']");
      names.push(edit ? "#" + edit.id.slice(5) : box.value);
    });
    return {names: names, total: boxes.length};
  }

  // The verdict a form is about to get when some of its edits are ticked: a
  // proper subset ticked turns "reject" into "reject the ticked edits".
  function verdictWithTicks(form, verdict) {
    var picked = ticked(form);
    var partial = form.querySelector('button[name=verdict][value="reject_edits"]');
    if (verdict === "reject" && partial && picked.names.length && picked.names.length < picked.total) return "reject_edits";
    return verdict;
  }

  function say(form, words) {
    var hint = form.querySelector(".verdict-hint");
    if (hint) hint.textContent = words;
  }

  // Ctrl+Enter in the reason: the verdict picked with a or r, or, with edits
  // ticked, the rejection of those edits. Approving with edits ticked asks first.
  function submitReason(form) {
    var picked = ticked(form);
    var chosen = form.getAttribute("data-verdict");
    if (picked.names.length && form.querySelector("button[name=verdict]")) {
      var edits = "edit" + (picked.names.length > 1 ? "s " : " ") + picked.names.join(", ");
      if (chosen === "approve") {
        say(form, "You ticked " + edits + " for rejection but picked approve: untick them to approve, or press Esc, then r to reject only them.");
        return;
      }
      chosen = verdictWithTicks(form, chosen || "reject");
    }
    var submitter = chosen ? form.querySelector('button[name=verdict][value="' + chosen + '"]') : null;
    if (!submitter && form.querySelector("button[name=verdict]")) {
      // A decision needs its verdict: say how to pick one rather than post without it.
      say(form, "Pick a verdict first: Esc, then a (approve) or r (reject).");
      return;
    }
    if (submitter && submitter.disabled) return;
    if (form.requestSubmit) form.requestSubmit(submitter || undefined); else form.submit();
  }

  // --- Dispatch ----------------------------------------------------------------

  // Set while a key press activates a declared element: a verdict key then
  // takes the ticked edits into account, a click with the mouse does not.
  var byKey = false;

  document.addEventListener("keydown", function (event) {
    if (event.defaultPrevented || event.isComposing) return;
    var box = document.getElementById("keys-overlay");
    if (box) {
      // The list is a modal dialog: Esc or ? closes it, Tab stays inside it, nothing else acts.
      if (event.key === "Escape" || event.key === "?") { event.preventDefault(); closeOverlay(); }
      else if (event.key === "Tab") trapTab(event, box);
      return;
    }
    if (event.key === "Enter" && (event.ctrlKey || event.metaKey)) {
      var area = event.target.closest ? event.target.closest("textarea") : null;
      if (area && area.form) {
        event.preventDefault();
        submitReason(area.form);
      }
      return;
    }
    if (event.ctrlKey || event.metaKey || event.altKey) return;
    if (event.key === "Escape") {
      // Esc leaves the field being typed in, or the focused control, so keys work again.
      if ((typing(event.target) || control(event.target)) && event.target.blur) event.target.blur();
      keyFocused = null;
      lastControl = null;
      showPaused();
      return;
    }
    if (resting(event.target)) return;
    var key = event.key;
    if (key === "?") { event.preventDefault(); overlay(); return; }
    var el = declared(key);
    var done = false;
    if (el) {
      byKey = true;
      try { activate(el); } finally { byKey = false; }
      done = true;
    } else if (/^[1-9]$/.test(key)) {
      done = pickLabel(parseInt(key, 10));
    } else if (rows().length && (key === "j" || key === "k")) {
      done = moveRow(key === "j" ? 1 : -1);
    } else if (rows().length && (key === "o" || key === "Enter")) {
      done = openRow();
    } else if (differenceTable() && (key === "j" || key === "n" || key === "k" || key === "p")) {
      done = moveDifference(key === "j" || key === "n" ? 1 : -1);
    } else if (key === "j" || key === "n") {
      done = step(1);
    } else if (key === "k" || key === "p") {
      done = step(-1);
    } else if (key === "v") {
      done = toggleViewed();
    } else if (key === "u") {
      done = nextUnviewed();
    } else if (key === "e" || key === "x") {
      done = expand(key === "x");
    }
    if (done) event.preventDefault();
  });

  // Decision keys: with a reason already written, decide at once; without one,
  // remember the verdict and put the cursor in the reason (Ctrl+Enter decides).
  // By key, "reject" with a proper subset of the edits ticked rejects those edits.
  document.addEventListener("click", function (event) {
    var trigger = event.target.closest ? event.target.closest("[data-verdict-key]") : null;
    if (!trigger) return;
    var form = document.getElementById(trigger.getAttribute("data-form"));
    if (!form) return;
    event.preventDefault();
    var verdict = trigger.getAttribute("data-verdict-key");
    if (byKey) verdict = verdictWithTicks(form, verdict);
    var reason = form.querySelector("textarea[name=reason]");
    var button = form.querySelector('button[name=verdict][value="' + verdict + '"]');
    if (!button || button.disabled) return;
    if (reason && !reason.value.trim()) {
      form.setAttribute("data-verdict", verdict);
      var what = verdict === "reject_edits"
        ? "reject edit" + (ticked(form).names.length > 1 ? "s " : " ") + ticked(form).names.join(", ") + " and keep the rest"
        : button.textContent.trim().split(":")[0].toLowerCase();
      say(form, "Write the reason, then Ctrl+Enter to " + what + ".");
      reason.focus();
      return;
    }
    if (form.requestSubmit) form.requestSubmit(button); else button.click();
  });
})();
