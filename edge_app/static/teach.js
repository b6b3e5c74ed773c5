// "Teach it your scene": classes of frames captured from the source on show, training with progress, the
// held-out per-exit accuracy and cost, deploy and roll back. Everything goes through the documented HTTP API
// (/api/..., docs/teach.md); window.edge.teach holds the panel's state for the end-to-end test.

const $ = (id) => document.getElementById(id);

export function initTeach(api, edge) {
  const t = edge.teach = { dataset: null, recording: null, job: null, models: null, error: null, deployed: null };
  const ds = () => $("teach-dataset").value.trim() || "scene";
  const show = (msg, bad = false) => { $("teach-msg").textContent = msg; $("teach-msg").className = bad ? "warn" : ""; t.error = bad ? msg : null; };

  async function call(path, method = "GET", body = undefined) {
    const r = await api(path, { method, headers: body ? { "Content-Type": "application/json" } : {},
      body: body ? JSON.stringify(body) : undefined });
    const data = await r.json().catch(() => ({}));
    if (!r.ok) throw new Error(data.error || `HTTP ${r.status}`);
    return data;
  }

  // the source to capture from: the camera being watched, else this page's own session
  function source() {
    const cam = $("source").value;
    if (cam) return `camera:${cam}`;
    return edge.session ? `session:${edge.session}` : null;
  }

  async function refresh() {
    try {
      const names = (await call("/api/datasets")).datasets.map((d) => d.name);
      if (!names.includes(ds())) await call("/api/datasets", "POST", { name: ds() });
      t.dataset = await call(`/api/datasets/${encodeURIComponent(ds())}`);
      drawClasses();
      t.models = await call("/api/models");
      drawModels();
    } catch (err) { show(String(err.message || err), true); }
  }

  function drawClasses() {
    const rows = t.dataset.classes.map((c) => {
      const row = document.createElement("div");
      row.className = "teach-class";
      const name = document.createElement("b");
      name.textContent = `${c.name}`;
      const count = document.createElement("span");
      count.textContent = ` ${c.frames} frames (train ${c.split.train} · calibration ${c.split.calibration} · test ${c.split.test}) `;
      const snap = button("snap", () => capture(c.name, 0));
      snap.dataset.cls = c.name; snap.className = "teach-snap";
      const rec = button("record", () => capture(c.name, Number($("teach-seconds").value)));
      rec.dataset.cls = c.name; rec.className = "teach-record";
      const del = button("delete class", async () => { if (confirm(`Delete class ${c.name} and its ${c.frames} frames?`)) { await call(`/api/datasets/${encodeURIComponent(ds())}/classes/${encodeURIComponent(c.name)}`, "DELETE"); refresh(); } });
      const thumbs = document.createElement("div");
      thumbs.className = "thumbs";
      for (const id of c.recent.slice(-8)) {
        const img = document.createElement("img");
        img.src = `/api/datasets/${encodeURIComponent(ds())}/frames/${id}.jpg`;
        img.title = `${id} (click to delete)`;
        img.onclick = async () => { await call(`/api/datasets/${encodeURIComponent(ds())}/frames/${id}`, "DELETE"); refresh(); };
        thumbs.append(img);
      }
      row.append(name, count, snap, rec, del, thumbs);
      return row;
    });
    $("teach-classes").replaceChildren(...rows);
  }

  function button(text, onclick) { const b = document.createElement("button"); b.textContent = text; b.onclick = onclick; return b; }

  async function capture(cls, seconds) {
    const src = source();
    if (!src) { show("connect first (your camera), or pick a camera and connect", true); return; }
    try {
      let rec = await call(`/api/datasets/${encodeURIComponent(ds())}/classes/${encodeURIComponent(cls)}/capture`, "POST",
        { source: src, seconds, fps: Number($("teach-fps").value) });
      t.recording = rec;
      while (rec.state === "recording") {
        show(`recording ${cls}: ${rec.saved} frames, ${rec.elapsed_s.toFixed(0)} of ${rec.seconds} s`);
        await new Promise((r) => setTimeout(r, 500));
        rec = t.recording = await call(`/api/recordings/${rec.id}`);
      }
      if (rec.state === "failed") show(`capture failed: ${rec.error}`, true); else show(`${cls}: ${rec.saved} frame(s) added`);
    } catch (err) { show(String(err.message || err), true); }
    refresh();
  }

  async function train() {
    try {
      let job = t.job = await call("/api/training", "POST", { dataset: ds() });
      $("teach-cancel").disabled = false;
      while (job.state === "running") {
        const e = job.epoch;
        show(e ? `training: epoch ${e.epoch}/${e.epochs}, loss ${e.loss}, calibration accuracy per exit ${e.calibration_accuracy.map((a) => (100 * a).toFixed(0) + " %").join(" / ")}`
          : `training: ${job.stage}`);
        await new Promise((r) => setTimeout(r, 1000));
        job = t.job = await call(`/api/training/${job.id}`);
      }
      $("teach-cancel").disabled = true;
      if (job.state !== "succeeded") { show(`training ${job.state}${job.error ? ": " + job.error : ""}`, true); return; }
      const r = job.result;
      show(`trained ${r.model.split("/").pop()} in ${r.seconds} s on ${r.frames.train} frames; held-out test block: ` +
        r.test_accuracy.map((a, k) => `exit ${k + 1} ${(100 * a).toFixed(1)} % @ ${r.costs_ms[k].toFixed(2)} ms`).join(" · ") +
        ". Deploy it below.");
    } catch (err) { show(String(err.message || err), true); }
    refresh();
  }

  function drawModels() {
    const items = t.models.models.map((m) => {
      const li = document.createElement("li");
      li.textContent = m.error ? `${m.name}: ${m.error}` : `${m.name}${m.in_use ? " (in use)" : ""}: ${m.classes.join(", ")} · ` +
        m.test_accuracy.map((a, k) => `exit ${k + 1} ${(100 * a).toFixed(1)} % @ ${m.costs_ms[k].toFixed(2)} ms`).join(" · ");
      if (!m.in_use && !m.error) {
        const b = button("deploy", () => deploy(m.name));
        b.className = "teach-deploy"; b.dataset.model = m.name;
        li.append(" ", b);
      }
      return li;
    });
    $("teach-models").replaceChildren(...items);
    $("teach-rollback").disabled = t.models.history.length < 2;
  }

  async function deploy(name) {
    try { t.deployed = await call(`/api/models/${encodeURIComponent(name)}/deploy`, "POST"); show(`serving ${name}`); }
    catch (err) { show(String(err.message || err), true); }
    refresh();
  }

  $("teach-dataset").onchange = refresh;
  $("teach-add-class").onclick = async () => {
    try { await call(`/api/datasets/${encodeURIComponent(ds())}/classes`, "POST", { name: $("teach-class").value.trim() }); $("teach-class").value = ""; }
    catch (err) { show(String(err.message || err), true); }
    refresh();
  };
  $("teach-train").onclick = train;
  $("teach-cancel").onclick = async () => { if (t.job) { try { await call(`/api/training/${t.job.id}`, "DELETE"); } catch (err) { show(String(err.message || err), true); } } };
  $("teach-rollback").onclick = async () => {
    try { t.deployed = await call("/api/models/rollback", "POST"); show(`rolled back: serving ${t.deployed.model}`); }
    catch (err) { show(String(err.message || err), true); }
    refresh();
  };
  refresh();
  return { refresh };
}
