// nestegg ui: live updates (server-sent events), expanding long values, step details,
// the fork editor and the write buttons. Plain JavaScript, no build step.
(function () {
  "use strict";
  var TOKEN_KEY = "nestegg-token";
  var TOKEN_HEADER = "X-Nestegg-Token";

  function notice(text, bad) {
    var el = document.getElementById("notice");
    if (!el) return;
    el.textContent = text;
    el.className = bad ? "bad" : "good";
  }

  // The write token: taken from ?token= once (then dropped from the address), else asked.
  function keepToken() {
    var params = new URLSearchParams(location.search);
    if (params.has("token")) {
      localStorage.setItem(TOKEN_KEY, params.get("token"));
      params.delete("token");
      var rest = params.toString();
      history.replaceState(null, "", location.pathname + (rest ? "?" + rest : ""));
    }
  }

  function token() {
    var value = localStorage.getItem(TOKEN_KEY);
    if (!value) {
      value = window.prompt("The write token nestegg ui printed at start-up:") || "";
      if (value) localStorage.setItem(TOKEN_KEY, value);
    }
    return value;
  }

  function write(method, url, body) {
    var headers = { "Content-Type": "application/json" };
    headers[TOKEN_HEADER] = token();
    return fetch(url, {
      method: method, headers: headers, credentials: "same-origin",
      body: body === undefined || typeof body === "string" ? body : JSON.stringify(body)
    }).then(function (response) {
      return response.json().then(function (data) {
        if (!response.ok) {
          if (response.status === 403) localStorage.removeItem(TOKEN_KEY);
          throw new Error(data.error || response.statusText);
        }
        return data;
      });
    });
  }

  function expandValues(root) {
    root.addEventListener("click", function (event) {
      var button = event.target.closest("button.expand");
      if (!button) return;
      var holder = button.closest("[data-full]");
      var code = document.createElement("code");
      code.textContent = holder.getAttribute("data-full");
      holder.replaceChildren(code);
    });
  }

  function stepDetails(root) {
    root.addEventListener("click", function (event) {
      var button = event.target.closest("button.calls");
      if (!button) return;
      var row = button.closest("tr");
      var next = row.nextElementSibling;
      if (next && next.classList.contains("detail")) { next.remove(); return; }
      fetch(button.getAttribute("data-url")).then(function (r) { return r.text(); })
        .then(function (html) {
          var detail = document.createElement("tr");
          detail.className = "detail";
          var cell = document.createElement("td");
          cell.colSpan = 7;
          cell.innerHTML = html;  // rendered and escaped by the server
          detail.appendChild(cell);
          row.after(detail);
        });
    });
  }

  // The run page follows its run: its stream (which ends once the run neither runs nor
  // waits) says when the summary and the timeline changed, and when a waiting run's wait is
  // over (a signal sent from elsewhere). follow() opens it again after a resume or a cancel.
  var follow = function () { return false; };

  function liveRun(page) {
    if (page.getAttribute("data-live") !== "yes" || !window.EventSource) return;
    var runId = page.getAttribute("data-run");  // quoted for an address already
    var base = "/runs/" + runId;
    var source = null;
    var busy = false, again = false;
    function refresh() {
      if (busy) { again = true; return; }
      busy = true;
      var high = page.getAttribute("data-high");
      fetch(base + "/live?after=" + high).then(function (r) { return r.json(); })
        .then(function (data) {
          document.getElementById("summary").innerHTML = data.summary;
          var body = document.getElementById("steps");
          var last = body.lastElementChild;  // trailing incidents and the step under way come again
          while (last && (last.matches("tr.incident, tr.pending") ||
                          last.matches("tr.pending + tr.detail"))) {
            var previous = last.previousElementSibling;
            last.remove();
            last = previous;
          }
          body.insertAdjacentHTML("beforeend", data.rows);
          data.bars.forEach(function (pair) {  // widths relative to the longest step shown
            var bar = body.querySelector('tr[data-seq="' + pair[0] + '"] .bar');
            if (bar) bar.style.width = pair[1] + "%";
          });
          document.getElementById("range").textContent = data.range;
          page.setAttribute("data-high", data.high);
        })
        .finally(function () { busy = false; if (again) { again = false; refresh(); } });
    }
    follow = function () {
      if (source) return true;  // still open: it sees what the resume does
      var since = page.getAttribute("data-since");
      var wait = page.getAttribute("data-wait");
      source = new EventSource("/events/runs/" + runId + "?since=" + since +
                               "&wait=" + wait);
      source.addEventListener("change", function (event) {
        var data = JSON.parse(event.data);
        page.setAttribute("data-since", data.seq);
        if (data.wait) page.setAttribute("data-wait", data.wait);
        refresh();
      });
      source.addEventListener("end", function () { source.close(); source = null; refresh(); });
      return true;
    };
    follow();
  }

  function liveRuns(table) {
    if (table.getAttribute("data-paged") === "yes" || !window.EventSource) return;
    var source = new EventSource(table.getAttribute("data-live"));
    source.addEventListener("change", function () {
      var params = new URLSearchParams(location.search);
      params.set("fragment", "rows");
      fetch("/?" + params.toString()).then(function (r) { return r.text(); })
        .then(function (html) { document.getElementById("runs-body").innerHTML = html; });
    });
  }

  function actionButtons(root) {
    root.addEventListener("click", function (event) {
      var button = event.target.closest("button.act");
      if (!button) return;
      var question = button.getAttribute("data-confirm");
      if (question && !window.confirm(question)) return;
      write(button.getAttribute("data-method"), button.getAttribute("data-url"))
        .then(function (data) {
          var then = button.getAttribute("data-then");
          if (then) location.href = then;
          else if (button.hasAttribute("data-follow")) {
            notice(data.message || "resumed");  // a cancel says what it did
            if (!follow()) location.reload();  // a window of earlier steps: not live
          }
          else notice("done");
        })
        .catch(function (error) { notice("refused: " + error.message, true); });
    });
  }

  function forkEditor() {
    var area = document.getElementById("fork-data");
    if (!area) return;
    var button = document.getElementById("fork");
    var problem = document.getElementById("fork-error");
    function check() {
      try { JSON.parse(area.value); problem.textContent = ""; button.disabled = false; return true; }
      catch (error) { problem.textContent = "not valid JSON: " + error.message; button.disabled = true; return false; }
    }
    area.addEventListener("input", check);
    check();
    button.addEventListener("click", function () {
      if (!check()) return;
      // the text as it is: JSON.parse would round an int past 2**53
      write("POST", button.getAttribute("data-url"), '{"data": ' + area.value + "}")
        .then(function (data) { location.href = "/runs/" + encodeURIComponent(data.run_id); })
        .catch(function (error) { problem.textContent = "refused: " + error.message; });
    });
  }

  function pruneForm() {
    var form = document.getElementById("prune-form");
    if (!form) return;
    form.addEventListener("submit", function (event) {
      event.preventDefault();
      var body = { dry_run: form.dry_run.checked };
      if (form.keep.value) body.keep = parseInt(form.keep.value, 10);
      if (form.older_than.value) body.older_than = form.older_than.value;
      if (form.status.value) body.status = form.status.value;
      if (form.pipeline.value) body.pipeline = form.pipeline.value;
      write("POST", "/api/prune", body)
        .then(function (data) { document.getElementById("prune-result").textContent = JSON.stringify(data, null, 2); })
        .catch(function (error) { notice("refused: " + error.message, true); });
    });
  }

  document.addEventListener("DOMContentLoaded", function () {
    keepToken();
    expandValues(document.body);
    stepDetails(document.body);
    actionButtons(document.body);
    forkEditor();
    pruneForm();
    var page = document.getElementById("run");
    if (page) liveRun(page);
    var table = document.getElementById("runs");
    if (table) liveRuns(table);
  });
})();
