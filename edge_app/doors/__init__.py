"""The HTTP doors: the server and its routes, offers (JSON, WHIP, WHEP), the answer plan (signalling), access
control, and the control process of serve --workers with what it forwards."""
