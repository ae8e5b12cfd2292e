"""HTTP API v1: the app and its middlewares (app.py), handlers (handlers.py), answers
(answers.py), the enqueue body's decoding (enqueue_body.py), query parameters (params.py),
forwarding (proxy.py), the OpenAPI document and the VirtualQueues compatibility routes."""
