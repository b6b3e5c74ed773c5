// The analysis drawn over the browser's own camera (results first: no video comes back), each result over the
// frame it belongs to.
//
// The page keeps its camera's last ~1.5 s of frames (requestVideoFrameCallback; ImageBitmaps stamped with their
// capture time) and, for each result, picks the frame the server analysed. Its capture time, in this page's clock:
// the server's arrival time of the frame (arrived_unix_ms), moved into our clock by the smallest gap seen between
// the server's clock on its pings and ours when they land (that gap also holds the path's one-way floor down),
// less the page's smallest RTT (the two floors), how late the frame came in (budget.late_ms) and CODEC_MS, the
// browser's encode and the server's decode, which no clock here sees, less the video element's own delay (the
// kept frames carry the time they were shown): measured with ?probe=1, where the page reads each kept frame's
// counter and so knows whether it picked the analysed one. That frame is drawn under the overlay, so label and picture agree;
// the picture is then as far behind live as the results are (shown on it). Where no kept frame is within
// MATCH_MS (a browser without requestVideoFrameCallback, before the first ping), the overlay goes over the live
// video and the result counts as unmatched.
//
// Over a camera's own picture (clock "received": the server forwards the camera's packets as they come, with no
// transcode), a frame is known by when its packets came: the video frame callback's receiveTime, against the
// server's arrival time of the frame moved into our clock by the smallest ping gap (which holds the one-way floor),
// A result usually comes before its frame (the video waits in the jitter buffer and the decoder, the analysis
// takes a few ms), so it is held until a frame at or after its time has come, or for HOLD_MS at most.

const KEEP_MS = 1500, MATCH_MS = 50, SKEW_SAMPLES = 40, MAX_WIDTH = 640, CODEC_MS = 20;
const HOLD_MS = 150;  // over a camera's own picture, how long a result may wait for its frame to come

export const wallMs = () => performance.timeOrigin + performance.now();

export class FrameMatcher {
  constructor(video, canvas, clock = "captured") {
    this.video = video; this.canvas = canvas; this.clock = clock;
    this.frames = [];  // {t: capture time (wall ms), bmp}
    this.skews = [];  // our clock minus the server's, as its pings land (ms)
    this.rttMin = null;
    this.matched = 0; this.unmatched = 0;
    this.errorsFrames = [];  // probe mode: picked frame's counter less the analysed frame's, per matched result
    this.pending = [];  // clock "received": results waiting for their frame
    this.running = false;
  }

  start() {
    const v = this.video;
    if (this.running || typeof v.requestVideoFrameCallback !== "function") return;
    this.running = true;
    const onFrame = async (now, meta) => {
      if (!this.running) return;
      v.requestVideoFrameCallback(onFrame);
      if (!v.videoWidth) return;
      // when it came (a remote frame's receiveTime), else when it is shown (a generated track has no captureTime)
      const t = performance.timeOrigin + (this.clock === "received" && meta.receiveTime ? meta.receiveTime : now);
      const scale = Math.min(1, MAX_WIDTH / v.videoWidth);
      try {
        const bmp = await createImageBitmap(v, { resizeWidth: Math.round(v.videoWidth * scale),
          resizeHeight: Math.round(v.videoHeight * scale) });
        if (!this.running) { bmp.close(); return; }
        this.frames.push({ t, bmp });
      } catch { return; }  // a frame that went away meanwhile
      while (this.frames.length && this.frames[0].t < t - KEEP_MS) this.frames.shift().bmp.close();
      this.flush();
    };
    v.requestVideoFrameCallback(onFrame);
  }

  stop() {
    this.running = false;
    this.pending = [];
    for (const f of this.frames) f.bmp.close();
    this.frames = [];
  }

  serverClock(serverMs) {
    if (typeof serverMs !== "number") return;
    this.skews.push(wallMs() - serverMs);
    if (this.skews.length > SKEW_SAMPLES) this.skews.shift();
  }

  rtt(ms) { if (ms !== null && ms > 0) this.rttMin = this.rttMin === null ? ms : Math.min(this.rttMin, ms); }

  captureTime(m) {
    if (!this.skews.length || typeof m.arrived_unix_ms !== "number") return null;
    if (this.clock === "received") return m.arrived_unix_ms + Math.min(...this.skews);
    return m.arrived_unix_ms + Math.min(...this.skews) - (this.rttMin ?? 0) - ((m.budget && m.budget.late_ms) || 0)
      - CODEC_MS;
  }

  frameFor(m) {
    const t = this.captureTime(m);
    if (t === null || m.reused) return null;
    let best = null;
    for (const f of this.frames) if (best === null || Math.abs(f.t - t) < Math.abs(best.t - t)) best = f;
    return best && Math.abs(best.t - t) <= MATCH_MS ? best : null;
  }

  // Draw ``m`` (a result) over its frame; ``stampOf(bitmap)``, in probe mode, reads a kept frame's counter.
  draw(m, numExits, stampOf = null) {
    if (this.clock !== "received" || !this.running) { this.place(m, numExits, stampOf, true); return; }
    this.pending.push({ m, numExits, stampOf, at: wallMs() });
    setTimeout(() => this.flush(), HOLD_MS);
    this.flush();
  }

  // Results whose frame has come (or that waited HOLD_MS) are placed; the newest of them is drawn.
  flush() {
    const last = this.frames.length ? this.frames[this.frames.length - 1].t : -Infinity;
    let ready = null;
    while (this.pending.length) {
      const p = this.pending[0], t = this.captureTime(p.m);
      if (t !== null && !p.m.reused && t > last + MATCH_MS / 2 && wallMs() - p.at < HOLD_MS) break;
      if (ready) this.place(ready.m, ready.numExits, ready.stampOf, false);
      ready = this.pending.shift();
    }
    if (ready) this.place(ready.m, ready.numExits, ready.stampOf, true);
  }

  place(m, numExits, stampOf, show) {
    const frame = this.frameFor(m);
    if (frame) {
      this.matched += 1;
      const picked = stampOf && typeof m.stamp === "number" ? stampOf(frame.bmp) : null;
      if (picked !== null && this.errorsFrames.length < 100_000) this.errorsFrames.push(picked - m.stamp);
    } else {
      this.unmatched += 1;
    }
    if (show) drawOverlay(this.canvas, this.video, m, numExits, frame);
  }
}

// Label and confidence, the exits used, green when on time (what the server draws into the video it sends back),
// over ``frame`` (an ImageBitmap kept by FrameMatcher) or, without one, over the live video.
export function drawOverlay(canvas, video, m, numExits, frame = null) {
  const w = canvas.clientWidth, h = canvas.clientHeight, dpr = window.devicePixelRatio || 1;
  if (canvas.width !== Math.round(w * dpr)) { canvas.width = Math.round(w * dpr); canvas.height = Math.round(h * dpr); }
  const ctx = canvas.getContext("2d");
  ctx.setTransform(dpr, 0, 0, dpr, 0, 0);
  ctx.clearRect(0, 0, w, h);
  if (!video.videoWidth) return;
  if (frame) {  // as the video element shows it: the whole picture, centred (object-fit: contain)
    const s = Math.min(w / frame.bmp.width, h / frame.bmp.height);
    const dw = frame.bmp.width * s, dh = frame.bmp.height * s;
    ctx.fillStyle = "#111"; ctx.fillRect(0, 0, w, h);
    ctx.drawImage(frame.bmp, (w - dw) / 2, (h - dh) / 2, dw, dh);
  }
  const conf = m.smoothed.confidence;
  const colour = conf >= 0.8 ? "#3cc850" : conf >= 0.5 ? "#f0b428" : "#e63c32";
  ctx.fillStyle = "rgba(0, 0, 0, 0.45)";
  ctx.fillRect(0, 0, w, 44);
  ctx.font = "600 20px system-ui, sans-serif";
  ctx.fillStyle = colour;
  ctx.fillText(`${m.smoothed.label}  ${(100 * conf).toFixed(0)}%`, 10, 27);
  ctx.font = "12px system-ui, sans-serif";
  ctx.fillStyle = m.deadline_met ? "#fff" : "#e63c32";
  const behind = frame ? `  ·  picture ${(wallMs() - frame.t).toFixed(0)} ms behind live` : "";
  ctx.fillText((m.reused ? "reused" : `exit ${m.exit}/${numExits}  ${m.latency_ms.toFixed(0)} ms`) + behind, 10, 40);
  for (let k = 0; k < (numExits || 0); k++) {
    const x = w - ((numExits - k) * 22) - 6;
    if (k < m.exit) { ctx.fillStyle = colour; ctx.fillRect(x, 8, 18, 18); }
    ctx.strokeStyle = "#fff"; ctx.strokeRect(x + 0.5, 8.5, 17, 17);
  }
}

export function clearOverlay(canvas) {
  canvas.getContext("2d").clearRect(0, 0, canvas.width, canvas.height);
}
