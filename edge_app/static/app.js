// The browser client (an ES module): share the camera (or pick a configured RTSP camera), connect over WebRTC,
// show the annotated video that comes back and chart what the scheduler does, frame by frame.
// window.edge holds the live state (the end-to-end tests read it); probe.js is loaded only with ?probe=1.
import { LiveChart } from "./charts.js";
import { FrameMatcher, clearOverlay, drawOverlay } from "./overlay.js";
import { parseMessage } from "./protocol.js";
import { initEvents } from "./events.js";
import { initTeach } from "./teach.js";

const $ = (id) => document.getElementById(id);
const params = new URLSearchParams(location.search);
const probe = params.has("probe") ? await import("./probe.js") : null;
// The server is alive while results or pongs come: the page pings it every PING_MS; when neither has come for
// SILENT_MS (its worker died, the box restarted, the path broke), the page says so and offers again by itself
// (after RETRY_MS, doubling up to RETRY_MAX_MS while offers fail), until the user presses Disconnect.
const PING_MS = 500, SILENT_MS = 2000, RETRY_MS = 1000, RETRY_MAX_MS = 10_000;
const edge = window.edge = {
  state: "idle", session: null, error: null, results: 0, lastResult: null, recent: [], misses: 0,
  numExits: null, exitCounts: [], lastDetail: null, uplink: null, uplinkApplied: 0, reused: 0, unchanged: 0, videoBack: false, picture: null, overlayDrawn: 0, matcher: null, model: null, models: 0, sourceState: null, connectTimer: null, browserRttMs: null,
  framesDecoded: 0, videoFps: null, pc: null, channel: null,
  lastHeard: 0, silences: 0, reoffering: false, reofferTimer: null, reofferMs: RETRY_MS, liveTimer: null, pingId: 0,
  probe: probe ? probe.newProbe() : null,  // per-frame glass-to-glass records
  probeLatencies: () => (probe ? probe.probeLatencies(edge.probe) : null),
};
const PROBE_KEEP = 100_000;  // result records kept in probe mode (about 55 minutes at 30 fps)
const KEEP = 600;  // recent results kept for tests and the exit histogram

let charts = null;  // made once /status has said how many exits the model has

function makeCharts(numExits) {
  edge.numExits = numExits;
  edge.exitCounts = new Array(numExits).fill(0);
  charts = {
    exit: new LiveChart($("chart-exit"), { series: [{ name: "exit used", color: "#7c3aed" },
      { name: "exits allowed", color: "#cbd5e1" }], min: 0, max: numExits + 0.2, step: true, windowS: 20,
      markers: (vs) => vs[2] === 1 }),
    conf: new LiveChart($("chart-conf"), { series: [{ name: "raw", color: "#94a3b8" },
      { name: "smoothed", color: "#059669" }], min: 0, max: 1, unit: "", windowS: 20 }),
    rtt: new LiveChart($("chart-rtt"), { series: [{ name: "server estimate", color: "#2563eb" },
      { name: "browser", color: "#f59e0b" }], unit: "ms", windowS: 60 }),
    rate: new LiveChart($("chart-rate"), { series: [{ name: "encoder target", color: "#0891b2" },
      { name: "receive estimate", color: "#a3a3a3" }], unit: "bit/s", windowS: 60 }),
    budget: new LiveChart($("chart-budget"), { series: [{ name: "compute budget", color: "#16a34a" },
      { name: "compute used", color: "#dc2626" }, { name: "server latency", color: "#6b7280" }], unit: "ms",
      windowS: 20 }),
  };
}

// Access token (when the server has one): from the URL fragment (/#token=..., which is never sent in a
// request line), kept in sessionStorage for this tab; asked for once when the server answers 401.
const TOKEN_KEY = "edge-app-token";
const hashToken = new URLSearchParams(location.hash.slice(1)).get("token");
if (hashToken) {
  sessionStorage.setItem(TOKEN_KEY, hashToken);
  history.replaceState(null, "", location.pathname + location.search);  // keep it out of the address bar
}
let askedForToken = false;

async function api(path, opts = {}) {
  const headers = { ...(opts.headers || {}) };
  const token = sessionStorage.getItem(TOKEN_KEY);
  if (token) headers.Authorization = `Bearer ${token}`;
  const r = await fetch(path, { ...opts, headers });
  if (r.status === 401 && !askedForToken) {
    askedForToken = true;
    const entered = window.prompt("This edge box needs its access token:");
    if (entered) { sessionStorage.setItem(TOKEN_KEY, entered.trim()); return api(path, opts); }
  }
  return r;
}

function setState(s, detail) {
  edge.state = s;
  const pill = $("conn");
  pill.textContent = detail ? `${s}: ${detail}` : s;
  pill.className = "pill " + ({ connected: "ok", failed: "bad", error: "bad", reconnecting: "warn" }[s] || "");
  const busy = s === "connecting" || s === "connected" || s === "reconnecting";
  $("connect").disabled = busy;
  $("disconnect").disabled = !busy;
}

async function loadStatus() {
  const r = await api("/status");
  if (r.status === 401) throw new Error("/status: the access token is missing or wrong (open /#token=...)");
  if (!r.ok) throw new Error(`/status: HTTP ${r.status}`);
  return r.json();
}

// ?camera=NAME is selected from the start (Connect may come before the first /status) and once only: the
// user's own choice stands after that, through every refresh of the list.
if (params.get("camera")) {
  $("source").append(new Option(`camera ${params.get("camera")}`, params.get("camera")));
  $("source").value = params.get("camera");
}

function fillSources(status) {
  const sel = $("source"), keep = sel.value;
  sel.replaceChildren(new Option("my camera (this browser)", ""),
    ...status.cameras.map((c) => new Option(c.kind === "demo" ? `${c.name}: labelled demo frames (live accuracy)`
      : c.kind === "file" ? `${c.name}: video file ${c.url.replace(/^file:/, "")} (${c.state})` : `camera ${c.name} (${c.state})`, c.name)));
  if ([...sel.options].some((o) => o.value === keep)) sel.value = keep;
  fillModels();
}

// The models a browser's own camera may be answered by (GET /api/models: the shipped one and those taught here);
// hidden when there is only the default, or while a camera (answered by its own model) is picked.
async function fillModels() {
  if (edge.modelNames === undefined) {
    edge.modelNames = [];
    try {
      const r = await api("/api/models");
      if (r.ok) edge.modelNames = (await r.json()).models.filter((m) => !m.error).map((m) => m.name);
    } catch (err) { /* the list stays empty: the box's default answers */ }
  }
  const sel = $("model"), keep = sel.value;
  sel.replaceChildren(new Option("the box's default", ""), ...edge.modelNames.map((n) => new Option(n, n)));
  if ([...sel.options].some((o) => o.value === keep)) sel.value = keep;
  $("model-pick").hidden = edge.modelNames.length < 2 || Boolean($("source").value);
}

// What to do when ICE finds no path (shown on the page, not only in the server log).
function connectHint() {
  const sameMachine = ["localhost", "127.0.0.1", "[::1]", "::1"].includes(location.hostname);
  return sameMachine
    ? 'no network path between this browser and the server. On the same machine: set ice_host_addresses = ["127.0.0.1"] under [server] in config.toml and restart edge-app'
    : "no network path between this browser and the server. From another machine: serve HTTPS on an address this browser can reach ([server] host, tls_cert, tls_key), or add a TURN server ([server] ice_servers)";
}

function failConnect(pc, why) {
  if (edge.pc !== pc || edge.state === "failed") return;
  if (edge.reoffering) { teardown(); reofferLater(why); return; }
  edge.error = `${why}: ${connectHint()}`;
  setState("failed", edge.error);
  teardown();
}

function waitIceGathering(pc) {
  if (pc.iceGatheringState === "complete") return Promise.resolve();
  return new Promise((resolve) => {
    const check = () => { if (pc.iceGatheringState === "complete") { pc.removeEventListener("icegatheringstatechange", check); resolve(); } };
    pc.addEventListener("icegatheringstatechange", check);
    setTimeout(resolve, 3000);  // host candidates only (no STUN by default): gathering is quick
  });
}

async function connect() {
  const camera = $("source").value || null;
  setState("connecting");
  edge.error = null;
  try {
    const status = await loadStatus();
    const pc = edge.pc = new RTCPeerConnection({ iceServers: status.ice_servers || [] });
    const channel = edge.channel = pc.createDataChannel("results", { ordered: false, maxRetransmits: 0 });
    channel.onmessage = (e) => onMessage(channel, e.data);
    channel.onopen = () => watchLiveness(pc, channel);
    pc.ontrack = (e) => { if (edge.videoBack) $("video").srcObject = e.streams[0] || new MediaStream([e.track]); };
    pc.onconnectionstatechange = () => {
      if (pc.connectionState === "connected") {
        clearTimeout(edge.connectTimer);
        setState("connected", camera ? `watching ${camera}` : "your camera");
      }
      if (pc.connectionState === "failed") {
        if (edge.state === "connecting") failConnect(pc, "the connection failed");
        else setState("failed", "the connection was lost");
      }
    };
    pc.oniceconnectionstatechange = () => {
      if (pc.iceConnectionState === "failed" && edge.state === "connecting") failConnect(pc, "ICE failed");
    };
    const connectTimeoutS = (status.limits && status.limits.connect_timeout_s) || 15;
    clearTimeout(edge.connectTimer);
    edge.connectTimer = setTimeout(() => {
      if (edge.pc === pc && pc.connectionState !== "connected") failConnect(pc, `not connected after ${connectTimeoutS} s`);
    }, connectTimeoutS * 1000);
    if (camera === null) {
      const stream = await navigator.mediaDevices.getUserMedia({
        video: { width: { ideal: 640 }, height: { ideal: 480 }, frameRate: { ideal: 30 } }, audio: false });
      // results first: unless annotated video back is asked for, the page shows its own camera at once and draws
      // the analysis over it; the offer is then sendonly, and the server neither renders nor encodes for it
      edge.videoBack = $("video-back").checked;
      let shown = stream;
      for (const t of stream.getVideoTracks()) {
        const track = probe ? probe.stampedTrack(t, edge.probe) : t;
        if (probe) shown = new MediaStream([track]);  // what is sent, counters and all: the overlay's frames are known
        pc.addTransceiver(track, { direction: edge.videoBack ? "sendrecv" : "sendonly",
          streams: [probe ? new MediaStream([track]) : stream] });
      }
      edge.localStream = stream;
      if (!edge.videoBack) {
        $("video").srcObject = shown;
        edge.matcher = new FrameMatcher($("video"), $("overlay"));  // each result over the frame it belongs to
        edge.matcher.start();
      }
    } else {
      // a camera: its own picture where the server can forward it as it is (no transcode), with the analysis
      // drawn here; the server says which picture it sends ({"type": "video"}); ?annotated=1 asks for it drawn in
      edge.videoBack = true;
      pc.addTransceiver("video", { direction: "recvonly" });
    }
    await pc.setLocalDescription(await pc.createOffer());
    await waitIceGathering(pc);
    const r = await api("/offer", { method: "POST", headers: { "Content-Type": "application/json" },
      body: JSON.stringify({ sdp: pc.localDescription.sdp, type: "offer", camera, probe: params.has("probe"),
        video: params.has("annotated") ? "annotated" : "camera", model: camera ? undefined : ($("model").value || undefined) }) });
    const answer = await r.json();
    if (!r.ok) throw new Error(answer.error || `HTTP ${r.status}`);
    edge.session = answer.session;
    await pc.setRemoteDescription({ sdp: answer.sdp, type: answer.type });
    for (const sender of pc.getSenders()) {  // from the first frame: short of CPU, smaller frames, not fewer
      if (!sender.track || sender.track.kind !== "video") continue;
      const p = sender.getParameters();
      p.degradationPreference = "maintain-framerate";
      sender.setParameters(p).catch((err) => console.warn("setParameters", err));
    }
  } catch (err) {
    teardown();
    if (edge.reoffering) { reofferLater(String(err.message || err)); return; }
    edge.error = String(err.message || err);
    setState("error", edge.error);
  }
}

// Results or pongs must keep coming while connected (see PING_MS above).
function watchLiveness(pc, channel) {
  edge.lastHeard = performance.now();
  edge.reoffering = false;
  edge.reofferMs = RETRY_MS;  // connected again: the next silence starts the backoff afresh
  clearInterval(edge.liveTimer);
  edge.liveTimer = setInterval(() => {
    if (edge.pc !== pc) { clearInterval(edge.liveTimer); return; }
    if (performance.now() - edge.lastHeard > SILENT_MS) { serverSilent(); return; }
    if (channel.readyState === "open") channel.send(JSON.stringify({ type: "ping", id: ++edge.pingId }));
  }, PING_MS);
}

function serverSilent() {
  edge.silences += 1;
  teardown();
  reofferLater(`the server went silent (no results or pongs for ${SILENT_MS / 1000} s)`);
}

// Offer again after a pause: the server places the new session where it can (a live worker).
function reofferLater(why) {
  edge.reoffering = true;
  setState("reconnecting", `${why}; offering again in ${(edge.reofferMs / 1000).toFixed(0)} s`);
  clearTimeout(edge.reofferTimer);
  edge.reofferTimer = setTimeout(() => { edge.reofferTimer = null; connect(); }, edge.reofferMs);
  edge.reofferMs = Math.min(RETRY_MAX_MS, 2 * edge.reofferMs);
}

// What the video from the server shows: "camera" (the camera's own picture: each result is drawn here, over the
// frame it belongs to, matched by when its packets came) or "annotated" (the server drew the analysis in).
function pictureChanged(picture) {
  edge.picture = picture;
  if (edge.matcher) edge.matcher.stop();
  edge.matcher = null;
  clearOverlay($("overlay"));
  if (picture === "camera") {
    edge.matcher = new FrameMatcher($("video"), $("overlay"), "received");
    edge.matcher.start();
  }
}

function teardown() {
  clearTimeout(edge.connectTimer);
  clearInterval(edge.liveTimer);
  clearOverlay($("overlay"));
  if (edge.matcher) edge.matcher.stop();
  if (edge.pc) edge.pc.close();
  if (edge.localStream) edge.localStream.getTracks().forEach((t) => t.stop());
  edge.pc = edge.channel = edge.localStream = edge.matcher = edge.picture = null;
}

function disconnect() {
  clearTimeout(edge.reofferTimer);
  edge.reofferTimer = null;
  edge.reoffering = false;
  teardown();
  setState("idle");
}

function onMessage(channel, data) {
  edge.lastHeard = performance.now();
  let msg;
  try { msg = parseMessage(data); } catch (e) { edge.badMessages = (edge.badMessages || 0) + 1; console.warn(e.message); return; }
  if (msg.type === "ping") {
    channel.send(JSON.stringify({ type: "pong", id: msg.id }));
    if (edge.matcher) edge.matcher.serverClock(msg.t);
    return;
  }
  if (msg.type === "pong") return;  // the server is alive (lastHeard above)
  if (msg.type === "source") { showSource(msg); return; }
  if (msg.type === "uplink") { applyUplink(msg); return; }
  if (msg.type === "model") { modelChanged(msg); return; }
  if (msg.type === "video") { pictureChanged(msg.picture); return; }
  if (msg.type !== "result") return;
  if (edge.probe) {
    msg.arrival_ms = probe.wallMs();
    if (msg.stamp !== undefined && msg.stamp !== null) msg.stamp_abs = probe.absoluteCounter(edge.probe, msg.stamp);
    if (edge.probe.results.length < PROBE_KEEP) edge.probe.results.push(msg);
  }
  edge.results += 1;
  edge.lastResult = msg;
  if (msg.detail) edge.lastDetail = msg;  // every field, once a second (the others are compact)
  edge.recent.push(msg);
  if (edge.recent.length > KEEP) edge.recent.shift();
  if (msg.unchanged) edge.unchanged += 1; else if (msg.reused) edge.reused += 1; else edge.exitCounts[msg.exit - 1] += 1;
  if (!msg.deadline_met) edge.misses += 1;
  if (msg.truth) scoreTruth(msg.truth);
  const t = performance.now() / 1000;
  if (charts) {
    charts.exit.push(t, [msg.exit, msg.horizon, msg.deadline_met ? 0 : 1]);
    charts.conf.push(t, [msg.raw.confidence, msg.smoothed.confidence]);
    charts.budget.push(t, [Math.max(0, msg.budget.compute_ms), msg.costs.actual_ms, msg.latency_ms]);
  }
  showResult(msg);
  if (!edge.videoBack || edge.picture === "camera") {
    if (edge.matcher) edge.matcher.draw(msg, edge.numExits, probe ? probe.stampOf : null);
    else drawOverlay($("overlay"), $("video"), msg, edge.numExits);  // a watched camera's results, no local frames
    edge.overlayDrawn += 1;
  }
}

// The server asks for fewer bits on the way in when this browser's frames queue up (and for more once calm):
// {"type": "uplink", "max_bitrate_bps", "scale_down", "max_fps"}, applied to the camera's sender.
async function applyUplink(msg) {
  edge.uplink = msg;
  for (const sender of edge.pc ? edge.pc.getSenders() : []) {
    if (!sender.track || sender.track.kind !== "video") continue;
    const p = sender.getParameters();
    if (!p.encodings || !p.encodings.length) p.encodings = [{}];
    p.encodings[0].scaleResolutionDownBy = msg.scale_down;
    p.encodings[0].maxFramerate = msg.max_fps;
    if (msg.max_bitrate_bps === null) {  // no cap: the browser keeps the frame rate, and may send smaller frames
      delete p.encodings[0].maxBitrate;
      p.degradationPreference = "maintain-framerate";
    } else {  // the server chose the size (never under what the model needs): fewer frames, not smaller ones
      p.encodings[0].maxBitrate = msg.max_bitrate_bps;
      p.degradationPreference = "maintain-resolution";
    }
    try { await sender.setParameters(p); edge.uplinkApplied += 1; } catch (err) { console.warn("setParameters", err); }
  }
}

// A watched camera's state, as the server reports it: {"type": "source", "camera", "state", "reason"}.
function showSource(msg) {
  edge.sourceState = msg;
  const el = $("source-state");
  el.hidden = msg.state === "streaming";
  el.textContent = `camera ${msg.camera}: ${msg.state}` + (msg.reason ? ` (${msg.reason})` : "");
}

let lastShown = 0;
function showResult(m) {
  const now = performance.now();
  if (now - lastShown < 100) return;  // numbers at 10 Hz are readable; the charts get every frame
  lastShown = now;
  $("label").textContent = m.smoothed.label;
  $("confidence").textContent = `${(100 * m.smoothed.confidence).toFixed(0)} %`;
  $("exit").textContent = m.unchanged ? "0: the last answer (the picture did not change)"
    : m.reused ? "none: answer reused (even exit 1 would be late)"
    : `${m.exit} of ${edge.numExits} (ran ${m.exits_run}, allowed ${m.horizon})`;
  $("rtt").textContent = `${m.network.rtt_ms.toFixed(1)} ms` + (m.network.rtt_from_prior ? " (prior)" : ` (${m.rtt_source})`);
  $("bitrate").textContent = `${(m.network.bitrate_bps / 1000).toFixed(0)} kbit/s` + (m.network.bitrate_from_prior ? " (prior)" : "");
  $("budget").textContent = `${m.budget.compute_ms.toFixed(0)} ms of ${m.budget.total_ms.toFixed(0)} ms`;
  $("latency").textContent = `${m.latency_ms.toFixed(1)} ms`;
  $("misses").textContent = `${edge.misses} of ${edge.results}`;
  $("exits-hist").textContent = `exit 0: ${edge.unchanged} · ` +
    edge.exitCounts.map((n, i) => `exit ${i + 1}: ${n}`).join(" · ") + ` · reused: ${edge.reused}`;
}

async function pollStats() {
  const pc = edge.pc;
  if (!pc || pc.connectionState !== "connected") return;
  const stats = await pc.getStats();
  let rtt = null, rate = null, recv = null;
  stats.forEach((s) => {
    if (s.type === "remote-inbound-rtp" && s.kind === "video" && s.roundTripTime !== undefined) rtt = 1000 * s.roundTripTime;
    if (s.type === "candidate-pair" && s.nominated && s.currentRoundTripTime !== undefined && rtt === null) rtt = 1000 * s.currentRoundTripTime;
    if (s.type === "inbound-rtp" && s.kind === "video") { edge.framesDecoded = s.framesDecoded || 0; edge.videoFps = s.framesPerSecond ?? null; }
    if (s.type === "outbound-rtp" && s.kind === "video" && edge.probe) {
      edge.probe.stats.push([probe.wallMs(), edge.probe.count, s.framesEncoded || 0, s.framesSent || 0]);
    }
  });
  edge.browserRttMs = rtt;
  if (edge.matcher) edge.matcher.rtt(rtt);
  const m = edge.lastResult;
  if (m) { rate = m.network.bitrate_bps; recv = edge.lastDetail ? edge.lastDetail.receive_estimate_bps : null; }
  const t = performance.now() / 1000;
  if (charts) {
    charts.rtt.push(t, [m ? m.network.rtt_ms : null, rtt]);
    charts.rate.push(t, [rate, recv]);
  }
  $("browser-rtt").textContent = rtt === null ? "–" : `${rtt.toFixed(1)} ms`;
  const what = { camera: " · the camera's own picture, analysis drawn here", annotated: " · analysis drawn in" };
  $("fps").textContent = (edge.videoFps === null ? "–" : `${edge.videoFps.toFixed(0)} fps`) + (what[edge.picture] || "");
  if (probe) {
    const l = probe.probeLatencies(edge.probe), f = (v) => (v === null ? "–" : `${v.toFixed(0)}`);
    $("g2g").textContent = `result ${f(l.result_p50)} / ${f(l.result_p95)} ms, display ${f(l.display_p50)} / ${f(l.display_p95)} ms (p50 / p95)`;
  }
}

// One line per camera, from the keys every source kind reports (streams/source.py STATUS_KEYS); what only some
// kinds add (an RTSP camera's last error, a labelled source's live accuracy) is read only when it is there.
function cameraLine(c) {
  const how = c.transport_in_use ? ` over ${String(c.transport_in_use).toUpperCase()}` : "";
  const acc = c.live_accuracy;
  return `${c.name}: ${c.state}${how}` + (Array.isArray(c.resolution) ? ` ${c.resolution.join("×")}` : "") +
    `, ${c.frames_analysed ?? 0} frames analysed, ${c.reconnects ?? 0} reconnects` +
    (c.last_error ? ` (last error: ${c.last_error})` : "") +
    (acc ? `; live accuracy raw ${(100 * acc.raw).toFixed(1)} %, smoothed ${(100 * acc.smoothed).toFixed(1)} % ` +
      `(${acc.frames} frames)` : "");
}

function showStatus(s) {
  fillSources(s);
  const m = s.model;
  if (!charts) makeCharts(m.num_exits);
  $("model-line").textContent = `${m.name} on ${m.providers[0].replace("ExecutionProvider", "")} · ` +
    m.exits.map((e) => `${e.name} ${(100 * e.test_accuracy).toFixed(1)} % @ ${e.cost_median_ms.toFixed(2)} ms`).join(" · ");
  $("model-line").className = m.device === "cpu" ? "warn" : "";
  $("cameras").replaceChildren(...(s.cameras.length ? s.cameras : [null]).map((c) => {
    const li = document.createElement("li");
    li.textContent = c === null ? "no cameras configured ([[cameras]] in config.toml)" : cameraLine(c);
    li.className = c && c.state !== "streaming" ? "warn" : "";
    return li;
  }));
}

// The health pill says whether the server answers; what the page makes of the answer is its own business: a
// mistake there goes to the console (the tests collect it), never to the user as "unreachable".
async function refreshStatus() {
  let s;
  try {
    s = await loadStatus();
  } catch (err) {
    $("health").textContent = err instanceof TypeError ? "server unreachable" : String(err.message || err);
    $("health").className = "pill bad";
    return;
  }
  $("health").textContent = `${s.sessions.length} session(s)`; $("health").className = "pill ok";
  try { showStatus(s); } catch (err) { console.error("the page could not show /status:", err); }
}

// A labelled source (the demo camera) says what each frame shows: live accuracy of the raw and smoothed answers.
function scoreTruth(t) {
  const s = edge.truth = edge.truth || { frames: 0, raw: 0, rawFrames: 0, smoothed: 0 };
  s.frames += 1; s.smoothed += t.smoothed_correct ? 1 : 0;
  if (t.raw_correct !== null) { s.rawFrames += 1; s.raw += t.raw_correct ? 1 : 0; }
  $("accuracy-row").hidden = false;
  $("accuracy").textContent = `raw ${(100 * s.raw / Math.max(1, s.rawFrames)).toFixed(1)} % · smoothed ` +
    `${(100 * s.smoothed / s.frames).toFixed(1)} % of ${s.frames} frames (this frame: ${t.label})`;
}

// The server swapped its model (deployed from the page, or rolled back): new classes, maybe another number of
// exits; the charts and counts start again for it.
function modelChanged(msg) {
  edge.model = msg;
  edge.models += 1;
  charts = null;
  for (const id of ["chart-exit", "chart-conf", "chart-budget", "chart-rtt", "chart-rate"]) {
    const c = $(id); c.getContext("2d").clearRect(0, 0, c.width, c.height);
  }
  makeCharts(msg.num_exits);
  edge.reused = 0;
  edge.unchanged = 0;
  edge.truth = null;  // accuracy starts again for the new model
  refreshStatus();
  if (teach) teach.refresh();
}

// A viewer's token (GET /api/role) may watch and read events, not teach or delete: the page hides those.
async function whoAmI() {
  try { const r = await api("/api/role"); return r.ok ? (await r.json()).role : "operator"; } catch { return "operator"; }
}
// Never awaited here: the page must be live (Connect wired) at once, whatever the network does to this request.
edge.roleKnown = whoAmI().then((role) => {
  edge.role = role;
  document.body.classList.toggle("viewer", role === "viewer");
  return role;
});
const teach = initTeach(api, edge);
initEvents(api, edge);
$("connect").onclick = connect;
$("source").addEventListener("change", () => { $("model-pick").hidden = (edge.modelNames || []).length < 2 || Boolean($("source").value); });
$("video-back").checked = params.get("video") === "1";
if (probe) { probe.watchDisplay($("video"), edge.probe); $("g2g-row").hidden = false; }
$("disconnect").onclick = disconnect;
setState("idle");
refreshStatus();
setInterval(refreshStatus, 2000);
setInterval(pollStats, 1000);
