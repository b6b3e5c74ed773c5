"""The base of every error the serve path raises on purpose (``ConfigError``, ``OfferRefused``, ``ListenError``,
the benchmarks' own): callers catch it by name and report it in words."""


class EdgeAppError(Exception):
    """An expected failure of edge_app, with a message a user can act on."""
