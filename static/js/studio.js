/* Studio: draws uPlot charts from <script type="application/json" id="chart-data"> blocks that
   the server renders (and HTMX re-renders while a run is live), and the few page-wide rules for
   HTMX swaps below (error answers, log boxes, focus, open disclosures, stale banners, durations that
   tick, fields typed in after a request went out). No other behaviour lives here. */
(function () {
  "use strict";
  var COLORS = ["#2563eb", "#dc2626", "#16a34a", "#9333ea", "#ea580c", "#0891b2", "#4b5563", "#db2777"];
  var plots = {};

  // uPlot gives the y axis a fixed 50 px, which clips labels such as "10,000" to "0,000": size it
  // to its widest tick label (the autosize recipe from uPlot's demos), re-measured on each redraw.
  // uPlot lays the plot out in a few cycles, and the labels of a later one can be wider ("6.0" in
  // the first, "6.25" in the next): the size follows them up, never down, so the cycles still
  // converge (the demo's recipe kept the first cycle's size, and "6.25" was drawn as "5.25", its 6 cut).
  function axisSize(self, values, axisIdx, cycleNum) {
    var axis = self.axes[axisIdx];
    var size = axis.ticks.size + axis.gap;
    var longest = (values || []).reduce(function (a, v) { return String(v).length > a.length ? String(v) : a; }, "");
    if (longest !== "") {
      self.ctx.font = axis.font[0];
      size += self.ctx.measureText(longest).width / devicePixelRatio;
    }
    size = Math.ceil(size) + 4;
    return cycleNum > 1 ? Math.max(size, axis._size || 0) : size;
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


(function () {
  "use strict";

  // ---- htmx error answers without a partial, and no answer at all ---------------------------------
  // Findings (400/402/409/422) come back as a partial and swap into their target (htmx-config in
  // base.html). Any other error answer (a 403 or 404 page, a CSRF refusal, a 5xx, a whole page or
  // nothing at any error status) would change nothing on screen: say in one announced banner what
  // happened, with the error page's own sentence and links when it has them. So too when no answer
  // came (the server is down, the network dropped: htmx:sendError, htmx:timeout): a poll's banner goes
  // with the next answer that does come, a user action's stays.
  var HINTS = {
    404: "It may have been deleted since this page was loaded (in another tab, or by a teammate): reload the page to see what is there now."
  };

  function isPartial(detail) {
    var body = detail.xhr.responseText || "";
    return detail.shouldSwap && body.trim() !== "" && !/<html[\s>]/i.test(body);
  }

  // A poll (every 4s, run-changed) fires with no event or one htmx made; a button or a form, with the user's.
  function isPoll(detail) {
    var cause = detail.requestConfig && detail.requestConfig.triggeringEvent;
    return !(cause && cause.isTrusted);
  }

  function bannerBox() {
    var box = document.createElement("div");
    box.id = "request-error";
    box.className = "alert alert-error request-error";
    box.setAttribute("role", "alert");
    return box;
  }

  // Dismissing the banner gives focus back to where it was when the banner came (else to the page's
  // content), not to <body>, from where keyboard users would start again at the top.
  function addDismiss(box) {
    var before = document.activeElement !== document.body ? document.activeElement : null;
    var dismiss = box.appendChild(document.createElement("button"));
    dismiss.type = "button";
    dismiss.className = "btn-link";
    dismiss.textContent = "Dismiss";
    dismiss.addEventListener("click", function () {
      box.remove();
      var next = before && document.body.contains(before) ? before : document.getElementById("main");
      if (!next) return;
      if (next.tabIndex < 0 && !next.hasAttribute("tabindex")) next.setAttribute("tabindex", "-1");
      next.focus();
    });
    return box;
  }

  function unreachableBanner(poll) {
    var box = bannerBox();
    box.dataset.unreachable = poll ? "poll" : "action";
    box.appendChild(document.createElement("p")).textContent = poll
      ? "The Studio could not be reached, so this page may be out of date; it will retry and update itself once the Studio answers."
      : "The Studio could not be reached, so this may not have been done: check your connection, then reload the page to see what is there and try again.";
    return addDismiss(box);
  }

  function errorBanner(status, html) {
    var box = bannerBox();
    var card = new DOMParser().parseFromString(html || "", "text/html").querySelector("main [role=alert]");
    var hint = document.createElement("p");
    hint.textContent = HINTS[status] || "";
    if (card) {
      Array.prototype.forEach.call(card.children, function (child) {
        var node;
        if (/^H[1-6]$/.test(child.tagName)) {  // the error page's title: not a heading of this page
          node = document.createElement("p");
          node.appendChild(document.createElement("strong")).textContent = child.textContent.trim();
        } else {
          node = document.importNode(child, true);
        }
        if (hint.textContent && node.querySelector("a")) { box.appendChild(hint); hint = document.createElement("p"); }
        box.appendChild(node);
      });
    } else {
      var sentence = status === 404 ? "What this acted on was not found." : status === 403 ? "The Studio refused this." : "The Studio could not do this (HTTP " + status + ").";
      box.appendChild(document.createElement("p")).textContent = sentence;
      if (!hint.textContent) hint.textContent = "Reload the page and try again; if it keeps happening, tell your administrator.";
    }
    if (hint.textContent) box.appendChild(hint);
    return addDismiss(box);
  }

  function showBanner(box) {
    var main = document.getElementById("main");
    if (!main) return;
    var old = document.getElementById("request-error");
    if (old && old.textContent === box.textContent) return;  // a poll failing again: announce it once
    if (old) old.replaceWith(box); else main.insertBefore(box, main.firstChild);
  }

  window.studioShowRequestError = function (status, html) { showBanner(errorBanner(status, html)); };

  // A poll answered 404: what it polls is gone (a run deleted in another tab), and asking again every
  // few seconds only met the same 404 for as long as the tab stayed open. The poller is replaced by a
  // copy that does not poll (htmx stops polling an element that left the page), focus kept in place.
  function childPath(root, node) {
    if (!node || node === root || !root.contains(node)) return null;
    var path = [];
    for (; node && node !== root; node = node.parentElement) path.unshift(Array.prototype.indexOf.call(node.parentElement.children, node));
    return node === root ? path : null;
  }

  function stopPolling(elt) {
    if (!elt || !/\bevery\b/.test(elt.getAttribute("hx-trigger") || "")) return;
    var still = elt.cloneNode(true);
    still.removeAttribute("hx-get");
    still.removeAttribute("hx-trigger");
    var focused = childPath(elt, document.activeElement);
    elt.replaceWith(still);
    if (typeof htmx !== "undefined") htmx.process(still);
    if (focused) {
      var node = still;
      focused.forEach(function (index) { node = node && node.children[index]; });
      if (node) node.focus();
    }
  }

  document.addEventListener("htmx:beforeSwap", function (evt) {
    var xhr = evt.detail.xhr;
    if (!xhr || xhr.status < 400 || isPartial(evt.detail)) return;
    evt.detail.shouldSwap = false;
    showBanner(errorBanner(xhr.status, xhr.responseText));
    if (xhr.status === 404 && isPoll(evt.detail)) stopPolling(evt.detail.elt);
  });

  function unreachable(evt) {
    var shown = document.getElementById("request-error");
    if (shown && shown.dataset.unreachable && isPoll(evt.detail)) return;  // polls every 2-5 s: one banner
    showBanner(unreachableBanner(isPoll(evt.detail)));
  }
  document.addEventListener("htmx:sendError", unreachable);
  document.addEventListener("htmx:timeout", unreachable);
  // Only a poll's banner goes with the next answer: an action's says it may not have been done, which a
  // later poll or estimate answering does not change, so it stays until dismissed or the page reloads.
  document.addEventListener("htmx:afterRequest", function (evt) {
    var shown = document.getElementById("request-error");
    if (evt.detail.successful && shown && shown.dataset.unreachable === "poll") shown.remove();
  });

  // ---- log boxes follow their newest line ----------------------------------------------------------
  // A log box (pre.log) shows its end, where the newest lines are, when the page opens and each time
  // polling replaces it or adds to it; unless the reader has scrolled up to read, whose place is then
  // kept. Earlier lines put before the shown ones ("Load earlier lines", data-log-earlier) leave the
  // line the reader was at where it was.
  var logPlaces = {};

  function rememberLogs() {
    logPlaces = {};
    document.querySelectorAll("pre.log[id]").forEach(function (el) {
      var atEnd = el.scrollHeight - el.scrollTop - el.clientHeight < 24;
      logPlaces[el.id] = { atEnd: atEnd, top: el.scrollTop, height: el.scrollHeight };
    });
  }

  function placeLogs(root, prepended) {
    var logs = Array.prototype.slice.call(root.querySelectorAll("pre.log"));
    if (root.matches && root.matches("pre.log")) logs.push(root);
    logs.forEach(function (el) {
      var kept = el.id ? logPlaces[el.id] : null;
      if (kept && prepended) el.scrollTop = kept.top + el.scrollHeight - kept.height;
      else el.scrollTop = !kept || kept.atEnd ? el.scrollHeight : kept.top;
    });
  }

  function prepends(detail) {
    var elt = detail.requestConfig && detail.requestConfig.elt;
    return Boolean(elt && elt.hasAttribute && elt.hasAttribute("data-log-earlier"));
  }

  // ---- focus survives a swap -------------------------------------------------------------------------
  // htmx puts focus back on a swapped-in element with the same id; any other focused control that a
  // swap replaces (a tab link, a Filter button) leaves focus on <body>, and keyboard and screen-reader
  // users start again from the top. Land on its twin in the new content: in a list's row (data-run,
  // data-id) the element at the same place in the same row, as rows repeat links ("default" in each
  // one); else the same tag, text and link; else the new content's current item, its first heading,
  // or the new content itself.
  var focused = null;
  var ROW = "[data-run], [data-id]";

  function rowKey(row) {
    return row.hasAttribute("data-run") ? '[data-run="' + CSS.escape(row.dataset.run) + '"]' : '[data-id="' + CSS.escape(row.dataset.id) + '"]';
  }

  function twinInRow(root, lost) {
    var row = lost.closest(ROW);
    if (!row) return null;
    var twinRow = root.matches(rowKey(row)) ? root : root.querySelector(rowKey(row));
    if (!twinRow) return null;
    var place = Array.prototype.indexOf.call(row.querySelectorAll(lost.tagName), lost);
    return twinRow.querySelectorAll(lost.tagName)[place] || null;
  }

  function twinOf(root, lost) {
    var candidates = [root].concat(Array.prototype.slice.call(root.querySelectorAll(lost.tagName)));
    return twinInRow(root, lost) || candidates.filter(function (el) {
      return el.tagName === lost.tagName && el.textContent.trim() === lost.textContent.trim() && el.getAttribute("href") === lost.getAttribute("href");
    })[0] || root.querySelector('[aria-current="page"]') || root.querySelector("h1, h2, h3") || root;
  }

  // A poll whose answer is what it last swapped in leaves the page alone: no swap, so no focus to
  // move and no reader's place to lose. Only polls: a user's request swaps even an identical answer,
  // and any other swap in or around what a poll swapped in makes its next answer swap again.
  // Each answer's forms ({% csrf_token %}) carry a freshly masked copy of the same token, so answers
  // are compared without those values: else every answer differs, and a live run's status area was
  // swapped (STOP refocused, screen readers re-announcing it) every 2 s.
  // An answer's out-of-band parts (hx-swap-oob: a training run's step, tokens/s and ETA beside its
  // status area) are left out of the comparison and still swapped in: only the target is left alone.
  function pollAnswer(xhr) {
    var answer = document.createElement("template");
    answer.innerHTML = String(xhr.response);
    answer.content.querySelectorAll("[hx-swap-oob]").forEach(function (el) { el.remove(); });
    return answer.innerHTML.replace(/(name="csrfmiddlewaretoken" value=")[^"]*"/g, '$1"');
  }

  function skipUnchangedPoll(evt) {
    var target = evt.detail.target;
    if (!(evt.detail.shouldSwap && isPoll(evt.detail) && target && target.studioPolled === pollAnswer(evt.detail.xhr))) return;
    if (/hx-swap-oob/.test(evt.detail.xhr.response)) evt.detail.swapOverride = "none";
    else evt.detail.shouldSwap = false;
  }

  function notePolled(evt) {
    if (isPoll(evt.detail)) { evt.target.studioPolled = pollAnswer(evt.detail.xhr); return; }
    for (var el = evt.target; el; el = el.parentElement) delete el.studioPolled;
  }

  function restoreFocus(root) {
    var lost = focused;
    focused = null;
    if (!lost || document.body.contains(lost) || (document.activeElement && document.activeElement !== document.body)) return;
    var next = twinOf(root, lost);
    if (next.tabIndex < 0 && !next.hasAttribute("tabindex")) next.setAttribute("tabindex", "-1");
    next.focus({ preventScroll: true });
  }

  // ---- open disclosures stay open -------------------------------------------------------------------
  // A chart's "Show data" (<details id>) is in the Overview's live part, which a live run's page
  // replaces every 5 s: the reader's open table would close under them. Its twin in the new content opens.
  var openDetails = [];

  function rememberOpenDetails() {
    openDetails = Array.prototype.map.call(document.querySelectorAll("details[id][open]"), function (el) { return el.id; });
  }

  function reopenDetails() {
    openDetails.forEach(function (id) {
      var el = document.getElementById(id);
      if (el && el.tagName === "DETAILS") el.open = true;
    });
  }

  document.addEventListener("htmx:beforeSwap", function (evt) {
    skipUnchangedPoll(evt);
    if (!evt.detail.shouldSwap) return;
    rememberLogs();
    rememberOpenDetails();
    focused = document.activeElement !== document.body ? document.activeElement : null;
  });
  document.addEventListener("htmx:afterSwap", function (evt) {
    notePolled(evt);
    reopenDetails();
    placeLogs(evt.target, prepends(evt.detail));
    restoreFocus(evt.target);
  });

  // ---- what was typed after a request went out stays ----------------------------------------------
  // An out-of-band part with data-sent-values (field name → the value its request sent, as JSON) was
  // drawn from those values: NEW RUN's GRPO numbers, which the fit estimate's answer brings with the
  // rollout length fitted to the model. When a field of the part no longer holds what was sent, the
  // user typed in it while the request was out; the answer would put the old value back, so the part
  // is not swapped in. Their edit is a change of the form, which asks again with what they left.
  function changedSince(target, sent) {
    return Object.keys(sent).some(function (name) {
      var field = target.querySelector('[name="' + CSS.escape(name) + '"]');
      return field !== null && field.value !== sent[name];
    });
  }

  document.addEventListener("htmx:oobBeforeSwap", function (evt) {
    var fragment = evt.detail.fragment;
    var part = fragment.nodeType === Node.DOCUMENT_FRAGMENT_NODE ? fragment.firstElementChild : fragment;
    if (!part || !part.hasAttribute("data-sent-values")) return;
    var sent;
    try { sent = JSON.parse(part.getAttribute("data-sent-values")); } catch (e) { return; }
    if (changedSince(evt.detail.target, sent)) evt.detail.shouldSwap = false;
  });

  // ---- banners of the last page load ---------------------------------------------------------------
  // "Run x is queued. Press START when it is ready." describes the run as it was when the page loaded:
  // once the server says the run changed (HX-Trigger: run-changed), it no longer applies.
  document.addEventListener("run-changed", function () {
    document.querySelectorAll("#main > .messages").forEach(function (el) { el.remove(); });
    runChanged = true;
  });

  // ---- run status changes are said ------------------------------------------------------------------
  // The status area is swapped whole, so nothing in it is announced: once the server says the run
  // changed, the persistent live region of base.html (#announcer) says the status it now has (once
  // per new status: an edit or a refused action changes the run but not its status).
  var runChanged = false;
  var saidStatus = null;

  document.addEventListener("htmx:afterSettle", function () {
    var area = document.getElementById("run-status");
    var announcer = document.getElementById("announcer");
    if (!runChanged || !area || !announcer) return;
    runChanged = false;
    if (area.dataset.status === saidStatus) return;
    saidStatus = area.dataset.status;
    announcer.textContent = "Run " + area.dataset.runName + " is now " + saidStatus + ".";
  });

  // ---- durations that tick ----------------------------------------------------------------------------
  // A live run's Duration comes as its start (<time data-ticks-from datetime>), not as the time so far:
  // a poll's answer then stays the same while only time passes, and is not swapped in (see
  // skipUnchangedPoll). The browser counts it up each second, written as studio_ui.duration writes it,
  // on the server's clock: the page says when it was rendered (meta studio-rendered-at, in seconds).
  var clockSkew = 0;

  function durationText(seconds) {
    var s = Math.max(0, Math.floor(seconds));
    var hours = Math.floor(s / 3600), minutes = Math.floor(s % 3600 / 60), secs = s % 60;
    var pad = function (n) { return (n < 10 ? "0" : "") + n; };
    if (hours) return hours + "h " + pad(minutes) + "m";
    return minutes ? minutes + "m " + pad(secs) + "s" : secs + "s";
  }

  function tickDurations() {
    document.querySelectorAll("time[data-ticks-from]").forEach(function (el) {
      var since = Date.parse(el.getAttribute("datetime"));
      if (!isNaN(since)) el.textContent = durationText((Date.now() + clockSkew - since) / 1000);
    });
  }

  document.addEventListener("htmx:afterSwap", tickDurations);

  // ---- buttons that say why they do nothing ---------------------------------------------------------
  // A blocked START is aria-disabled, not disabled, so Tab still reaches it and a screen reader reads
  // it with what blocks it (aria-describedby); pressed, it does nothing (the server refuses it anyway).
  document.addEventListener("click", function (evt) {
    var button = evt.target.closest && evt.target.closest('button[aria-disabled="true"]');
    if (button) evt.preventDefault();
  }, true);

  // ---- pickers whose fields the server drew ---------------------------------------------------------
  // A picker (NEW RUN's Method, GRPO's RL mode) has its fields drawn by the server for one value
  // (data-drawn-in names them, their data-drawn-for says which). Back to the page, the browser puts
  // back the value picked last (form state restoration) on fields drawn for the page's first one: GRPO
  // said over SFT's fields, and Create run sent a GRPO run with SFT's settings. The picker's own
  // change request draws the fields for what it says; the outer picker first, as its answer brings
  // the inner ones.
  function redrawPickers() {
    var pickers = document.querySelectorAll("select[data-drawn-in]");
    for (var i = 0; i < pickers.length; i++) {
      var drawn = document.querySelector(pickers[i].dataset.drawnIn);
      if (drawn && typeof htmx !== "undefined" && drawn.dataset.drawnFor !== pickers[i].value) {
        htmx.trigger(pickers[i], "change");
        return;
      }
    }
  }
  // pageshow: after a page load's form state restoration, and when the page comes back from the back/forward cache.
  window.addEventListener("pageshow", redrawPickers);

  // ---- file inputs that take at most so many files ----------------------------------------------------
  // The server refuses a form of more than DATA_UPLOAD_MAX_NUMBER_FILES files before any view reads
  // it: say so beside the field before the files are sent, not after the whole upload.
  document.addEventListener("change", function (evt) {
    var input = evt.target;
    if (!input.matches || !input.matches("input[type=file][data-max-files]")) return;
    var max = parseInt(input.dataset.maxFiles, 10);
    input.setCustomValidity(input.files.length > max
      ? "Choose at most " + max + " files (these are " + input.files.length + "): commit the rest in another upload."
      : "");
  });

  document.addEventListener("DOMContentLoaded", function () {
    var rendered = document.querySelector('meta[name="studio-rendered-at"]');
    if (rendered) clockSkew = parseInt(rendered.content, 10) * 1000 - Date.now();
    tickDurations();
    setInterval(tickDurations, 1000);
    placeLogs(document);
    var area = document.getElementById("run-status");
    if (area) saidStatus = area.dataset.status;
    // A form sent back with errors: focus its error summary, which says what to fix, or where there
    // is none (the findings are all beside their fields), the first field marked invalid.
    var summary = document.querySelector("[data-error-summary]") || document.querySelector('#main form [aria-invalid="true"]');
    if (summary) summary.focus();
  });
})();
