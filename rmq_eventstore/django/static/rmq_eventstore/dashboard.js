/* The event store dashboard: small behaviours and self-drawn SVG line charts (no library, no CDN). */
(function () {
  "use strict";
  var SVG = "http://www.w3.org/2000/svg";
  var COLORS = ["#417690", "#d9822b", "#5b8c3a", "#b5473a", "#7a5ea8", "#2a9d8f", "#c44f8a", "#6b6b6b"];

  function el(name, attrs, parent) {
    var node = document.createElementNS(SVG, name);
    Object.keys(attrs || {}).forEach(function (k) { node.setAttribute(k, attrs[k]); });
    if (parent) { parent.appendChild(node); }
    return node;
  }

  function formatNumber(v) {
    if (v >= 1e9) { return (v / 1e9).toFixed(1) + "G"; }
    if (v >= 1e6) { return (v / 1e6).toFixed(1) + "M"; }
    if (v >= 1e4) { return (v / 1e3).toFixed(1) + "k"; }
    if (v !== Math.round(v)) { return v.toFixed(2); }
    return String(v);
  }

  function formatTime(ms) {
    var d = new Date(ms);
    function two(n) { return (n < 10 ? "0" : "") + n; }
    return two(d.getHours()) + ":" + two(d.getMinutes()) + ":" + two(d.getSeconds());
  }

  /* Draw `series` ([{name, points: [[t, v], ...]}]) into the <figure> `figure` as one SVG. */
  function lineChart(figure, series) {
    var old = figure.querySelector("svg");
    if (old) { figure.removeChild(old); }
    var oldLegend = figure.querySelector(".rmq-legend");
    if (oldLegend) { figure.removeChild(oldLegend); }
    var W = 720, H = 220, L = 56, R = 12, T = 10, B = 26;
    var svg = el("svg", {viewBox: "0 0 " + W + " " + H, role: "img", "class": "rmq-svg"}, figure);
    var all = [];
    series.forEach(function (s) { all = all.concat(s.points); });
    if (!all.length) {
      el("text", {x: W / 2, y: H / 2, "text-anchor": "middle", "class": "rmq-empty"}, svg).textContent = "no samples yet";
      figure.setAttribute("data-drawn", "0");
      return;
    }
    var t0 = Math.min.apply(null, all.map(function (p) { return p[0]; }));
    var t1 = Math.max.apply(null, all.map(function (p) { return p[0]; }));
    var vmax = Math.max.apply(null, all.map(function (p) { return p[1]; }));
    if (t1 === t0) { t1 = t0 + 1000; }
    if (vmax <= 0) { vmax = 1; }
    function x(t) { return L + (W - L - R) * (t - t0) / (t1 - t0); }
    function y(v) { return T + (H - T - B) * (1 - v / vmax); }
    [0, 0.5, 1].forEach(function (f) {
      var yy = y(vmax * f);
      el("line", {x1: L, x2: W - R, y1: yy, y2: yy, "class": "rmq-grid"}, svg);
      el("text", {x: L - 6, y: yy + 4, "text-anchor": "end", "class": "rmq-tick"}, svg).textContent = formatNumber(vmax * f);
    });
    el("text", {x: L, y: H - 6, "class": "rmq-tick"}, svg).textContent = formatTime(t0);
    el("text", {x: W - R, y: H - 6, "text-anchor": "end", "class": "rmq-tick"}, svg).textContent = formatTime(t1);
    var legend = document.createElement("ul");
    legend.className = "rmq-legend";
    var drawn = 0;
    series.forEach(function (s, i) {
      if (!s.points.length) { return; }
      var color = COLORS[i % COLORS.length];
      var d = s.points.map(function (p, j) {
        return (j ? "L" : "M") + x(p[0]).toFixed(1) + " " + y(p[1]).toFixed(1);
      }).join(" ");
      el("path", {d: d, stroke: color, "class": "rmq-line", "data-series": s.name, "data-points": s.points.length}, svg);
      var last = s.points[s.points.length - 1];
      el("circle", {cx: x(last[0]).toFixed(1), cy: y(last[1]).toFixed(1), r: 3, fill: color}, svg);
      var item = document.createElement("li");
      var swatch = document.createElement("span");
      swatch.className = "rmq-swatch";
      swatch.style.backgroundColor = color;
      item.appendChild(swatch);
      item.appendChild(document.createTextNode(s.name + ": " + formatNumber(last[1])));
      legend.appendChild(item);
      drawn += 1;
    });
    figure.appendChild(legend);
    figure.setAttribute("data-drawn", String(drawn));
  }

  function drawCharts(root, doc) {
    var status = document.getElementById("rmq-chart-status");
    var tput = [], lag = [], dispatch = [], notes = [];
    (doc.brokers || []).forEach(function (b) {
      if (b.error) { notes.push(b.broker + ": " + b.error); return; }
      tput.push({name: b.broker, points: b.throughput || []});
      dispatch.push({name: b.broker, points: b.dispatchBehind || []});
      Object.keys(b.lag || {}).forEach(function (g) {
        lag.push({name: (doc.brokers.length > 1 ? b.broker + "/" : "") + g, points: b.lag[g]});
      });
      notes.push(b.broker + ": " + b.samples + " samples, one every " + (b.intervalMillis / 1000) + " s");
    });
    if (doc.error) { notes.unshift(doc.error); }
    lineChart(document.getElementById("rmq-chart-throughput"), tput);
    lineChart(document.getElementById("rmq-chart-lag"), lag);
    lineChart(document.getElementById("rmq-chart-dispatch"), dispatch);
    status.textContent = notes.join(" · ") || "no broker";
    root.setAttribute("data-loaded", "1");
  }

  function loadCharts(root) {
    var url = root.getAttribute("data-url");
    var refresh = parseInt(root.getAttribute("data-refresh"), 10) || 5000;
    function tick() {
      fetch(url, {credentials: "same-origin", headers: {"Accept": "application/json"}})
        .then(function (r) { return r.json(); })
        .then(function (doc) { drawCharts(root, doc); })
        .catch(function (e) {
          document.getElementById("rmq-chart-status").textContent = "the history could not be loaded: " + e;
        })
        .then(function () { window.setTimeout(tick, refresh); });
    }
    tick();
  }

  function init() {
    Array.prototype.forEach.call(document.querySelectorAll("select[data-autosubmit]"), function (s) {
      s.addEventListener("change", function () { s.form.submit(); });
    });
    Array.prototype.forEach.call(document.querySelectorAll(".rmq-disk-fill[data-width]"), function (n) {
      n.style.width = Math.max(0, Math.min(100, parseFloat(n.getAttribute("data-width")) || 0)) + "%";
    });
    Array.prototype.forEach.call(document.querySelectorAll(".rmq-mark[data-left]"), function (n) {
      n.style.left = Math.max(0, Math.min(100, parseFloat(n.getAttribute("data-left")) || 0)) + "%";
    });
    var charts = document.getElementById("rmq-charts");
    if (charts) { loadCharts(charts); }
  }

  if (document.readyState === "loading") {
    document.addEventListener("DOMContentLoaded", init);
  } else {
    init();
  }
}());
