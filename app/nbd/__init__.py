"""The NBD front end: volumes served over the Network Block Device protocol.

A second front end beside the HTTP API, on the same ``Volume`` objects (queue,
statistics, lifecycle, ciphertext). ``protocol`` is pure message packing and
checking; ``server`` is the asyncio server, which reaches volumes through ``io`` (one
batch API, one admission) and finds them through ``control``. Never imports ``api`` (a
sibling front end), FastAPI or SQL.
"""
