// Review item: the "reject the ticked edits" button says how many edits are
// ticked and is enabled only for a proper subset (none ticked: nothing to
// reject; all ticked: reject the whole candidate instead). The server checks
// the same, this only saves a round trip.
(function () {
  "use strict";
  function update() {
    var button = document.getElementById("reject-edits");
    var note = document.getElementById("picked");
    if (!button || !note) { return; }
    var boxes = document.querySelectorAll('input[name="edits"][form="decide-form"]');
    var ticked = 0;
    boxes.forEach(function (box) { if (box.checked) { ticked += 1; } });
    var total = boxes.length;
    button.disabled = ticked === 0 || ticked === total;
    if (ticked === 0) {
      note.textContent = "Tick edits to reject only those; a new candidate without them is derived and checked again.";
    } else if (ticked === total) {
      note.textContent = "Every edit is ticked: reject the whole candidate instead.";
    } else {
      note.textContent = ticked + " of " + total + " edits will be rejected; the other " + (total - ticked) +
        " are kept in a derived candidate that goes through the checks again.";
    }
  }
  document.addEventListener("change", function (event) {
    if (event.target.matches('input[name="edits"]')) { update(); }
  });
  document.addEventListener("DOMContentLoaded", update);
})();
