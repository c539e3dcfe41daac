"""Where a request for a volume goes on a cluster node: the decisions, apart from HTTP.

For ``/v1/volumes/{name}…`` when ``name`` is not a volume this node serves, the owner
is looked up in SQL (off the data path: a served volume costs one dict lookup, in the
middleware, before anything here) and:

- the data path (``/data``, ``/flush``, ``/discard``, ``/write-zeroes``) goes to the
  owner as REQCRYPT_CLUSTER_DATA_PATH says: ``redirect`` (307 to the owner's URL; the
  bytes then flow client → owner once, but the client must send its token again to
  another origin) or ``proxy`` (streamed through this node, any client works);
- every control call (GET info/status/table, suspend, resume, load, message, PATCH,
  rename, DELETE, move…) is forwarded: a lifecycle change always runs on the owner, in
  its lock and its lease;
- ``POST /v1/volumes`` (create) goes to the least-loaded live node, or, when its table
  maps other volumes, to the node serving them (``app.cluster.placement``: 409 if they
  are served by different nodes).

A request already forwarded by another node is never passed on again (no loops): an
ownership change on the way answers 503, the caller retries. No owner alive (its lease
expired, failover pending) answers 503 too. A volume that does not exist is the local
route's to answer (404).
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Literal

from app.cluster.node import ClusterNode
from app.cluster.placement import SplitStack, stacked_home
from app.db.leases import Owner
from app.dm.table import TableLimits, parse_table
from app.errors import ReqcryptError

DATA_SUFFIXES = frozenset({"/data", "/flush", "/discard", "/write-zeroes"})


@dataclass(frozen=True, slots=True)
class Local:
    """This node answers (it serves the volume, or no such volume exists)."""


@dataclass(frozen=True, slots=True)
class Elsewhere:
    node: str
    url: str
    how: Literal["redirect", "proxy", "forward"]


@dataclass(frozen=True, slots=True)
class Refused:
    status: int
    detail: str


Route = Local | Elsewhere | Refused
LOCAL = Local()


class Router:
    """The routing decisions of one node; each may read SQL (run off the event loop)."""

    def __init__(
        self,
        cluster: ClusterNode,
        *,
        data_path: Literal["redirect", "proxy"],
        table_limits: TableLimits,
    ) -> None:
        self.cluster = cluster
        self.node = cluster.node
        self.data_path = data_path
        self.table_limits = table_limits

    def volume(self, name: str, suffix: str, *, forwarded: bool) -> Route:
        """A request for volume ``name`` (``suffix``: the path after it) not served here."""
        owner = self.cluster.leases.owner_of(name)
        if owner is None:
            return LOCAL
        if forwarded:
            return Refused(
                503,
                f"volume {name} is served by node {owner.node or '(none yet)'}, not this one: "
                "its owner changed while the request was forwarded; retry",
            )
        if not owner.live or owner.url is None or owner.node is None:
            return Refused(
                503,
                f"volume {name} has no live owner (node {owner.node or 'none'}); "
                "another node takes it over within a lease",
            )
        if owner.node == self.node:
            return Refused(503, f"volume {name} is being taken over by this node; retry")
        if suffix in DATA_SUFFIXES:
            return Elsewhere(owner.node, owner.url, self.data_path)
        return Elsewhere(owner.node, owner.url, "forward")

    def create(self, body: bytes) -> Route:
        """A create request (its JSON ``body``): where the new volume is placed."""
        lowers = self.mapped_volumes(body)
        known = {
            lower: owner
            for lower in lowers
            if (owner := self.cluster.leases.owner_of(lower)) is not None
        }
        if known:  # one that does not exist: the node creating the volume answers 404
            return self._stacked(known)
        target = self.cluster.place()
        if target is None or target.node == self.node:
            return LOCAL
        return Elsewhere(target.node, target.url, "forward")

    def _stacked(self, lowers: Mapping[str, Owner]) -> Route:
        try:
            owner = stacked_home(lowers)
        except SplitStack as split:
            return Refused(409, str(split))
        if owner.node == self.node and all(self.cluster.control.serves(name) for name in lowers):
            return LOCAL
        if (
            not all(lower.live for lower in lowers.values())
            or owner.url is None
            or owner.node is None
        ):
            return Refused(
                503,
                f"volume(s) {', '.join(lowers)} mapped by the table are failing over; a "
                "volume stacked on them is created on their next node: retry",
            )
        if owner.node == self.node:
            return Refused(
                503, f"volume(s) {', '.join(lowers)} are being taken over by this node; retry"
            )
        return Elsewhere(owner.node, owner.url, "forward")

    def mapped_volumes(self, body: bytes) -> list[str]:
        """The volumes a create request's table maps (none if it cannot be read: the node
        that creates the volume then says what is wrong with it)."""
        try:
            text = json.loads(body)["table"]
            table = parse_table(text, limits=self.table_limits)
        except (ValueError, KeyError, TypeError, ReqcryptError):
            return []
        return sorted(table.volume_names())
