"""The base of every error the exporter raises on purpose (data, training, export, recovery, widening)."""


class ExporterError(Exception):
    """An expected failure of the exporter, with a message a user can act on."""
