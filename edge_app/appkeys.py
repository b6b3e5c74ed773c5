"""The typed keys of what ``create_app`` keeps on the aiohttp application."""

from __future__ import annotations

from aiohttp import web

from edge_app.config import AppConfig
from edge_app.doors.access import OfferRateLimiter
from edge_app.hub import Hub
from edge_app.metrics import Metrics

CONFIG_KEY = web.AppKey("config", AppConfig)
STARTED_KEY = web.AppKey("started", float)
HUB_KEY = web.AppKey("hub", Hub)
METRICS_KEY = web.AppKey("metrics", Metrics)
LIMITER_KEY = web.AppKey("offer_limiter", OfferRateLimiter)
