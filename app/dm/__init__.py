"""Device-mapper: the table grammar, targets and volume lifecycle.

Owns dmsetup semantics (parse/format tables, create/load/suspend/resume/remove).
Must not import fastapi or sqlalchemy: the API and the database sit above it.
The table grammar's names are imported from ``app.dm.table``, the one list of them.
"""
