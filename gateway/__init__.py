"""The inference gateway: a stable KServe v2 endpoint per app in front of the servers' Tritons.

Clients name the app (``POST /v2/models/{app_id}/infer``); the gateway routes each request to
the Triton model ``<app_id>__<variant>`` of the app's current serving replica, learnt from the
controller's event stream, and resends it when the app moves. See ``docs/gateway.md``.

Modules, one job each: ``config`` (settings), ``errors`` (what a client is told, and with which
status), ``routes`` (the routing table: events in, routes out; pure), ``board`` (the table for
asyncio: waiting for an app's next move), ``persist`` (the table on disk), ``follower`` (the
controller's event stream), ``upstream`` (pooled keep-alive HTTP to the Tritons), ``exchange``
(one request's attempts: resend on a move or a failure, hedging), ``queue`` (the per-app queue
and its dispatch policy), ``metrics``, ``dataplane`` (what the front ends call), ``http_api``
(the KServe v2 HTTP routes), ``http_server`` (the HTTP/1.1 server under them), ``service``
(wires it all and runs it).
"""
