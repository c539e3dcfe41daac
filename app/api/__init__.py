"""HTTP layer: thin routers over the core, problem+json, auth, and the ASGI adapter of the
cluster's routing (``ownership``: the decisions and the relay are ``app.cluster``'s). Only
this package imports FastAPI."""
