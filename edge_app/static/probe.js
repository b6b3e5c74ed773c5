// Probe mode (?probe=1): glass-to-glass latency measured in the browser.
// Every camera frame is drawn into a canvas, the frame counter a test video may carry in its left margin
// is read back (the source stamp: which labelled frame this is), and the browser's own counter is drawn
// over it; the canvas frames, not the camera's, are what the page sends.  The server reads the counter
// back (streams/stamp.py: 16 cells of h/16 in a column w/12 wide, white start cell, 14 bits MSB first,
// black end cell) and puts it in each result as "stamp", and leaves it in the annotated video.  So for
// each counter the page knows when it was stamped, when its JSON result arrived and when its annotated
// frame was displayed.  window.edge.probe holds the records; app.js imports this module only with ?probe=1.

const STAMP_BITS = 14, STAMP_CELLS = STAMP_BITS + 2, STAMP_MOD = 1 << STAMP_BITS;

function stampColumnWidth(w) { return Math.max(4, Math.floor(w / 12)); }

// The value in a stamp column (RGBA pixels of a cw x h image), or null when it holds no clean stamp.
function readStampColumn(data, cw, h) {
  if (h < STAMP_CELLS * 4) return null;
  const ch = Math.floor(h / STAMP_CELLS), my = Math.floor(ch / 4), mx = Math.floor(cw / 4);
  const levels = [];
  for (let i = 0; i < STAMP_CELLS; i++) {
    let sum = 0, n = 0;
    for (let y = i * ch + my; y < (i + 1) * ch - my; y++) {
      for (let x = mx; x < cw - mx; x++) {
        const o = 4 * (y * cw + x);
        sum += data[o] + data[o + 1] + data[o + 2]; n += 3;
      }
    }
    levels.push(n ? sum / n : 0);
  }
  if (levels.some((v) => v > 85 && v < 170) || levels[0] < 128 || levels[STAMP_CELLS - 1] >= 128) return null;
  let value = 0;
  for (let i = 1; i < STAMP_CELLS - 1; i++) value = (value << 1) | (levels[i] >= 128 ? 1 : 0);
  return value;
}

function drawStamp(ctx, w, h, value) {
  const cw = stampColumnWidth(w), ch = Math.floor(h / STAMP_CELLS), v = value % STAMP_MOD;
  for (let i = 0; i < STAMP_CELLS; i++) {
    const bit = i === 0 ? 1 : i === STAMP_CELLS - 1 ? 0 : (v >> (STAMP_BITS - i)) & 1;
    ctx.fillStyle = bit ? "#fff" : "#000";
    ctx.fillRect(0, i * ch, cw, ch);
  }
}

export function wallMs() { return performance.timeOrigin + performance.now(); }

export function newProbe() {
  // sent[c] = [stamped at (wall ms), source stamp or null] by counter (mod 2^14: it wraps after ~9 minutes);
  // log: [absolute counter, stamped at, source stamp] of every frame stamped, the denominator of what users see;
  // results: result messages with arrival_ms (and stamp_abs, the absolute counter, resolved on arrival);
  // displays: [absolute counter, displayed at (wall ms)] of annotated frames as they were shown;
  // stats: [wall ms, frames stamped, framesEncoded, framesSent] of the browser's video sender, about once a second
  return { sent: new Array(STAMP_MOD).fill(null), count: 0, log: [], results: [], displays: [], stats: [],
           errors: [] };
}

// The absolute counter of a stamp read back now: the latest frame stamped with that value (results and frames
// come back within seconds; the 14-bit counter wraps after ~9 minutes).
export function absoluteCounter(probe, stamp) {
  const last = probe.count - 1;
  return last - ((((last - stamp) % STAMP_MOD) + STAMP_MOD) % STAMP_MOD);
}

// A track that carries the camera's frames with the page's counter stamped in (Chrome's insertable streams).
export function stampedTrack(track, probe) {
  if (typeof MediaStreamTrackProcessor === "undefined" || typeof MediaStreamTrackGenerator === "undefined") {
    throw new Error("probe mode needs MediaStreamTrackProcessor (Chrome/Chromium 94 or later)");
  }
  const processor = new MediaStreamTrackProcessor({ track });
  const generator = new MediaStreamTrackGenerator({ kind: "video" });
  let canvas = null, ctx = null;
  const stamp = new TransformStream({
    transform(frame, controller) {
      const w = frame.displayWidth, h = frame.displayHeight;
      if (!canvas || canvas.width !== w || canvas.height !== h) {
        canvas = new OffscreenCanvas(w, h);
        ctx = canvas.getContext("2d", { willReadFrequently: true });
      }
      ctx.drawImage(frame, 0, 0, w, h);
      const cw = stampColumnWidth(w);
      const source = readStampColumn(ctx.getImageData(0, 0, cw, h).data, cw, h);
      const c = probe.count % STAMP_MOD;
      probe.count += 1;
      drawStamp(ctx, w, h, c);
      const at = wallMs();
      probe.sent[c] = [at, source];
      probe.log.push([probe.count - 1, at, source]);
      const out = new VideoFrame(canvas, { timestamp: frame.timestamp });
      frame.close();
      controller.enqueue(out);
    },
  });
  processor.readable.pipeThrough(stamp).pipeTo(generator.writable).catch((e) => probe.errors.push(String(e)));
  return generator;
}

// The counter stamped into ``image`` (an ImageBitmap of a stamped frame), or null.
let stampCanvas = null;
export function stampOf(image) {
  const w = image.width, h = image.height, cw = stampColumnWidth(w);
  stampCanvas = stampCanvas || new OffscreenCanvas(cw, h);
  if (stampCanvas.width !== cw || stampCanvas.height !== h) { stampCanvas.width = cw; stampCanvas.height = h; }
  const ctx = stampCanvas.getContext("2d", { willReadFrequently: true });
  ctx.drawImage(image, 0, 0, cw, h, 0, 0, cw, h);
  return readStampColumn(ctx.getImageData(0, 0, cw, h).data, cw, h);
}

// Record when each annotated frame is shown: requestVideoFrameCallback gives its expected display time.
export function watchDisplay(video, probe) {
  if (!("requestVideoFrameCallback" in HTMLVideoElement.prototype)) {
    probe.errors.push("no requestVideoFrameCallback: display times are not measured");
    return;
  }
  const canvas = document.createElement("canvas");
  const ctx = canvas.getContext("2d", { willReadFrequently: true });
  let last = null;
  const onFrame = (now, meta) => {
    const w = meta.width, h = meta.height, cw = stampColumnWidth(w);
    if (canvas.width !== cw || canvas.height !== h) { canvas.width = cw; canvas.height = h; }
    ctx.drawImage(video, 0, 0, cw, h, 0, 0, cw, h);
    const c = readStampColumn(ctx.getImageData(0, 0, cw, h).data, cw, h);
    if (c !== null && c !== last) {
      probe.displays.push([absoluteCounter(probe, c), performance.timeOrigin + meta.expectedDisplayTime]);
    }
    last = c;
    video.requestVideoFrameCallback(onFrame);
  };
  video.requestVideoFrameCallback(onFrame);
}

// Latency summaries of what was recorded so far (the page shows them; the benchmark reads the raw records).
export function probeLatencies(probe) {
  const pct = (xs, q) => { if (!xs.length) return null; const s = [...xs].sort((a, b) => a - b); return s[Math.min(s.length - 1, Math.floor(q * s.length))]; };
  const toResult = [], toDisplay = [];
  for (const r of probe.results) { const s = r.stamp !== null && probe.sent[r.stamp]; if (s) toResult.push(r.arrival_ms - s[0]); }
  for (const [c, t] of probe.displays) { const s = probe.log[c]; if (s) toDisplay.push(t - s[1]); }
  return { result_p50: pct(toResult, 0.5), result_p95: pct(toResult, 0.95), display_p50: pct(toDisplay, 0.5),
           display_p95: pct(toDisplay, 0.95), results: toResult.length, displays: toDisplay.length };
}
