(function () {
  "use strict";
  var body = document.body;
  // A script error anywhere on the page leaves a mark a test (or a person) can see.
  window.addEventListener("error", function (event) {
    body.setAttribute("data-script-error", String(event.message || "error"));
  });
  function openTarget() {
    var id = decodeURIComponent(window.location.hash.slice(1));
    var target = id ? document.getElementById(id) : null;
    if (target && target.tagName === "DETAILS") {
      target.open = true;
    }
  }
  window.addEventListener("hashchange", openTarget);
  openTarget();
  Array.prototype.forEach.call(document.querySelectorAll("button.copy"), function (button) {
    button.addEventListener("click", function () {
      var source = document.getElementById(button.getAttribute("data-target"));
      var text = source ? source.textContent : "";
      var selectIt = function () {
        var range = document.createRange();
        range.selectNodeContents(source);
        var selection = window.getSelection();
        selection.removeAllRanges();
        selection.addRange(range);
        button.textContent = "selected: press Ctrl+C";
      };
      if (navigator.clipboard && window.isSecureContext) {
        navigator.clipboard.writeText(text).then(function () {
          button.textContent = "copied";
        }, selectIt);
      } else {
        selectIt();
      }
    });
  });
  var only = document.getElementById("only-mismatches");
  if (only) {
    only.addEventListener("change", function () {
      body.classList.toggle("only-mismatches", only.checked);
    });
  }
  // With several model families in one run: show the cells of one family only.
  var family = document.getElementById("family-filter");
  if (family) {
    family.addEventListener("change", function () {
      Array.prototype.forEach.call(document.querySelectorAll("#matrix [data-family]"), function (cell) {
        cell.style.display = !family.value || cell.getAttribute("data-family") === family.value ? "" : "none";
      });
    });
  }
  body.setAttribute("data-report-ready", String(document.querySelectorAll("#matrix td.entry").length));
})();
