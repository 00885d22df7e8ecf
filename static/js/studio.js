/* Studio: draws uPlot charts from <script type="application/json" id="chart-data"> blocks that
   the server renders (and HTMX re-renders while a run is live). No other behaviour lives here. */
(function () {
  "use strict";
  var COLORS = ["#2563eb", "#dc2626", "#16a34a", "#9333ea", "#ea580c", "#0891b2", "#4b5563", "#db2777"];
  var plots = {};

  // uPlot gives the y axis a fixed 50 px, which clips labels such as "10,000" to "0,000": size it
  // to its widest tick label (the autosize recipe from uPlot's demos), re-measured on each redraw.
  function axisSize(self, values, axisIdx, cycleNum) {
    var axis = self.axes[axisIdx];
    if (cycleNum > 1) return axis._size;  // uPlot converges within a cycle or two; keep the last size
    var size = axis.ticks.size + axis.gap;
    var longest = (values || []).reduce(function (a, v) { return String(v).length > a.length ? String(v) : a; }, "");
    if (longest !== "") {
      self.ctx.font = axis.font[0];
      size += self.ctx.measureText(longest).width / devicePixelRatio;
    }
    return Math.ceil(size) + 4;
  }

  // The decimals that write x exactly (0.00025 → 5, 2.5e-7 → 8), to 12 significant digits.
  function fractionDigits(x) {
    var parts = Number(x.toPrecision(12)).toString().split("e-");
    var digits = (parts[0].split(".")[1] || "").length;
    return parts.length > 1 ? digits + parseInt(parts[1], 10) : digits;
  }

  // uPlot's default labels keep at most three decimals, so a loss moving in the fourth (0.6931,
  // 0.6932) read "0.693" on every tick: each label gets the decimals of the tick spacing.
  function tickLabels(self, splits, axisIdx, foundSpace, foundIncr) {
    var decimals = foundIncr > 0 ? Math.min(20, fractionDigits(foundIncr)) : 3;
    return splits.map(function (v) { return v == null ? "" : v.toLocaleString(undefined, { minimumFractionDigits: decimals, maximumFractionDigits: decimals }); });
  }

  // Steps are whole numbers: no ticks at step 1.2, 1.4, ... on a short run.
  var STEP_INCRS = [];
  for (var m = 1; m <= 1e12; m *= 10) STEP_INCRS.push(m, 2 * m, 5 * m);

  function draw(root) {
    if (typeof uPlot === "undefined") return;
    var blocks = (root || document).querySelectorAll('script[type="application/json"][id$="chart-data"]');
    blocks.forEach(function (block) {
      var charts;
      try { charts = JSON.parse(block.textContent); } catch (e) { return; }
      charts.forEach(function (chart) {
        var el = document.getElementById(chart.id);
        if (!el || !chart.x || !chart.x.length) return;
        if (plots[chart.id]) { plots[chart.id].destroy(); delete plots[chart.id]; }
        el.textContent = "";
        var series = [{ label: "step" }];
        var data = [chart.x];
        chart.series.forEach(function (s, i) {
          series.push({ label: s.label, stroke: COLORS[i % COLORS.length], width: 1.5, spanGaps: true, points: { show: chart.x.length < 60 } });
          data.push(s.values);
        });
        var width = Math.max(200, el.clientWidth || 400);
        plots[chart.id] = new uPlot({
          width: width, height: 220, series: series,
          scales: { x: { time: false } },
          axes: [{ label: "step", incrs: STEP_INCRS }, { size: axisSize, values: tickLabels }],
          legend: { live: true }
        }, data, el);
        el.dataset.drawn = "true";
      });
    });
  }

  function resize() {
    Object.keys(plots).forEach(function (id) {
      var el = document.getElementById(id);
      if (el && el.clientWidth) plots[id].setSize({ width: el.clientWidth, height: 220 });
    });
  }

  window.studioDrawCharts = draw;
  document.addEventListener("DOMContentLoaded", function () { draw(document); });
  document.addEventListener("htmx:afterSettle", function (evt) { draw(evt.target.parentNode || document); });
  window.addEventListener("resize", resize);
})();
