// Events on the page: a timeline per camera (each event a block from its start to its end, coloured by label),
// the newest events as cards with their snapshots, filters (camera, label, time range), live as events happen
// (GET /api/events/live, read with fetch so the bearer token goes with it). Click one: its snapshot and details;
// an operator may delete it. window.edge.events holds the state (the end-to-end tests read it).

const $ = (id) => document.getElementById(id);
const CARDS = 24;

// the live stream's events (the detector's fields) in the API's shape
function fromLive(e) {
  return { id: e.id, camera: e.source, label: e.label, start: e.start_s, end: e.end_s,
    best_confidence: Math.round(e.best_confidence * 1000) / 1000, best_at: e.best_at_s, model: null, has_snapshot: true };
}

function hue(label) {
  let h = 0;
  for (const ch of label) h = (h * 31 + ch.charCodeAt(0)) % 360;
  return h;
}

const clock = (t) => new Date(t * 1000).toLocaleTimeString();
const span = (e) => (e.end === null ? "going on" : `${Math.max(0, e.end - e.start).toFixed(1)} s`);

export function initEvents(api, edge) {
  const ev = edge.events = { byId: new Map(), live: "off", changes: 0, selected: null, error: null };
  const snaps = new Map();  // id -> object URL of its snapshot (fetched with the token)

  function filters() {
    return { camera: $("ev-camera").value, label: $("ev-label").value, range: Number($("ev-range").value) };
  }

  async function load() {
    const f = filters(), q = new URLSearchParams({ limit: "500", after: String(Date.now() / 1000 - f.range) });
    if (f.camera) q.set("camera", f.camera);
    if (f.label) q.set("label", f.label);
    try {
      const r = await api(`/api/events?${q}`);
      if (r.status === 404) { $("ev-status").textContent = "events are off on this box ([events] enabled)"; return; }
      if (!r.ok) throw new Error(`HTTP ${r.status}`);
      ev.byId = new Map((await r.json()).events.map((e) => [e.id, e]));
      ev.error = null;
    } catch (err) {
      ev.error = `events: ${err.message}`;
    }
    render();
  }

  function shown() {
    const f = filters(), since = Date.now() / 1000 - f.range;
    return [...ev.byId.values()].filter((e) => (!f.camera || e.camera === f.camera) && (!f.label || e.label === f.label)
      && (e.end === null || e.end >= since)).sort((a, b) => b.start - a.start);
  }

  function fillSelect(sel, values) {
    const keep = sel.value;
    sel.replaceChildren(new Option("all", ""), ...[...values].sort().map((v) => new Option(v, v)));
    sel.value = [...sel.options].some((o) => o.value === keep) ? keep : "";
  }

  function render() {
    const events = shown(), now = Date.now() / 1000, range = filters().range, t0 = now - range;
    fillSelect($("ev-camera"), new Set([...ev.byId.values()].map((e) => e.camera)));
    fillSelect($("ev-label"), new Set([...ev.byId.values()].map((e) => e.label)));
    const byCamera = new Map();
    for (const e of events) byCamera.set(e.camera, [...(byCamera.get(e.camera) || []), e]);
    $("ev-timeline").replaceChildren(...[...byCamera.entries()].sort().map(([camera, list]) => {
      const row = document.createElement("div"), name = document.createElement("span"), strip = document.createElement("div");
      row.className = "ev-row"; name.textContent = camera; strip.className = "ev-strip";
      for (const e of list) {
        const b = document.createElement("div");
        const a = Math.max(e.start, t0), z = e.end === null ? now : e.end;
        b.className = "ev-block"; b.dataset.id = e.id;
        b.style.left = `${(100 * (a - t0)) / range}%`;
        b.style.width = `${Math.max(0.4, (100 * (z - a)) / range)}%`;
        b.style.background = `hsl(${hue(e.label)} 65% 45%)`;
        b.title = `${e.label} · ${clock(e.start)} · ${span(e)}`;
        b.onclick = () => select(e.id);
        strip.append(b);
      }
      row.append(name, strip);
      return row;
    }));
    $("ev-list").replaceChildren(...events.slice(0, CARDS).map(card));
    $("ev-status").textContent = ev.error || `${events.length} event(s) in view · live: ${ev.live}`;
    $("ev-status").className = ev.error ? "warn" : "";
    if (ev.selected && ev.byId.has(ev.selected)) details(ev.byId.get(ev.selected));
  }

  function card(e) {
    const fig = document.createElement("figure"), img = document.createElement("img"), cap = document.createElement("figcaption");
    fig.className = "ev-card" + (e.id === ev.selected ? " picked" : ""); fig.dataset.id = e.id;
    img.alt = e.label; img.style.borderColor = `hsl(${hue(e.label)} 65% 45%)`;
    snapshot(e).then((url) => { if (url) img.src = url; });
    cap.textContent = `${e.label} · ${e.camera} · ${clock(e.start)} · ${span(e)} · ${(100 * e.best_confidence).toFixed(0)} %`;
    fig.onclick = () => select(e.id);
    fig.append(img, cap);
    return fig;
  }

  async function snapshot(e, fresh = false) {
    if (!fresh && snaps.has(e.id)) return snaps.get(e.id);
    if (!e.has_snapshot) return null;
    const r = await api(`/api/events/${encodeURIComponent(e.id)}/snapshot.jpg`);
    if (!r.ok) return null;
    if (snaps.has(e.id)) URL.revokeObjectURL(snaps.get(e.id));
    const url = URL.createObjectURL(await r.blob());
    snaps.set(e.id, url);
    return url;
  }

  function select(id) {
    ev.selected = id;
    render();
  }

  function details(e) {
    $("ev-detail").hidden = false;
    snapshot(e).then((url) => { $("ev-snap").src = url || ""; $("ev-snap").hidden = !url; });
    const facts = [["label", e.label], ["camera", e.camera], ["started", new Date(e.start * 1000).toLocaleString()],
      ["lasted", span(e)], ["best confidence", `${(100 * e.best_confidence).toFixed(1)} % at ${clock(e.best_at)}`],
      ["model", e.model || "–"], ["id", e.id]];
    $("ev-facts").replaceChildren(...facts.flatMap(([k, v]) => {
      const dt = document.createElement("dt"), dd = document.createElement("dd");
      dt.textContent = k; dd.textContent = v;
      return [dt, dd];
    }));
  }

  async function remove() {
    const id = ev.selected;
    if (!id) return;
    const r = await api(`/api/events/${encodeURIComponent(id)}`, { method: "DELETE" });
    if (!r.ok) { ev.error = `delete: ${(await r.json()).error}`; render(); return; }
    ev.byId.delete(id); ev.selected = null; $("ev-detail").hidden = true;
    render();
  }

  // GET /api/events/live as Server-Sent Events, read with fetch; reconnects (and reloads the list) when cut off
  async function follow() {
    for (;;) {
      try {
        const r = await api("/api/events/live");
        if (!r.ok) throw new Error(`HTTP ${r.status}`);
        ev.live = "on"; render();
        const reader = r.body.pipeThrough(new TextDecoderStream()).getReader();
        let buf = "";
        for (;;) {
          const { value, done } = await reader.read();
          if (done) break;
          buf += value;
          let cut;
          while ((cut = buf.indexOf("\n\n")) >= 0) {
            const block = buf.slice(0, cut); buf = buf.slice(cut + 2);
            const data = block.split("\n").filter((l) => l.startsWith("data: ")).map((l) => l.slice(6)).join("\n");
            if (data) changed(JSON.parse(data));
          }
        }
      } catch (err) {
        ev.error = `live events: ${err.message}`;
      }
      ev.live = "reconnecting"; render();
      await new Promise((ok) => setTimeout(ok, 2000));
      await load();
    }
  }

  function changed(msg) {
    const e = fromLive(msg.after), had = ev.byId.get(e.id);
    ev.changes += 1;
    if (had) e.model = had.model;
    ev.byId.set(e.id, e);
    if (msg.type === "update") snapshot(e, true);
    render();
  }

  for (const id of ["ev-camera", "ev-label", "ev-range"]) $(id).onchange = load;
  $("ev-delete").onclick = remove;
  $("ev-close").onclick = () => { ev.selected = null; $("ev-detail").hidden = true; render(); };
  setInterval(render, 5000);  // events going on grow
  load().then(follow);
}
