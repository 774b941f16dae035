"""Pure decisions over one snapshot and a clock: placement, making room, autoscaling, sleep,
adapters, tenants' shares, heartbeat pacing, and the view a tick's steps read.

A rule returns a plan or a verdict and changes nothing; it is property-tested without a
network. Imports only `vocabulary`.
"""
