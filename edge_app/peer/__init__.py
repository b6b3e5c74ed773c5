"""One browser peer, in rooms: lifecycle, network monitor, outbound video, data channel (``session`` joins them)."""
