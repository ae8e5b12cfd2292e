"""The SQS API's routes (POST): the endpoint's root, where SDKs post, and a queue URL's path
(`/{account}/{queue}`), where the query protocol and kombu post."""

SQS_PATHS = ("/", "/{account:[0-9]{12}}/{sqs_queue:[^/]+}")
# As aiohttp names the routes (their canonical form), for the middlewares.
SQS_ROUTES = ("/", "/{account}/{sqs_queue}")
# A call one node sends on to another carries the Host and scheme it was sent to (queue URLs
# and signatures are the caller's).
FORWARDED_HOST = "X-Forwarded-Host"
FORWARDED_PROTO = "X-Forwarded-Proto"
