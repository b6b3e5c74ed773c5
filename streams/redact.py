"""Secrets never leave the process: the one place that hides them.

* ``redact_url(url)``: ``rtsp://user:password@host/x`` -> ``rtsp://user:***@host/x`` (a user name alone is kept:
  it helps an operator and is no secret; a query string's ``password=``/``token=``-like values are hidden too).
* ``redact(text)``: the same for every URL inside a free text (an FFmpeg error, an exception message), and every
  secret registered with ``add_secret`` (a camera password as FFmpeg may print it, percent-decoded; the bearer
  token) replaced by ``***`` wherever it appears.
* ``RedactingFilter``: a ``logging.Filter`` that passes every record's message through ``redact``; the CLI puts it
  on its handlers, so even a message formatted elsewhere (a library's) cannot print a secret.

Call sites that build text from a camera URL or an error use ``redact``/``redact_url`` directly (``/status``, the
page, data-channel messages, metrics labels); the filter is the second line of defence for logs.
"""

from __future__ import annotations

import logging
import re
import threading
from urllib.parse import parse_qsl, unquote, urlencode, urlsplit, urlunsplit

MASK = "***"
_SECRET_QUERY_KEYS = re.compile(r"pass|pwd|token|secret|key|auth|sig", re.IGNORECASE)
# scheme://userinfo@ where userinfo has a ':' (user:password); the password may hold anything but '@', '/' or space
_URL_CREDENTIALS = re.compile(r"(?P<scheme>[A-Za-z][A-Za-z0-9+.-]*://)(?P<user>[^:@/\s]*):(?P<password>[^@/\s]+)@")
_SECRET_QUERY = re.compile(r"(?P<key>[?&][^=&\s]*(?:pass|pwd|token|secret|key|auth|sig)[^=&\s]*=)(?P<value>[^&\s#]+)",
                           re.IGNORECASE)

_lock = threading.Lock()
_secrets: set[str] = set()
MIN_SECRET_CHARS = 3  # shorter strings would mask ordinary words; URL-shaped passwords are masked by pattern anyway


def add_secret(secret: str | None) -> None:
    """Mask ``secret`` (and its percent-decoded form) wherever ``redact`` sees it from now on."""
    if not secret or len(secret) < MIN_SECRET_CHARS:
        return
    with _lock:
        _secrets.add(secret)
        decoded = unquote(secret)
        if len(decoded) >= MIN_SECRET_CHARS:
            _secrets.add(decoded)


def add_url_secrets(url: str) -> None:
    """Register the password and secret-looking query values of ``url`` with ``add_secret``."""
    try:
        parts = urlsplit(url)
    except ValueError:
        return
    add_secret(parts.password)
    for key, value in parse_qsl(parts.query, keep_blank_values=False):
        if _SECRET_QUERY_KEYS.search(key):
            add_secret(value)


def redact_url(url: str) -> str:
    """``url`` with its password and secret-looking query values replaced by ``***``."""
    try:
        parts = urlsplit(url)
        netloc = parts.netloc
        if parts.password is not None:
            host = netloc.rpartition("@")[2]
            netloc = f"{parts.username or ''}:{MASK}@{host}"
        query = parts.query
        if query:
            pairs = parse_qsl(query, keep_blank_values=True)
            query = urlencode([(k, MASK if _SECRET_QUERY_KEYS.search(k) else v) for k, v in pairs], safe="*")
        return urlunsplit((parts.scheme, netloc, parts.path, query, parts.fragment))
    except ValueError:
        return redact(url)


def redact(text: str) -> str:
    """``text`` with URL credentials, secret query values and every registered secret masked."""
    out = _URL_CREDENTIALS.sub(lambda m: f"{m['scheme']}{m['user']}:{MASK}@", text)
    out = _SECRET_QUERY.sub(lambda m: f"{m['key']}{MASK}", out)
    with _lock:
        secrets = sorted(_secrets, key=len, reverse=True)  # longest first: a secret inside another is not half-masked
    for s in secrets:
        if s in out:
            out = out.replace(s, MASK)
    return out


class RedactingFilter(logging.Filter):
    """Rewrites each record's message (arguments merged in) through ``redact``; exceptions' text too."""

    def filter(self, record: logging.LogRecord) -> bool:
        try:
            message = record.getMessage()
        except (TypeError, ValueError):
            return True
        clean = redact(message)
        if clean != message:
            record.msg, record.args = clean, None
        if record.exc_info and record.exc_info[1] is not None and not record.exc_text:
            # formatters print exc_text when it is set: the traceback, redacted, stands in for the exception
            record.exc_text = redact(logging.Formatter().formatException(record.exc_info))
        return True
