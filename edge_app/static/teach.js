// "Teach it your scene": classes of frames captured from the source on show (training recordings and check
// recordings, captured apart), recordings labelled in spans, the camera's region, training with progress, and
// before deploy what the check says: accuracy per exit and of the policy as served, the confusion, the frames it
// got wrong (one click adds them to training) and the operating points; deploy and roll back. Everything goes
// through the documented HTTP API (/api/..., docs/teach.md); window.edge.teach holds the panel's state for the
// end-to-end tests.
import { initRegion } from "./region.js";

const $ = (id) => document.getElementById(id);
const pct = (a) => (a === null || a === undefined ? "–" : `${(100 * a).toFixed(1)} %`);

export function initTeach(api, edge) {
  const t = edge.teach = { dataset: null, recording: null, job: null, models: null, error: null, deployed: null,
    report: null, added: 0, spans: 0, span: null };
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
    if ((await edge.roleKnown) === "viewer") return;  // teaching is the operator's (403 for a viewer)
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
      count.textContent = ` ${c.frames} frames (train ${c.split.train} · calibration ${c.split.calibration} · test ${c.split.test} · check ${c.split.check}) `;
      const snap = button("snap", () => capture(c.name, 0));
      snap.dataset.cls = c.name; snap.className = "teach-snap";
      const rec = button("record", () => capture(c.name, Number($("teach-seconds").value)));
      rec.dataset.cls = c.name; rec.className = "teach-record";
      const check = button("record check", () => capture(c.name, Number($("teach-seconds").value), "check"));
      check.dataset.cls = c.name; check.className = "teach-check";
      check.title = "a check recording: captured apart (other light, another time of day), never trained on; training reports its accuracy on it";
      const del = button("delete class", async () => { if (confirm(`Delete class ${c.name} and its ${c.frames} frames?`)) { await call(`/api/datasets/${encodeURIComponent(ds())}/classes/${encodeURIComponent(c.name)}`, "DELETE"); refresh(); } });
      const thumbs = document.createElement("div");
      thumbs.className = "thumbs";
      for (const [id, kind] of [...c.recent.slice(-8).map((i) => [i, "train"]), ...c.check_recent.slice(-4).map((i) => [i, "check"])]) {
        const img = thumb(id, kind === "check" ? `${id} (check frame; click to add it to training)` : `${id} (click to delete)`);
        if (kind === "check") { img.className = "check"; img.onclick = () => addToTraining([id]); }
        else img.onclick = async () => { await call(`/api/datasets/${encodeURIComponent(ds())}/frames/${id}`, "DELETE"); refresh(); };
        thumbs.append(img);
      }
      row.append(name, count, snap, rec, check, del, thumbs);
      return row;
    });
    $("teach-classes").replaceChildren(...rows);
    const chk = t.dataset.check;
    $("teach-check-warning").textContent = !t.dataset.classes.length ? "" : chk.frames === 0
      ? "No check recording yet: the held-out figure after training comes from the same recordings as training and may be optimistic. Record a check of each state in the conditions you expect (lights on and off, day and night)."
      : chk.classes_without.length ? `The check has no frames of ${chk.classes_without.join(", ")}: record a check of each state.` : "";
    drawRecordings();
  }

  function thumb(id, title) {
    const img = document.createElement("img");
    img.src = `/api/datasets/${encodeURIComponent(ds())}/frames/${id}.jpg`;
    img.title = title; img.loading = "lazy";
    return img;
  }

  // Recordings, labelled in spans: click the first and the last frame of a span, pick its class, "label span".
  function drawRecordings() {
    const classes = t.dataset.classes.map((c) => c.name);
    const rows = t.dataset.recordings.slice(-6).map((rec) => {
      const row = document.createElement("div");
      row.className = "teach-recording"; row.dataset.recording = rec.id;
      const when = new Date(rec.start_unix * 1000).toLocaleTimeString();
      const head = document.createElement("div");
      head.textContent = `${when} · ${rec.frames.length} frames · ${rec.role === "check" ? "check · " : ""}${rec.classes.join(" + ")} `;
      const strip = document.createElement("div");
      strip.className = "thumbs strip";
      const step = Math.max(1, Math.ceil(rec.frames.length / 16));
      const shown = rec.frames.filter((_, i) => i % step === 0 || i === rec.frames.length - 1);
      const span = t.span && t.span.recording === rec.id ? t.span : null;
      for (const f of shown) {
        const img = thumb(f.id, `${new Date(f.t * 1000).toLocaleTimeString()} · ${f.class} (click: span start, then end)`);
        if (span && f.t >= span.from && f.t <= (span.to ?? span.from)) img.className = "picked";
        img.onclick = () => {
          t.span = !span || span.to !== null ? { recording: rec.id, from: f.t, to: null } : { ...span, from: Math.min(span.from, f.t), to: Math.max(span.from, f.t) };
          drawRecordings();
        };
        strip.append(img);
      }
      const pick = document.createElement("select");
      pick.className = "teach-span-class";
      for (const c of classes) pick.append(new Option(c, c));
      const label = button("label span", async () => {
        if (!span) { show("click the first and the last frame of the span first", true); return; }
        try {
          const out = await call(`/api/datasets/${encodeURIComponent(ds())}/relabel`, "POST",
            { recording: rec.id, from_unix: span.from, to_unix: span.to ?? span.from, class: pick.value });
          t.spans += 1; t.span = null;
          show(`${out.changed} frame(s) of that recording are now ${pick.value}`);
        } catch (err) { show(String(err.message || err), true); }
        refresh();
      });
      label.className = "teach-span";
      head.append(pick, label);
      row.append(head, strip);
      return row;
    });
    $("teach-recordings").replaceChildren(...rows);
  }

  function button(text, onclick) { const b = document.createElement("button"); b.textContent = text; b.onclick = onclick; return b; }

  async function capture(cls, seconds, role = "auto") {
    const src = source();
    if (!src) { show("connect first (your camera), or pick a camera and connect", true); return; }
    try {
      let rec = await call(`/api/datasets/${encodeURIComponent(ds())}/classes/${encodeURIComponent(cls)}/capture`, "POST",
        { source: src, seconds, fps: Number($("teach-fps").value), role });
      t.recording = rec;
      while (rec.state === "recording") {
        show(`recording ${role === "check" ? "a check of " : ""}${cls}: ${rec.saved} frames, ${rec.elapsed_s.toFixed(0)} of ${rec.seconds} s`);
        await new Promise((r) => setTimeout(r, 500));
        rec = t.recording = await call(`/api/recordings/${rec.id}`);
      }
      if (rec.state === "failed") show(`capture failed: ${rec.error}`, true); else show(`${cls}: ${rec.saved} frame(s) added`);
    } catch (err) { show(String(err.message || err), true); }
    refresh();
  }

  async function train() {
    try {
      let job = t.job = await call("/api/training", "POST", { dataset: ds(), from: $("teach-from").value, input_size: Number($("teach-size").value),
        ...($("teach-width").value ? { width: Number($("teach-width").value) } : {}) });
      $("teach-cancel").disabled = false;
      while (job.state === "running") {
        const e = job.epoch;
        const acc = (xs) => xs.map((a) => (100 * a).toFixed(0) + " %").join(" / ");
        show(e ? `training from ${job.base}: epoch ${e.epoch}/${e.epochs} (${job.elapsed_s.toFixed(0)} s, about ${e.eta_s.toFixed(0)} s left at most), loss ${e.loss}, ` +
          (e.check_accuracy ? `check accuracy per exit ${acc(e.check_accuracy)}` : `calibration (jittered) accuracy per exit ${acc(e.calibration_accuracy)}`) +
          `, best epoch ${e.best_epoch}` : `training from ${job.base}: ${job.stage}`);
        await new Promise((r) => setTimeout(r, 1000));
        job = t.job = await call(`/api/training/${job.id}`);
      }
      $("teach-cancel").disabled = true;
      if (job.state !== "succeeded") { show(`training ${job.state}${job.error ? ": " + job.error : ""}`, true); return; }
      const r = job.result;
      show(`trained ${r.model.split("/").pop()} in ${r.seconds} s on ${r.frames.train} frames (${r.epochs_run} epochs, kept epoch ${r.best_epoch}). ` +
        (r.check ? `On the check: ${pct(r.check.accuracy)} right as served.` : "No check recording: the held-out figure may be optimistic.") + " See below, then deploy.");
      drawReport(r.model.split("/").pop(), r);
    } catch (err) { show(String(err.message || err), true); }
    refresh();
  }

  // The policy as served on the recordings played in time order (exit 0 answers while the picture holds): what
  // the held-out blocks and the check recording say, every frame counted against the label of its moment.
  function servedLine(served) {
    const parts = [["clips-test", "held-out blocks"], ["clips-check", "check recording"]]
      .filter(([k]) => served[k]).map(([k, what]) => {
        const s = served[k];
        const p95 = s.notice_frames_p95 === null ? "" : `, a change noticed within ${s.notice_frames_p95} frame(s) at p95`;
        return `${what}: ${pct(s.accuracy)} right as served, ${pct(s.exit0_share)} of ${s.frames} frames answered at exit 0 (the picture unchanged), ${pct(s.cost_fraction)} of full depth's compute${p95} (${s.changes_noticed} of ${s.changes} changes noticed)`;
      });
    if (!parts.length) return null;
    const p = document.createElement("p");
    p.id = "teach-served";
    p.textContent = `In time order, as a camera shows the scene: ${parts.join("; ")}.`;
    return p;
  }

  // What training found, before deploy: held-out (same recordings) and check accuracy per exit, the policy as
  // served on the check (accuracy, exits, cost), its confusion, the frames it got wrong, the operating points.
  function drawReport(name, r) {
    t.report = { name, ...r };
    const el = $("teach-report");
    el.replaceChildren();
    const h = document.createElement("h3");
    h.textContent = `${name}: what to expect`;
    const table = document.createElement("table");
    const row = (cells, tag = "td") => { const tr = document.createElement("tr"); for (const c of cells) { const td = document.createElement(tag); td.textContent = c; tr.append(td); } return tr; };
    table.append(row(["", ...r.test_accuracy.map((_, k) => `exit ${k + 1}`), "as served"], "th"));
    table.append(row(["held-out blocks (same recordings as training)", ...r.test_accuracy.map(pct), ""]));
    if (r.check) table.append(row([`check recording (${r.check.frames} frames, never trained on)`, ...r.check.per_exit_accuracy.map(pct), pct(r.check.accuracy)]));
    table.append(row(["cost on this CPU", ...r.costs_ms.map((c) => `${c.toFixed(2)} ms`), r.check ? `${r.check.mean_cost_ms.toFixed(2)} ms` : ""]));
    table.className = "report";
    const p = r.policy;
    const policy = document.createElement("p");
    policy.textContent = `Policy: the dynamic index fitted on jittered calibration frames, floor at exit ${p.min_exit} (from the ${p.floor_from}: the shallowest exit within a point of full depth)` +
      (r.check ? `; on the check it stopped at exits ${r.check.exits_used.map((n, k) => `${k + 1}: ${n}`).join(", ")}.` : ".") +
      (r.check ? "" : " Without a check recording these figures come from the same recordings as training and may be optimistic.");
    el.append(h, table, policy);
    const video = servedLine(r.served || {});
    if (video) el.append(video);
    if (r.check) {
      const conf = document.createElement("table");
      conf.className = "report confusion";
      conf.append(row(["true \\ answer", ...r.classes], "th"));
      r.check.confusion.forEach((line, i) => conf.append(row([r.classes[i], ...line.map(String)])));
      el.append(conf);
      if (r.check.wrong_count) {
        const wrong = document.createElement("div");
        wrong.className = "thumbs wrong";
        const ids = r.check.wrong.map((w) => w.id);
        for (const w of r.check.wrong) {
          const img = thumb(w.id, `${w.class}, answered ${w.answer} at exit ${w.exit} (per exit: ${w.per_exit.join(", ")}); click: add to training`);
          img.onclick = () => addToTraining([w.id]);
          wrong.append(img);
        }
        const add = button(`add the ${ids.length} wrong frame(s) to training`, () => addToTraining(ids));
        add.id = "teach-add-wrong";
        const note = document.createElement("p");
        note.textContent = `${r.check.wrong_count} check frame(s) answered wrong (their true class, then the answer, in each tooltip). Added frames leave the check and train; record a new check afterwards to measure again.`;
        el.append(note, wrong, add);
      }
    }
    const points = r.operating_points.points;
    const op = document.createElement("table");
    op.className = "report";
    op.append(row(["operating point", `accuracy (${r.operating_points.on})`, "cost per frame"], "th"));
    for (const pt of points) op.append(row([pt.kind === "dynamic-index" ? `dynamic index, λ ${pt.lam}` : pt.kind, pct(pt.accuracy), `${pt.cost_ms.toFixed(2)} ms (${(100 * pt.cost_fraction).toFixed(0)} % of full depth)`]));
    el.append(op);
  }

  // A shadow run: the candidate answers the live source next to the model in use; disagreements shown as frames,
  // each one click away from a class of the dataset (as a training frame).
  async function shadowRun(name) {
    const src = source();
    if (!src) { show("connect to the source first", true); return; }
    try {
      let run = t.shadow = await call(`/api/models/${encodeURIComponent(name)}/shadow`, "POST", { source: src, seconds: 20 });
      while (run.state === "running") {
        show(`shadow run of ${name}: ${run.compared} frames compared, ${run.agreed} agreed (${run.elapsed_s.toFixed(0)} of ${run.seconds} s)`);
        await new Promise((r) => setTimeout(r, 1000));
        run = t.shadow = await call(`/api/shadow/${run.id}`);
      }
      drawShadow(run);
    } catch (err) { show(String(err.message || err), true); }
  }

  function drawShadow(run) {
    const el = $("teach-report");
    el.replaceChildren();
    const h = document.createElement("h3");
    h.textContent = `shadow run of ${run.model} on ${run.source}: ${run.compared} frames, agreement ${pct(run.agreement)}`;
    const pairs = document.createElement("p");
    pairs.textContent = run.pairs.map((p) => `in use ${p.in_use} / candidate ${p.candidate}: ${p.frames}`).join(" · ") || "no frame compared (is the source streaming?)";
    el.append(h, pairs);
    if (run.state === "failed") { show(`shadow run failed: ${run.error}`, true); return; }
    if (!run.disagreements.length) { show(`shadow run of ${run.model}: no disagreement in ${run.compared} frames`); return; }
    const pick = document.createElement("select");
    for (const c of t.dataset.classes) pick.append(new Option(c.name, c.name));
    const note = document.createElement("p");
    note.append("Where they disagree (the candidate's answer first); click a frame to add it to training as ", pick, ":");
    const thumbs = document.createElement("div");
    thumbs.className = "thumbs wrong";
    for (const d of run.disagreements) {
      const img = document.createElement("img");
      img.src = `/api/shadow/${run.id}/frames/${d.k}.jpg`;
      img.title = `candidate ${d.candidate} (exit ${d.exit}), in use ${d.in_use}; click: add to training as the class chosen`;
      img.onclick = async () => {
        try { await call(`/api/shadow/${run.id}/frames/${d.k}/keep`, "POST", { dataset: ds(), class: pick.value }); img.className = "picked"; show(`added to ${pick.value}`); }
        catch (err) { show(String(err.message || err), true); }
      };
      thumbs.append(img);
    }
    el.append(note, thumbs);
    show(`shadow run of ${run.model}: ${run.compared - run.agreed} of ${run.compared} frames answered otherwise than the model in use`);
  }

  async function addToTraining(ids) {
    try {
      const out = await call(`/api/datasets/${encodeURIComponent(ds())}/relabel`, "POST", { frames: ids, role: "train", balance: true });
      t.added += out.changed;
      show(`${out.changed} frame(s) moved from the check to training (the ${ids.length} picked, and as many check frames of each other class, captured nearest in time, so that no class is taught by its mistakes alone); train again: it starts from the last model taught`);
    } catch (err) { show(String(err.message || err), true); }
    refresh();
  }

  // Where each model answers: the box's default (every camera without a model of its own, and browsers), and
  // the cameras that have it as their own.
  function usedBy(m) {
    const cams = Object.entries(t.models.cameras || {}).filter(([, c]) => c.model === m.name).map(([name]) => name);
    const where = [...(m.in_use ? ["the box's default"] : []), ...cams.map((c) => `camera ${c}`)];
    return where.length ? ` (in use: ${where.join(", ")})` : "";
  }

  // Deploy and roll back act on the source picked above: a camera (that camera only), or the box's default.
  const target = () => ($("source").value ? { camera: $("source").value } : undefined);
  const targetWords = () => ($("source").value ? `on camera ${$("source").value}` : "as the box's default");

  function drawModels() {
    const cam = $("source").value;
    const served = cam && t.models.cameras && t.models.cameras[cam];
    $("teach-rollback").textContent = `roll back ${targetWords()}`;
    const items = t.models.models.map((m) => {
      const li = document.createElement("li");
      const check = m.report && m.report.check;
      const here = served ? served.model === m.name : m.in_use;
      li.textContent = m.error ? `${m.name}: ${m.error}` : `${m.name}${usedBy(m)}: ${m.classes.join(", ")} · ${m.input_size} px, width ${m.width} · held-out ` +
        m.test_accuracy.map((a, k) => `exit ${k + 1} ${(100 * a).toFixed(1)} % @ ${m.costs_ms[k].toFixed(2)} ms`).join(" · ") +
        (check ? ` · check ${pct(check.accuracy)} as served` : m.report ? " · no check recording" : "");
      if (m.report) {
        const b = button("details", () => drawReport(m.name, m.report));
        b.className = "teach-details"; b.dataset.model = m.name;
        li.append(" ", b);
      }
      if (!here && !m.error) {
        const sh = button("shadow 20 s", () => shadowRun(m.name));
        sh.className = "teach-shadow"; sh.dataset.model = m.name;
        sh.title = "answer the live source with this model next to the one in use for 20 s, and show where they disagree";
        li.append(" ", sh);
        const b = button(`deploy ${targetWords()}`, () => deploy(m.name));
        b.className = "teach-deploy"; b.dataset.model = m.name;
        li.append(" ", b);
      }
      return li;
    });
    $("teach-models").replaceChildren(...items);
    $("teach-rollback").disabled = served ? !served.history.length : t.models.history.length < 2;
  }

  async function deploy(name) {
    try { t.deployed = await call(`/api/models/${encodeURIComponent(name)}/deploy`, "POST", target()); show(`serving ${name} ${targetWords()}`); }
    catch (err) { show(String(err.message || err), true); }
    refresh();
  }

  const region = initRegion(api, edge, show);
  const cameraOf = () => $("source").value || null;
  $("source").addEventListener("change", () => { region.load(cameraOf()); if (t.models) drawModels(); });
  region.load(cameraOf());
  $("teach-dataset").onchange = refresh;
  $("teach-add-class").onclick = async () => {
    try { await call(`/api/datasets/${encodeURIComponent(ds())}/classes`, "POST", { name: $("teach-class").value.trim() }); $("teach-class").value = ""; }
    catch (err) { show(String(err.message || err), true); }
    refresh();
  };
  $("teach-train").onclick = train;
  $("teach-cancel").onclick = async () => { if (t.job) { try { await call(`/api/training/${t.job.id}`, "DELETE"); } catch (err) { show(String(err.message || err), true); } } };
  $("teach-rollback").onclick = async () => {
    try { t.deployed = await call("/api/models/rollback", "POST", target()); show(`rolled back ${targetWords()}: serving ${t.deployed.model}`); }
    catch (err) { show(String(err.message || err), true); }
    refresh();
  };
  refresh();
  return { refresh: () => { refresh(); if (edge.region.camera !== cameraOf()) region.load(cameraOf()); } };
}
