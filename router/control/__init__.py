"""Routes and reports: the control planes a router follows, the route table it is pushed,
the adapter resolvers and catalog, and the activity reports and prompt acks it sends back.

May import `router.protocol` and `router.load`.
"""
