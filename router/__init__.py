"""gpurouter: the data plane of gpufleet.

Its rooms, from the bottom up (tests/router/test_layers.py holds each to importing only the
rooms below it):

- `protocol`: the HTTP wire: readers, body scan, error bodies, answer sinks;
- `load`: engine load, read off each engine's own /metrics;
- `control`: routes and reports: the control planes followed, route table, resolvers, reports;
- `tenancy`: tenants, their limits and this router's shares of them;
- `telemetry`: metrics and traces;
- `path`: the request path, from accept to the relayed answer.

Above them, the process: `server` (one worker's loop and its background tasks), `main` (the
command line, workers), `listen` and `sdnotify`. `compiled` is below everything: it picks each
compiled module or its pure-Python twin.
"""

from router.compiled import install_switch

install_switch()
