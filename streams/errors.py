"""The base of every error ``streams`` raises on purpose (``SlotClosed``, ``AiortcInternalsError``)."""


class StreamsError(Exception):
    """An expected failure or signal of the media edges."""
