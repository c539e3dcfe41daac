"""Client commands of ``reqcrypt`` that talk to a running service over its HTTP API.

Owns the command-line view only (arguments, output shapes, progress); it imports
nothing of the service's core, so the client runs wherever httpx does.
"""
