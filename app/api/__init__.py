"""HTTP layer: thin routers over the core. Only this package imports FastAPI."""
