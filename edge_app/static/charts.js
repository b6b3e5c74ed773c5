// Small live time-series charts on <canvas>: no library, no build step.
//   const c = new LiveChart(canvasElement, { series: [{ name: "RTT", color: "#2563eb" }], unit: "ms", windowS: 30 });
//   c.push(performance.now() / 1000, [12.3]);       // one value per series (null: gap)
// The y range follows the data (or fixed with { min, max }); step: true draws steps (for the exit index).

export class LiveChart {
  constructor(canvas, opts) {
    this.canvas = canvas;
    this.opts = Object.assign({ windowS: 30, unit: "", step: false, min: null, max: null, markers: null }, opts);
    this.points = [];   // [t, [v...]]
    this.dirty = true;
    const tick = () => { if (this.dirty) this.draw(); requestAnimationFrame(tick); };
    requestAnimationFrame(tick);
  }

  push(t, values) {
    this.points.push([t, values]);
    const cutoff = t - this.opts.windowS;
    while (this.points.length && this.points[0][0] < cutoff) this.points.shift();
    this.dirty = true;
  }

  clear() { this.points = []; this.dirty = true; }

  range() {
    let lo = this.opts.min, hi = this.opts.max;
    if (lo === null || hi === null) {
      let dlo = Infinity, dhi = -Infinity;
      for (const [, vs] of this.points) for (const v of vs) if (v !== null && Number.isFinite(v)) {
        dlo = Math.min(dlo, v); dhi = Math.max(dhi, v);
      }
      if (!Number.isFinite(dlo)) { dlo = 0; dhi = 1; }
      if (lo === null) lo = Math.min(0, dlo);
      if (hi === null) hi = dhi > lo ? dhi * 1.15 : lo + 1;
    }
    return [lo, hi];
  }

  draw() {
    this.dirty = false;
    const c = this.canvas, dpr = window.devicePixelRatio || 1;
    const w = c.clientWidth, h = c.clientHeight;
    if (c.width !== w * dpr) { c.width = w * dpr; c.height = h * dpr; }
    const g = c.getContext("2d");
    g.setTransform(dpr, 0, 0, dpr, 0, 0);
    g.clearRect(0, 0, w, h);
    const [lo, hi] = this.range();
    const padL = 44, padB = 4, padT = 16;
    const now = this.points.length ? this.points[this.points.length - 1][0] : 0;
    const x = (t) => padL + (w - padL - 4) * (1 - (now - t) / this.opts.windowS);
    const y = (v) => padT + (h - padT - padB) * (1 - (v - lo) / (hi - lo || 1));
    g.font = "11px system-ui, sans-serif"; g.fillStyle = "#6b7280"; g.strokeStyle = "#e5e7eb";
    for (const v of [lo, (lo + hi) / 2, hi]) {
      g.beginPath(); g.moveTo(padL, y(v)); g.lineTo(w, y(v)); g.stroke();
      g.fillText(fmt(v) + (v === hi ? " " + this.opts.unit : ""), 2, y(v) + 4);
    }
    this.opts.series.forEach((s, i) => {
      g.strokeStyle = s.color; g.lineWidth = 1.6; g.beginPath();
      let open = false, prevY = null;
      for (const [t, vs] of this.points) {
        const v = vs[i];
        if (v === null || !Number.isFinite(v)) { open = false; continue; }
        const px = x(t), py = y(Math.min(hi, Math.max(lo, v)));
        if (!open) { g.moveTo(px, py); open = true; }
        else { if (this.opts.step) g.lineTo(px, prevY); g.lineTo(px, py); }
        prevY = py;
      }
      g.stroke();
      g.fillStyle = s.color; g.fillText(s.name, padL + 4 + i * 110, 11);
    });
    if (this.opts.markers) {  // e.g. deadline misses: red ticks at the bottom
      g.fillStyle = "#dc2626";
      for (const [t, vs] of this.points) if (this.opts.markers(vs)) g.fillRect(x(t) - 1, h - 8, 2, 8);
    }
  }
}

function fmt(v) {
  const a = Math.abs(v);
  if (a >= 1e6) return (v / 1e6).toFixed(1) + "M";
  if (a >= 1e3) return (v / 1e3).toFixed(0) + "k";
  if (a >= 10 || v === 0) return v.toFixed(0);
  return v.toFixed(1);
}

