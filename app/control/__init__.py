"""The control plane: the devices and volumes this process serves, persisted then mirrored.

- ``lifecycle``: ``Control``, dmsetup's calls (create, load, suspend, resume, message,
  rename, remove, retune) under one lock, SQL first (ADR 0003);
- ``catalog``: the devices open here, one record per device;
- ``guard``: the ownership guard ``Control`` needs, and its single-node implementation
  (a cluster node's is ``app.cluster.serving``);
- ``restore``: every recorded volume rebuilt on start;
- ``recorded``: the read model of volumes as SQL records them (those other nodes serve).

It imports neither the web framework nor SQL (rows go through ``app.db.records``), and
nothing of ``app.cluster`` or ``app.api``.
"""

from app.control.lifecycle import Control

__all__ = ["Control"]
