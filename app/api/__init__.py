"""The HTTP front end: routes that parse requests (ranges, multipart bodies, JSON) and
shape answers over ``app.io`` (the data path) and ``app.control`` (the lifecycle),
problem+json, auth, request limits, and the ASGI adapter of the cluster's routing
(``ownership``: the decisions and the relay are ``app.cluster``'s). Only ``app.main``,
which builds the application, imports this package; nothing else imports FastAPI."""
