"use strict";
// Polls /status and fills in the model and camera panels.
async function refresh() {
  const health = document.getElementById("health");
  try {
    const r = await fetch("/status");
    if (!r.ok) throw new Error(`HTTP ${r.status}`);
    const s = await r.json();
    const m = s.model;
    health.textContent = "running"; health.className = "pill ok";
    const line = document.getElementById("model-line");
    line.textContent = `${m.name}: input ${m.input.join("×")}, ${m.classes.length} classes, on ${m.providers.join(", ")}`;
    line.className = m.device === "cpu" ? "warn" : "";
    const body = document.querySelector("#exits tbody");
    body.replaceChildren(...m.exits.map((e) => {
      const tr = document.createElement("tr");
      for (const v of [e.name, `${(100 * e.backbone_fraction).toFixed(0)} %`, `${(100 * e.test_accuracy).toFixed(1)} %`,
                       e.cost_median_ms.toFixed(2), e.cost_p95_ms.toFixed(2), e.runs]) {
        const td = document.createElement("td"); td.textContent = v; tr.append(td);
      }
      return tr;
    }));
    const cams = document.getElementById("cameras");
    cams.replaceChildren(...(s.cameras.length ? s.cameras : [{ name: "none configured", transport: "" }]).map((c) => {
      const li = document.createElement("li"); li.textContent = `${c.name} ${c.transport}`; return li;
    }));
  } catch (err) {
    health.textContent = `unreachable (${err.message})`; health.className = "pill bad";
  }
}
refresh();
setInterval(refresh, 2000);
