// A camera's region of interest, drawn over the video and dragged with the mouse (move it by its body, resize it by
// its corner). Saved through PUT /api/cameras/NAME/region when the drag ends; the config file stays the source
// of truth at start, so the page shows the line to put under that camera's [[cameras]].

const $ = (id) => document.getElementById(id);

export function initRegion(api, edge, show) {
  const box = $("region-box"), video = $("video");
  const r = edge.region = { camera: null, value: null, saved: 0 };

  // the rectangle of the element where the picture is (the video letterboxes a picture of another aspect)
  function picture() {
    const w = video.clientWidth, h = video.clientHeight;
    const vw = video.videoWidth || 4, vh = video.videoHeight || 3;
    const scale = Math.min(w / vw, h / vh);
    return { x: (w - vw * scale) / 2, y: (h - vh * scale) / 2, w: vw * scale, h: vh * scale };
  }

  function draw() {
    box.hidden = !r.camera || !r.value;
    if (box.hidden) { $("region-line").textContent = ""; return; }
    const p = picture(), [x, y, w, h] = r.value;
    Object.assign(box.style, { left: `${p.x + x * p.w}px`, top: `${p.y + y * p.h}px`, width: `${w * p.w}px`, height: `${h * p.h}px` });
    $("region-line").textContent = `region = [${r.value.map((v) => v.toFixed(3)).join(", ")}]`;
  }

  async function save(value) {
    try {
      const res = await api(`/api/cameras/${encodeURIComponent(r.camera)}/region`, { method: "PUT",
        headers: { "Content-Type": "application/json" }, body: JSON.stringify({ region: value }) });
      const data = await res.json();
      if (!res.ok) throw new Error(data.error || `HTTP ${res.status}`);
      r.value = data.region; r.saved += 1;
      show(value ? `region saved for ${r.camera}: the model sees the square around it (put the line below under ` +
        `this camera in config.toml to keep it after a restart)` : `region cleared for ${r.camera}: the model sees the centre square`);
    } catch (err) { show(String(err.message || err), true); }
    draw();
  }

  async function load(camera) {
    r.camera = camera || null; r.value = null;
    $("region-controls").hidden = !r.camera;
    if (r.camera) {
      try { r.value = (await (await api(`/api/cameras/${encodeURIComponent(r.camera)}/region`)).json()).region; }
      catch { r.value = null; }
    }
    draw();
  }

  let drag = null;
  box.addEventListener("pointerdown", (e) => {
    const p = picture(), [x, y, w, h] = r.value;
    const corner = e.offsetX > box.clientWidth - 14 && e.offsetY > box.clientHeight - 14;
    drag = { corner, x0: e.clientX, y0: e.clientY, start: [x, y, w, h], p };
    box.setPointerCapture(e.pointerId);
  });
  box.addEventListener("pointermove", (e) => {
    if (!drag) return;
    const dx = (e.clientX - drag.x0) / drag.p.w, dy = (e.clientY - drag.y0) / drag.p.h;
    let [x, y, w, h] = drag.start;
    if (drag.corner) { w = Math.min(1 - x, Math.max(0.05, w + dx)); h = Math.min(1 - y, Math.max(0.05, h + dy)); }
    else { x = Math.min(1 - w, Math.max(0, x + dx)); y = Math.min(1 - h, Math.max(0, y + dy)); }
    r.value = [x, y, w, h];
    draw();
  });
  box.addEventListener("pointerup", () => { if (drag) { drag = null; save(r.value); } });
  $("region-set").onclick = () => save(r.value || [0.25, 0.25, 0.5, 0.5]);
  $("region-clear").onclick = () => save(null);
  new ResizeObserver(draw).observe(video);
  video.addEventListener("loadedmetadata", draw);
  return { load, save };
}
