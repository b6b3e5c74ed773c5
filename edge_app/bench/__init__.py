"""Benchmarks and offline tools (``edge-app bench-*``, ``evaluate``, ``codec-traces``), the network-impairment
harness, and the media kits they drive (labelled test video, RTSP test camera, results-channel peer, emulation of a
slower device).  The serve path never imports this package; the CLI imports each module only when its command runs.
"""
