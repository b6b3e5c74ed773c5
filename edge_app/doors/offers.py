"""Signalling over HTTP: the page's JSON offer, and the standard doors, WHIP and WHEP.

* ``POST /offer``: JSON ``{"sdp", "type": "offer", "camera"?, "probe"?, "results"?, "video"?}`` answered in the
  same shape plus ``"session"`` (the page, aiortc's example client, scripts).
* ``POST /whip`` (RFC 9725): ``application/sdp`` offer of a sender (OBS, GStreamer, a WHIP web client) whose
  video is analysed; ``201 Created`` with the answer and ``Location: /sessions/ID``. A sender that opens a data
  channel gets results on it. Query: ``results=full``, ``probe=1``.
* ``POST /whep/{camera}`` (the WHEP draft): a player watches a camera; query ``video=camera`` asks for the camera's
  own H.264 where it can be forwarded (else annotated video).
* ``DELETE /sessions/ID`` ends either; ``PATCH`` (trickle ICE) answers 405: aiortc gathers its candidates before
  it answers and learns the peer's from its connectivity checks, as RFC 9725 allows.

Refusals: a wrong content type 415, a bad SDP 400 with the reason, an unknown camera 404, too many offers from one
client 429 with ``Retry-After``, the box full 503 with ``Retry-After``. Every outcome is counted in
``edge_offers_total``; the bearer token is checked before any of this (``edge_app.doors.access``).
"""

from __future__ import annotations

import logging
from typing import Literal

from aiohttp import web
from aiortc import RTCSessionDescription
from pydantic import BaseModel, ConfigDict, Field, ValidationError

from edge_app.appkeys import CONFIG_KEY, HUB_KEY, LIMITER_KEY, METRICS_KEY
from edge_app.doors.access import client_address
from edge_app.hub import OfferRefused
from edge_app.peer.session import Asked, PeerSession

log = logging.getLogger(__name__)

MAX_OFFER_BYTES = 64 * 1024
SDP = "application/sdp"


class Offer(BaseModel):
    """The body of ``POST /offer``. Keys it does not know are ignored (logged at debug): clients we did not
    write send their own (aiortc's example page: ``video_transform``)."""

    model_config = ConfigDict(extra="ignore", frozen=True)
    sdp: str = Field(min_length=1, max_length=MAX_OFFER_BYTES)
    type: str = Field(pattern="^offer$")
    camera: str | None = Field(None, max_length=64, description="watch this configured camera")
    probe: bool = Field(False, description="read the frame counter stamped in the left margin of each frame")
    results: Literal["compact", "full"] = Field("compact", description="compact results (a full one each second), "
                                                "or every field on every result")
    model: str | None = Field(None, pattern=r"^[A-Za-z0-9][A-Za-z0-9 _.-]{0,63}$", description="the model that "
                              "answers the browser's own camera (GET /api/models lists them); unset: the box's "
                              "default. A camera viewer sees the camera's own model")
    video: Literal["annotated", "camera"] = Field("annotated", description="a camera viewer's video: the analysis "
                                                  "drawn in (annotated), or the camera's own picture, forwarded "
                                                  "without a transcode where it can be, with the client drawing "
                                                  "the analysis from the results (camera)")


def json_error(status: int, reason: str, headers: dict[str, str] | None = None) -> web.Response:
    return web.json_response({"error": reason}, status=status, headers=headers)


def _refusal(request: web.Request, status: int, reason: str, headers: dict[str, str] | None = None,
             outcome: str | None = None) -> web.Response:
    request.app[METRICS_KEY].offers.labels(outcome or ("bad-request" if status in (400, 415) else
                                                       f"refused-{status}")).inc()
    return json_error(status, reason, headers)


def _limited(request: web.Request) -> web.Response | None:
    """429 for a client over ``max_offers_per_minute`` (before its body is even read)."""
    client = client_address(request, request.app[CONFIG_KEY].server.trusted_proxies)
    retry = request.app[LIMITER_KEY].check(client)
    if retry is None:
        return None
    limit = request.app[CONFIG_KEY].server.max_offers_per_minute
    return _refusal(request, 429, f"too many offers from {client}: at most {limit} a minute "
                                  f"([server] max_offers_per_minute); retry in {retry:.0f} s",
                    {"Retry-After": str(max(1, round(retry)))})


async def _session(request: web.Request, sdp: str, asked: Asked) -> tuple[PeerSession, RTCSessionDescription] | \
        web.Response:
    """The hub's answer; a refusal as the response to send."""
    client = client_address(request, request.app[CONFIG_KEY].server.trusted_proxies)
    try:
        session, answer = await request.app[HUB_KEY].create_session(RTCSessionDescription(sdp, "offer"), asked)
    except OfferRefused as exc:
        return _refusal(request, exc.status, exc.reason, {"Retry-After": "10"} if exc.status == 503 else None,
                        f"refused-{exc.status}")
    except Exception:
        request.app[METRICS_KEY].offers.labels("error").inc()
        log.exception("offer from %s: unexpected error", client)
        return json_error(500, "internal error answering the offer (the server log has the details)")
    request.app[METRICS_KEY].offers.labels("answered").inc()
    return session, answer


async def offer(request: web.Request) -> web.Response:
    """``POST /offer``: the page's JSON signalling (aiohttp's own refusals, a body over the limit, counted too)."""
    try:
        return await _json_offer(request)
    except web.HTTPException as exc:
        request.app[METRICS_KEY].offers.labels("bad-request" if 400 <= exc.status < 500 else
                                               f"error-{exc.status}").inc()
        raise


async def _json_offer(request: web.Request) -> web.Response:
    if (limited := _limited(request)) is not None:
        return limited
    if request.content_type != "application/json":
        return _refusal(request, 415, f"Content-Type must be application/json, not {request.content_type!r}")
    try:
        raw = await request.json()
        body = Offer.model_validate(raw)
    except RecursionError:
        return _refusal(request, 400, "invalid offer: the JSON is nested too deeply")
    except ValueError as exc:  # JSONDecodeError and pydantic's ValidationError are both ValueErrors
        request.app[METRICS_KEY].offers.labels("bad-request").inc()
        reason = exc.errors(include_url=False) if isinstance(exc, ValidationError) else f"body is not JSON: {exc}"
        return web.json_response({"error": "invalid offer", "details": reason}, status=400)
    if isinstance(raw, dict) and (unknown := sorted(set(raw) - set(Offer.model_fields))):
        log.debug("offer from %s: ignoring keys %s", request.remote, [k[:40] for k in unknown[:10]])
    if body.model is not None and body.camera is not None:
        return web.json_response({"error": "invalid offer", "details": "'model' chooses the model for the browser's "
                                  f"own camera; camera {body.camera!r} is answered by its own model"}, status=400)
    asked = Asked(body.camera, body.probe, body.results == "full", body.video, body.model)
    out = await _session(request, body.sdp, asked)
    if isinstance(out, web.Response):
        return out
    session, answer = out
    return web.json_response({"sdp": answer.sdp, "type": answer.type, "session": session.id})


async def _sdp_body(request: web.Request) -> str | web.Response:
    if request.content_type != SDP:
        return _refusal(request, 415, f"Content-Type must be {SDP}, not {request.content_type!r}")
    body = await request.read()
    if len(body) > MAX_OFFER_BYTES:
        return _refusal(request, 413, f"SDP offer over {MAX_OFFER_BYTES // 1024} KiB")
    try:
        text = body.decode()
    except UnicodeDecodeError:
        return _refusal(request, 400, "cannot use this SDP offer: not UTF-8 text")
    if not text.strip():
        return _refusal(request, 400, "cannot use this SDP offer: the body is empty")
    return text


async def _created(request: web.Request, asked: Asked) -> web.Response:
    if (limited := _limited(request)) is not None:
        return limited
    sdp = await _sdp_body(request)
    if isinstance(sdp, web.Response):
        return sdp
    out = await _session(request, sdp, asked)
    if isinstance(out, web.Response):
        return out
    session, answer = out
    return web.Response(status=201, text=answer.sdp, content_type=SDP,
                        headers={"Location": f"/sessions/{session.id}", "ETag": f'"{session.id}"'})


def _flag(request: web.Request, key: str) -> bool:
    return request.query.get(key, "").lower() in ("1", "true", "yes", "full")


async def whip(request: web.Request) -> web.Response:
    """``POST /whip``: a sender's camera, analysed."""
    return await _created(request, Asked(None, _flag(request, "probe"), _flag(request, "results")))


async def whep(request: web.Request) -> web.Response:
    """``POST /whep/{camera}``: a player watches a camera."""
    video = "camera" if request.query.get("video") == "camera" else "annotated"
    asked = Asked(request.match_info["camera"], _flag(request, "probe"), _flag(request, "results"), video)
    return await _created(request, asked)


async def end_session(request: web.Request) -> web.Response:
    """``DELETE /sessions/{id}``: the WHIP/WHEP client is done."""
    session = request.app[HUB_KEY].sessions.get(request.match_info["id"])
    if session is None:
        return json_error(404, f"no open session {request.match_info['id']!r}")
    await session.close("closed")
    return web.Response(status=200)


async def patch_session(request: web.Request) -> web.Response:
    """Trickle ICE and ICE restarts are not supported (RFC 9725 section 4.3: 405)."""
    if request.match_info["id"] not in request.app[HUB_KEY].sessions:
        return json_error(404, f"no open session {request.match_info['id']!r}")
    return json_error(405, "trickle ICE is not supported: the answer carries every candidate of this server",
                      {"Allow": "DELETE"})


def add_routes(app: web.Application) -> None:
    app.router.add_post("/offer", offer)
    app.router.add_post("/whip", whip)
    app.router.add_post("/whep/{camera}", whep)
    app.router.add_delete("/sessions/{id}", end_session)
    app.router.add_patch("/sessions/{id}", patch_session)
