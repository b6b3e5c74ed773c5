"""Network impairment harness and benchmark: namespaces, a trace-driven user-space bridge, a probing browser.

``trace``   the CSV trace format (pure parsing, no root needed)
``bridge``  the impairing L2 bridge that runs in the middle namespace (raw packet sockets + tbf)
``netns``   creates and tears down the three namespaces and their veth pairs
``driver``  headless Chromium in the client namespace with the probe client, writes per-frame records
``bench``   ``edge-app bench-network``: app, bridge and browser per policy; table and PNG time series
"""
