/* hookgraph report: the lazy module tree and sortable tables. No network, no libraries. */
(function () {
  "use strict";
  var CHUNK = 400; // rows rendered per batch: a container with 20k children stays responsive

  function el(tag, cls, text) {
    var e = document.createElement(tag);
    if (cls) e.className = cls;
    if (text !== undefined) e.textContent = text;
    return e;
  }

  function fmtCount(n) {
    if (n === null || n === undefined) return "";
    if (n >= 1e6) return (n / 1e6).toFixed(n >= 1e7 ? 0 : 1) + "M params";
    if (n >= 1e3) return (n / 1e3).toFixed(n >= 1e4 ? 0 : 1) + "k params";
    return n ? n + " params" : "";
  }

  function parentName(name) {
    if (name === "") return null;
    var cut = name.lastIndexOf(".");
    return cut < 0 ? "" : name.slice(0, cut);
  }

  function initTree() {
    var host = document.getElementById("tree");
    var src = document.getElementById("hg-tree");
    if (!host || !src) return;
    var data = JSON.parse(src.textContent);
    var nodes = data.nodes, hooks = data.hooks, colors = data.colors;
    var index = new Map(), kids = [], roots = [], rowOf = new Map();
    nodes.forEach(function (n, i) { index.set(n[0], i); kids.push([]); });
    nodes.forEach(function (n, i) {
      var p = parentName(n[0]);
      var pi = p === null ? undefined : index.get(p);
      if (pi === undefined || pi === i) roots.push(i); else kids[pi].push(i);
    });
    var inside = new Int32Array(nodes.length); // hooked modules strictly below each node
    Object.keys(hooks).forEach(function (name) {
      var p = parentName(name);
      while (p !== null) {
        var pi = index.get(p);
        if (pi !== undefined) inside[pi]++;
        p = parentName(p);
      }
    });

    function makeRow(i) {
      var n = nodes[i], name = n[0];
      var wrap = el("div", "node");
      var row = el("div", "row");
      row.dataset.name = name;
      row.dataset.i = i;
      var isContainer = kids[i].length > 0;
      if (isContainer) row.classList.add("container");
      row.appendChild(el("span", "tw", isContainer ? "\u25B8" : "\u00B7"));
      row.appendChild(el("span", "nm", name === "" ? "(model)" : name.slice(name.lastIndexOf(".") + 1)));
      row.title = name === "" ? "(the root module)" : name;
      row.appendChild(el("span", "ty", n[1]));
      if (n[2]) row.appendChild(el("span", "pc", fmtCount(n[2])));
      var hs = hooks[name];
      if (hs) {
        row.classList.add("hooked");
        hs.forEach(function (h) {
          var b = el("span", "badge", h[0] + " \u00B7 " + h[1] + (h[3] ? "[" + h[3] + "]" : "") + " \u2192 " + h[2]);
          b.style.setProperty("--c", colors[h[0]] || "#888");
          row.appendChild(b);
        });
      }
      if (inside[i] > 0) row.appendChild(el("span", "inside", inside[i] + " hooked inside"));
      wrap.appendChild(row);
      if (isContainer) {
        var k = el("div", "kids");
        k.hidden = true;
        wrap.appendChild(k);
        row.addEventListener("click", function () { toggle(i, k.hidden); });
      }
      rowOf.set(i, wrap);
      return wrap;
    }

    function fill(k, list, start) {
      var end = Math.min(list.length, start + CHUNK);
      var frag = document.createDocumentFragment();
      for (var j = start; j < end; j++) frag.appendChild(makeRow(list[j]));
      k.appendChild(frag);
      k.dataset.filled = end;
      if (end < list.length) {
        var more = el("button", "more", "show " + Math.min(CHUNK, list.length - end) + " more of " + (list.length - end));
        more.addEventListener("click", function (ev) { ev.stopPropagation(); more.remove(); fill(k, list, end); });
        k.appendChild(more);
      }
    }

    function toggle(i, open) {
      var wrap = rowOf.get(i);
      if (!wrap) return;
      var k = wrap.lastChild;
      if (!k.classList || !k.classList.contains("kids")) return;
      if (open && !k.dataset.filled) fill(k, kids[i], 0);
      k.hidden = !open;
      wrap.firstChild.firstChild.textContent = open ? "\u25BE" : "\u25B8";
    }

    function ensureRendered(i) {
      // Render node i and its ancestors, opening each ancestor and its batches as needed.
      if (rowOf.has(i)) return;
      var p = parentName(nodes[i][0]);
      var pi = p === null ? undefined : index.get(p);
      if (pi === undefined) return;
      ensureRendered(pi);
      toggle(pi, true);
      var k = rowOf.get(pi).lastChild;
      while (!rowOf.has(i) && Number(k.dataset.filled) < kids[pi].length) {
        var more = k.querySelector(":scope > button.more");
        if (more) more.remove();
        fill(k, kids[pi], Number(k.dataset.filled));
      }
    }

    function reveal(name, flash) {
      var i = index.get(name);
      if (i === undefined) return;
      ensureRendered(i);
      var p = parentName(name);
      while (p !== null) {
        var pi = index.get(p);
        if (pi !== undefined) toggle(pi, true);
        p = parentName(p);
      }
      if (flash) {
        var row = rowOf.get(i).firstChild;
        row.classList.add("flash");
        row.scrollIntoView({ block: "center" });
        setTimeout(function () { row.classList.remove("flash"); }, 1500);
      }
    }

    var frag = document.createDocumentFragment();
    roots.forEach(function (i) { frag.appendChild(makeRow(i)); });
    host.appendChild(frag);
    roots.forEach(function (i) { toggle(i, true); }); // the top level is open, every container below closed

    var expandBtn = document.getElementById("expand-hooked");
    if (expandBtn) expandBtn.addEventListener("click", function () { Object.keys(hooks).forEach(function (n) { reveal(n, false); }); });
    var collapseBtn = document.getElementById("collapse-all");
    if (collapseBtn) collapseBtn.addEventListener("click", function () {
      rowOf.forEach(function (wrap, i) { if (roots.indexOf(i) < 0) toggle(i, false); });
    });
    var search = document.getElementById("tree-search"), results = document.getElementById("results");
    if (search && results) {
      var timer = null;
      search.addEventListener("input", function () {
        clearTimeout(timer);
        timer = setTimeout(function () {
          results.textContent = "";
          var q = search.value.trim().toLowerCase();
          if (!q) return;
          var found = 0;
          for (var i = 0; i < nodes.length && found < 100; i++) {
            if (nodes[i][0].toLowerCase().indexOf(q) >= 0 || nodes[i][1].toLowerCase().indexOf(q) >= 0) {
              var r = el("div", "", (nodes[i][0] || "(model)") + "  " + nodes[i][1]);
              r.dataset.name = nodes[i][0];
              r.addEventListener("click", function (ev) { reveal(ev.currentTarget.dataset.name, true); });
              results.appendChild(r);
              found++;
            }
          }
          if (!found) results.textContent = "no module matches";
        }, 150);
      });
    }
    window.hookgraphTree = { reveal: reveal, expandHooked: function () { if (expandBtn) expandBtn.click(); } };
  }

  function initSortable() {
    document.querySelectorAll("table.sortable").forEach(function (table) {
      var ths = table.querySelectorAll("thead th");
      ths.forEach(function (th, col) {
        th.addEventListener("click", function () {
          var asc = !th.classList.contains("asc");
          ths.forEach(function (h) { h.classList.remove("asc", "desc"); });
          th.classList.add(asc ? "asc" : "desc");
          var body = table.tBodies[0];
          var rows = Array.prototype.slice.call(body.rows);
          function key(r) {
            var c = r.cells[col];
            var v = c ? (c.dataset.v !== undefined ? c.dataset.v : c.textContent) : "";
            var f = parseFloat(v);
            return v !== "" && !isNaN(f) && isFinite(v) ? f : v;
          }
          rows.sort(function (a, b) {
            var x = key(a), y = key(b);
            var cmp = typeof x === "number" && typeof y === "number" ? x - y : String(x).localeCompare(String(y), undefined, { numeric: true });
            return asc ? cmp : -cmp;
          });
          rows.forEach(function (r) { body.appendChild(r); });
        });
      });
    });
  }

  function start() { initTree(); initSortable(); }
  if (document.readyState === "loading") document.addEventListener("DOMContentLoaded", start); else start();
})();
