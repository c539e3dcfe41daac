"""Benchmarks as a product feature: fio-like workloads, jobs, reports and plots.

Owns the workload vocabulary (``workload``), running it against a volume
in-process or over HTTP (``runner``), sweeps persisted as ``BenchmarkRun``
rows (``jobs``), tables/CSV/plots (``report``), built-in scenarios
(``scenarios``) and the ``reqcrypt bench`` command (``cli``). Imports the
core (``app.control``, ``app.dm``, ``app.engine``) and ``app.db``; never fastapi.
"""
