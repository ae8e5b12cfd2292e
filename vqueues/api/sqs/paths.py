"""The SQS API's routes: the endpoint's root, where SDKs post, and a queue URL's path
(`/{account}/{queue}`), where the query protocol and kombu post; POST, and GET for the query
protocol's parameters in the query string."""

SQS_PATHS = ("/", "/{account:[0-9]{12}}/{sqs_queue:[^/]+}")
# As aiohttp names the routes (their canonical form), for the middlewares.
SQS_ROUTES = ("/", "/{account}/{sqs_queue}")
# A call one node sends on to another carries the Host and scheme it was sent to (queue URLs
# and signatures are the caller's).
FORWARDED_HOST = "X-Forwarded-Host"
FORWARDED_PROTO = "X-Forwarded-Proto"
# A ListQueues one node sends on to another asks for the answer in JSON 1.0 whatever the
# caller's protocol, to merge it with its own (the query protocol's answers are XML).
ANSWER_JSON = "X-VQ-SQS-Answer-Json"
