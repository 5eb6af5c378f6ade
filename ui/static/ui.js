// toolfleet ops page: live updates by server-sent events, with a pause control.
// The page is complete without this script; it only replaces the live region's HTML
// with what the server renders for each new snapshot.
(function () {
  "use strict";
  var live = document.getElementById("live");
  var pause = document.getElementById("pause");
  if (!live || !window.EventSource) { return; }
  var source = null;
  function start() {
    source = new EventSource(live.getAttribute("data-stream"));
    source.addEventListener("update", function (event) {
      live.innerHTML = event.data;
      document.body.setAttribute("data-updates",
        String(Number(document.body.getAttribute("data-updates") || "0") + 1));
    });
    pause.textContent = "Pause";
    pause.setAttribute("aria-pressed", "false");
    document.body.setAttribute("data-live", "on");
  }
  function stop() {
    if (source) { source.close(); source = null; }
    pause.textContent = "Resume";
    pause.setAttribute("aria-pressed", "true");
    document.body.setAttribute("data-live", "paused");
  }
  pause.hidden = false;
  pause.addEventListener("click", function () { if (source) { stop(); } else { start(); } });
  start();
})();
