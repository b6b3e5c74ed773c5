// The data channel's messages, as the page reads them: the same checks as edge_app/protocol.py, proved on the same
// vectors (tests/protocol/vectors.json, in Chromium). parseMessage(text) returns the message object or throws an
// Error whose message says why. docs/protocol.md describes each message.

export const TYPES = ["result", "ping", "pong", "source", "uplink", "model", "video", "error"];

function field(obj, key, kind, optional = false) {
  const v = obj[key];
  if ((v === undefined || v === null) && optional) return null;
  const ok = kind === "int" ? Number.isInteger(v) : kind === "float" ? typeof v === "number" && Number.isFinite(v)
    : typeof v === kind;
  if (!ok) {
    const name = kind === "int" ? "an int" : kind === "float" ? "a float" : kind === "string" ? "a str" : "a bool";
    throw new Error(`'${obj.type}' message: '${key}' must be ${name}${optional ? " or null" : ""}`);
  }
  return v;
}

const CHECKS = {
  result(m) {
    if (typeof m.smoothed !== "object" || m.smoothed === null || Array.isArray(m.smoothed)) {
      throw new Error("'result' message: 'smoothed' must be an object");
    }
    field(m, "source", "string"); field(m, "frame", "int"); field(m, "exit", "int");
    field(m.smoothed, "label", "string"); field(m.smoothed, "confidence", "float");
    field(m, "deadline_met", "boolean"); field(m, "stamp", "int", true);
  },
  ping(m) { field(m, "id", "int"); field(m, "t", "float", true); },
  pong(m) { field(m, "id", "int", true); },
  source(m) { field(m, "camera", "string"); field(m, "state", "string"); field(m, "reason", "string", true); },
  uplink(m) { field(m, "max_bitrate_bps", "int", true); field(m, "scale_down", "float"); field(m, "max_fps", "float"); },
  model(m) {
    if (!Array.isArray(m.classes) || !m.classes.every((c) => typeof c === "string")) {
      throw new Error("'model' message: 'classes' must be a list of strings");
    }
    field(m, "name", "string"); field(m, "num_exits", "int");
  },
  video(m) {
    if (m.picture !== "camera" && m.picture !== "annotated") {
      throw new Error("'video' message: 'picture' must be 'camera' or 'annotated'");
    }
  },
  error(m) { field(m, "reason", "string"); },
};

export function parseMessage(text) {
  if (typeof text !== "string") throw new Error("messages are JSON text");
  let m;
  try { m = JSON.parse(text); } catch { throw new Error("not JSON"); }
  if (typeof m !== "object" || m === null || Array.isArray(m)) throw new Error("a message is a JSON object with a 'type'");
  const check = CHECKS[m.type];
  if (!check) throw new Error(`unknown message type ${JSON.stringify(m.type ?? null)}; expected one of ${TYPES.slice().sort()}`);
  check(m);
  return m;
}
