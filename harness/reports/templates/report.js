(function () {
  "use strict";
  var body = document.body;
  // A script error anywhere on the page leaves a mark a test (or a person) can see.
  window.addEventListener("error", function (event) {
    body.setAttribute("data-script-error", String(event.message || "error"));
  });
  var each = function (selector, fn, root) {
    Array.prototype.forEach.call((root || document).querySelectorAll(selector), fn);
  };
  // Each item's details, the folded cells' items and the history's unchanged items are data (one
  // JSON block, every string once), made into markup only when they are opened.
  var source = document.getElementById("report-data");
  var data = source ? JSON.parse(source.textContent) : { strings: [], items: [], folded: {}, history: [] };
  var str = function (i) {
    return i < 0 ? "" : data.strings[i];
  };
  var OUTCOME = 3, MARK = 4, LINE = 5, WHY = 6, COUNTS = 7, FACTS = 8, LOGS = 9;
  var MARKS = [["mark-ok", "✓"], ["mark-explored", "·"], ["mark-bad", "✗"]];
  var el = function (tag, attrs, text) {
    var node = document.createElement(tag);
    Object.keys(attrs || {}).forEach(function (name) {
      node.setAttribute(name, attrs[name]);
    });
    if (text !== undefined) {
      node.textContent = text;
    }
    return node;
  };
  var mark = function (code) {
    return el("span", { class: MARKS[code][0] }, MARKS[code][1]);
  };
  function details(index) {
    var item = data.items[index];
    var box = el("div", { class: "details" });
    var dl = box.appendChild(el("dl", { class: "facts" }));
    var facts = item[FACTS];
    for (var f = 0; f < facts.length; f += 3) {
      dl.appendChild(el("dt", {}, str(facts[f])));
      var dd = dl.appendChild(el("dd"));
      var how = facts[f + 2];
      if (how === 0) {
        dd.textContent = str(facts[f + 1]);
      } else if (how === 1) {
        dd.appendChild(el("code", {}, str(facts[f + 1])));
      } else {
        var id = "cmd-" + index;
        dd.appendChild(el("pre", how === 3 ? { id: id } : {}, str(facts[f + 1])));
        if (how === 3) {
          dd.appendChild(el("button", { type: "button", class: "copy", "data-target": id }, "copy command"));
        }
      }
    }
    var logs = item[LOGS];
    for (var l = 0; l < logs.length; l += 2) {
      box.appendChild(el("h3", {}, str(logs[l])));
      box.appendChild(el("pre", {}, str(logs[l + 1])));
    }
    return box;
  }
  // An item's entry: its outcome, mark, why (a mismatch), counts and figures, opening its details.
  function entry(index) {
    var item = data.items[index];
    var outcome = str(item[OUTCOME]);
    var td = el("td", { class: "entry o-" + outcome + (item[WHY] >= 0 ? " mismatch" : ""), "data-outcome": outcome });
    var det = td.appendChild(el("details", { id: "item-" + index, "data-item": String(index) }));
    var summary = det.appendChild(el("summary"));
    summary.appendChild(el("span", { class: "outcome" }, outcome));
    summary.appendChild(document.createTextNode(" "));
    summary.appendChild(mark(item[MARK]));
    if (item[WHY] >= 0) {
      summary.appendChild(el("span", { class: "why" }, " " + str(item[WHY])));
    }
    if (item[COUNTS] >= 0) {
      summary.appendChild(el("span", { class: "counts" }, str(item[COUNTS])));
    }
    summary.appendChild(el("span", { class: "figures" }, str(item[LINE])));
    return td;
  }
  // A folded cell, opened: its items, a row each (and its excluded combinations).
  function fillCell(folded) {
    var box = folded.querySelector(".cell-items");
    var cell = folded.getAttribute("data-cell");
    var group = data.folded[cell];
    if (!box || !group || box.hasAttribute("data-filled")) {
      return;
    }
    box.setAttribute("data-filled", "");
    var table = el("table", { class: "cell-table" });
    table.appendChild(el("thead")).appendChild(el("tr")).appendChild(el("th", {}, "repro / mode"));
    table.querySelector("thead tr").appendChild(el("th", {}, cell));
    var tbody = table.appendChild(el("tbody"));
    group.items.forEach(function (index) {
      var item = data.items[index];
      var tr = tbody.appendChild(el("tr", { "data-repro": str(item[1]) }));
      tr.appendChild(el("th", {}, str(item[1]) + " / " + str(item[2])));
      tr.appendChild(entry(index));
    });
    group.excluded.forEach(function (row) {
      var tr = tbody.appendChild(el("tr", { "data-repro": str(row[0]) }));
      tr.appendChild(el("th", {}, str(row[0]) + " / " + str(row[1])));
      var td = tr.appendChild(el("td", { class: "entry o-excluded", "data-outcome": "excluded" }, "excluded"));
      td.appendChild(el("br"));
      td.appendChild(el("span", { class: "muted" }, str(row[2])));
    });
    box.appendChild(table);
    applyFilters();
  }
  function fillHistory(folded) {
    var box = folded.querySelector(".history-items");
    if (!box || box.hasAttribute("data-filled")) {
      return;
    }
    box.setAttribute("data-filled", "");
    var table = el("table", { class: "history-same" });
    var tr = table.appendChild(el("thead")).appendChild(el("tr"));
    tr.appendChild(el("th", {}, "item"));
    (data.runs || []).forEach(function (name) {
      tr.appendChild(el("th", {}, str(name)));
    });
    var tbody = table.appendChild(el("tbody"));
    data.history.forEach(function (row) {
      var line = tbody.appendChild(el("tr"));
      line.appendChild(el("th", {}, str(row[0])));
      row[1].forEach(function (run) {
        if (run[0] < 0) {
          line.appendChild(el("td", { class: "o-none" }, "-"));
          return;
        }
        var td = line.appendChild(el("td", { class: "o-" + str(run[0]), title: str(run[2]) }, str(run[0]) + " "));
        td.appendChild(mark(run[1]));
      });
    });
    box.appendChild(table);
  }
  // Opening anything folded makes its markup then (a toggle event does not bubble: caught on the way down).
  document.addEventListener(
    "toggle",
    function (event) {
      var target = event.target;
      if (!target.open) {
        return;
      }
      if (target.hasAttribute("data-item") && !target.querySelector(".details")) {
        target.appendChild(details(Number(target.getAttribute("data-item"))));
      } else if (target.classList.contains("folded-cell")) {
        fillCell(target);
      } else if (target.id === "history-unchanged") {
        fillHistory(target);
      }
    },
    true
  );
  // Filters: by repro, cell, family and outcome (and only rows with a mismatch); kept in the
  // address (#repro=F2&outcome=PASS) so a filtered page can be linked.
  var filters = {};
  each("#filters select[data-filter]", function (select) {
    filters[select.getAttribute("data-filter")] = select;
  });
  var only = document.getElementById("only-mismatches");
  var value = function (name) {
    return filters[name] ? filters[name].value : "";
  };
  var cellOk = function (node) {
    var cell = value("cell"), family = value("family");
    return (!cell || node.getAttribute("data-cell") === cell) && (!family || node.getAttribute("data-family") === family);
  };
  function applyFilters() {
    var repro = value("repro"), outcome = value("outcome"), mismatches = only && only.checked;
    var shownRows = 0;
    // The matrix: a column per cell shown, a row per repro with an entry shown.
    each("#matrix thead th[data-cell]", function (th) {
      th.hidden = !cellOk(th);
    });
    each("#matrix tbody tr", function (tr) {
      var any = false;
      each("td[data-cell]", function (td) {
        td.hidden = !cellOk(td);
        if (!td.hidden && (!outcome || td.getAttribute("data-outcome") === outcome)) {
          any = true;
        }
      }, tr);
      tr.hidden =
        !any ||
        (repro && tr.getAttribute("data-repro") !== repro) ||
        (mismatches && !tr.classList.contains("has-mismatch"));
      shownRows += tr.hidden ? 0 : 1;
    });
    // A folded cell: shown where one of its items (or excluded combinations) passes the filters.
    each("#folded-cells details.folded-cell", function (folded) {
      var group = data.folded[folded.getAttribute("data-cell")] || { items: [], excluded: [] };
      var match = function (r, o) {
        return (!repro || r === repro) && (!outcome || o === outcome);
      };
      var some =
        group.items.some(function (i) {
          return match(str(data.items[i][1]), str(data.items[i][OUTCOME]));
        }) ||
        group.excluded.some(function (row) {
          return match(str(row[0]), "excluded");
        });
      folded.hidden = mismatches || !cellOk(folded) || !some;
      each(".cell-items tbody tr", function (tr) {
        var td = tr.querySelector("td");
        tr.hidden = !match(tr.getAttribute("data-repro"), td ? td.getAttribute("data-outcome") : "");
      }, folded);
    });
    each("#excluded-items tbody tr", function (tr) {
      tr.hidden =
        !cellOk(tr) || (repro && tr.getAttribute("data-repro") !== repro) || (outcome && outcome !== "excluded");
    });
    var count = document.getElementById("filter-count");
    var active = Object.keys(filters).some(value) || mismatches;
    if (count) {
      count.textContent = active ? shownRows + " rows of the table shown" : "";
    }
    body.setAttribute("data-rows-shown", String(shownRows));
  }
  function readAddress() {
    var hash = decodeURIComponent(window.location.hash.slice(1));
    if (hash.indexOf("=") < 0) {
      return false;
    }
    hash.split("&").forEach(function (pair) {
      var parts = pair.split("=");
      var select = filters[parts[0]];
      if (select) {
        select.value = parts.slice(1).join("=");
      } else if (parts[0] === "mismatches" && only) {
        only.checked = parts[1] === "1";
      }
    });
    return true;
  }
  function writeAddress() {
    var pairs = Object.keys(filters)
      .filter(value)
      .map(function (name) {
        return name + "=" + encodeURIComponent(value(name));
      });
    if (only && only.checked) {
      pairs.push("mismatches=1");
    }
    if (window.history && window.history.replaceState) {
      window.history.replaceState(null, "", pairs.length ? "#" + pairs.join("&") : window.location.pathname);
    }
  }
  Object.keys(filters).forEach(function (name) {
    filters[name].addEventListener("change", function () {
      applyFilters();
      writeAddress();
    });
  });
  if (only) {
    only.addEventListener("change", function () {
      applyFilters();
      writeAddress();
    });
  }
  // A link to an item (#item-6) opens its details, and the folded cell it is in first.
  function openTarget() {
    if (readAddress()) {
      applyFilters();
      return;
    }
    var id = decodeURIComponent(window.location.hash.slice(1));
    var target = id ? document.getElementById(id) : null;
    var match = /^item-(\d+)$/.exec(id);
    if (!target && match && data.items[Number(match[1])]) {
      var cell = str(data.items[Number(match[1])][0]);
      each("#folded-cells details.folded-cell", function (folded) {
        if (folded.getAttribute("data-cell") === cell) {
          fillCell(folded);
          folded.open = true;
        }
      });
      target = document.getElementById(id);
    }
    if (target && target.tagName === "DETAILS") {
      target.open = true;
      if (!target.querySelector(".details") && target.hasAttribute("data-item")) {
        target.appendChild(details(Number(target.getAttribute("data-item"))));
      }
      target.scrollIntoView();
    }
  }
  window.addEventListener("hashchange", openTarget);
  document.addEventListener("click", function (event) {
    var button = event.target;
    if (!button.classList || !button.classList.contains("copy")) {
      return;
    }
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
  // Unfiltered, every row is shown as written: nothing to go over at load (10,000 squares).
  body.setAttribute("data-rows-shown", String(document.querySelectorAll("#matrix tbody tr").length));
  openTarget();
  body.setAttribute("data-report-ready", String(document.querySelectorAll("#matrix td.entry").length));
  body.setAttribute("data-ready-ms", String(Math.round(performance.now())));
  window.addEventListener("load", function () {
    body.setAttribute("data-load-ms", String(Math.round(performance.now())));
  });
})();
