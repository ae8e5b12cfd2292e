"""The SQS API's routes (POST): the endpoint's root, where SDKs post, and a queue URL's path
(`/{account}/{queue}`), where the query protocol and kombu post."""

SQS_PATHS = ("/", "/{account:[0-9]{12}}/{sqs_queue:[^/]+}")
# As aiohttp names the routes (their canonical form), for the middlewares.
SQS_ROUTES = ("/", "/{account}/{sqs_queue}")
