"""Teach the model a user's scene from the page: capture frames into classes, train in a separate process,
deploy the result into the running server and roll it back (``edge_app.teach.api`` is the HTTP side)."""
