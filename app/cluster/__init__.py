"""Cluster ownership, in one home: several ``reqcrypt serve`` sharing PostgreSQL, each
volume served by the one node holding its lease.

- ``serving``: the serving set, this node's leases and claims; ``Control``'s guard;
- ``node``: the lease loop (heartbeat, renew, take, give up, move);
- ``placement``: the stack rule and least-loaded placement;
- ``routing``: where a request for a volume goes (served here, its owner, refused);
- ``relay``: forwarding a control call, proxying the data path, bounded by the owner's
  heartbeat.

SQL goes through ``app.db`` (leases, records); it imports no web framework and nothing
of ``app.api`` (the ASGI middleware there adapts ``routing`` and ``relay``).
"""

from app.cluster.node import ClusterNode

__all__ = ["ClusterNode"]
