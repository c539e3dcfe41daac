"""Prometheus metrics, one registry per app so several apps (tests) never collide."""

from __future__ import annotations

import random
import time
from collections.abc import Awaitable, Callable, Iterable, Iterator, MutableMapping
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from prometheus_client import CollectorRegistry, Counter, Histogram
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric
from prometheus_client.registry import Collector

if TYPE_CHECKING:
    from app.cluster import ClusterNode
    from app.control import Control
    from app.io.budget import ByteBudget
    from app.nbd.server import NbdServer

Scope = MutableMapping[str, Any]
Message = MutableMapping[str, Any]
Receive = Callable[[], Awaitable[Message]]
Send = Callable[[Message], Awaitable[None]]
ASGIApp = Callable[[Scope, Receive, Send], Awaitable[None]]


class HttpMetrics:
    def __init__(self, registry: CollectorRegistry) -> None:
        self.requests = Counter(
            "reqcrypt_http_requests",
            "HTTP requests by route template, method and status",
            ["method", "route", "status"],
            registry=registry,
        )
        self.latency = Histogram(
            "reqcrypt_http_request_duration_seconds",
            "HTTP request latency by route template",
            ["method", "route"],
            registry=registry,
            buckets=(
                0.0005,
                0.001,
                0.0025,
                0.005,
                0.01,
                0.025,
                0.05,
                0.1,
                0.25,
                0.5,
                1,
                2.5,
                5,
                10,
            ),
        )
        self._children: dict[tuple[str, str, int], tuple[Counter, Histogram]] = {}

    def record(self, method: str, route: str, status: int, seconds: float) -> None:
        """Count one request. Each (method, route, status) looks its labelled series up once:
        ``labels()`` costs a dozen Python calls, on the event loop, on every request."""
        key = (method, route, status)
        series = self._children.get(key)
        if series is None:
            series = self._children[key] = (
                self.requests.labels(method, route, str(status)),
                self.latency.labels(method, route),
            )
        series[0].inc()
        series[1].observe(seconds)


class RequestContextMiddleware:
    """Pure ASGI (no BaseHTTPMiddleware) so streamed bodies pass untouched.

    Gives every request an id (``X-Request-ID``, taken from the client when it is
    sane) and records per-route counters and latency.
    """

    def __init__(self, app: ASGIApp, metrics: HttpMetrics) -> None:
        self.app = app
        self.metrics = metrics

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        request_id = _client_request_id(scope) or _new_request_id()
        scope.setdefault("state", {})["request_id"] = request_id
        status = 500
        started = time.perf_counter()

        async def send_with_id(message: Message) -> None:
            nonlocal status
            if message["type"] == "http.response.start":
                status = message["status"]
                headers = list(message.get("headers", []))
                for key, _ in headers:
                    if key.lower() == b"x-request-id":
                        break
                else:
                    headers.append((b"x-request-id", request_id.encode()))
                message["headers"] = headers
            await send(message)

        try:
            await self.app(scope, receive, send_with_id)
        finally:
            route = scope.get("route")
            template = getattr(route, "path", None) or "unmatched"
            self.metrics.record(
                scope.get("method", ""), template, status, time.perf_counter() - started
            )


_ids = random.Random()  # seeded once from os.urandom


def _new_request_id() -> str:
    """128 random bits without a syscall per request: ``uuid4`` reads os.urandom, which
    releases the GIL on the event loop and hands it to a waiting I/O worker mid-request."""
    return f"{_ids.getrandbits(128):032x}"


def _client_request_id(scope: Scope) -> str | None:
    for key, value in scope.get("headers", []):
        if key == b"x-request-id":
            text: str = value.decode("latin-1")
            if 0 < len(text) <= 64 and all(c.isalnum() or c in "-_." for c in text):
                return text
    return None


@dataclass(eq=False)
class ScrapeCollector(Collector):
    """Families that ``read`` builds at scrape time from counters the service already
    keeps, so scraping adds nothing to the hot path."""

    read: Callable[[], Iterable[Metric]]

    def collect(self) -> Iterator[Metric]:
        yield from self.read()


def volume_metrics(control: Control) -> Iterator[Metric]:
    """Per-volume queue statistics and per-engine call counts."""
    counters = {
        key: CounterMetricFamily(f"reqcrypt_volume_{key}", help_text, labels=["volume", "group"])
        for key, help_text in (
            ("ios", "completed requests by group (r, w, d, f)"),
            ("bios", "bios submitted by group"),
            ("merges", "bios merged into an existing request by group"),
            ("sectors", "sectors transferred by group"),
        )
    }
    engine_calls = CounterMetricFamily(
        "reqcrypt_volume_engine_calls", "crypto engine calls", labels=["volume"]
    )
    in_flight = GaugeMetricFamily(
        "reqcrypt_volume_in_flight", "requests in flight", labels=["volume"]
    )
    for name, volume in sorted(control.volumes.items()):
        stats = volume.stats.snapshot()
        for group in ("r", "w", "d", "f"):
            for key, family in counters.items():
                family.add_metric([name, group], stats[f"{group}_{key}"])
        engine_calls.add_metric([name], stats["engine_calls"])
        in_flight.add_metric([name], stats["in_flight"])
    yield from counters.values()
    yield engine_calls
    yield in_flight
    calls = CounterMetricFamily(
        "reqcrypt_engine_calls", "engine calls by kind", labels=["engine", "kind"]
    )
    busy = CounterMetricFamily(
        "reqcrypt_engine_busy_seconds", "modelled engine busy time", labels=["engine"]
    )
    for engine_name, snapshot in control.engines.snapshot()["engines"].items():
        for kind, count in snapshot["calls"].items():
            calls.add_metric([engine_name, kind], count)
        busy.add_metric([engine_name], snapshot.get("busy_ns", 0) / 1e9)
    yield calls
    yield busy


def budget_metrics(budget: ByteBudget) -> Iterator[Metric]:
    """Bytes held for clients (REQCRYPT_MAX_BUFFERED_BYTES): now, at most, and refusals."""
    yield GaugeMetricFamily(
        "reqcrypt_buffered_bytes", "bytes held for clients now", value=budget.held
    )
    yield GaugeMetricFamily(
        "reqcrypt_buffered_bytes_peak", "most bytes held for clients at once", value=budget.peak
    )
    yield GaugeMetricFamily(
        "reqcrypt_buffered_bytes_limit", "the budget of bytes held for clients", value=budget.limit
    )
    yield CounterMetricFamily(
        "reqcrypt_buffered_refusals",
        "requests answered 503 because the budget was spent",
        value=budget.refused,
    )


def nbd_metrics(server: NbdServer) -> Iterator[Metric]:
    """NBD requests, bytes and connections per exported volume."""
    requests = CounterMetricFamily(
        "reqcrypt_nbd_requests", "NBD requests answered", labels=["volume", "command"]
    )
    moved = CounterMetricFamily(
        "reqcrypt_nbd_bytes", "NBD payload bytes", labels=["volume", "direction"]
    )
    errors = CounterMetricFamily(
        "reqcrypt_nbd_errors", "NBD requests answered with an error", labels=["volume"]
    )
    connections = GaugeMetricFamily(
        "reqcrypt_nbd_connections", "open NBD connections", labels=["volume"]
    )
    for name, volume in sorted(server.control.volumes.items()):
        stats = server.stats.get(volume.uuid)
        if stats is None:
            continue
        for command, count in stats.requests.items():
            requests.add_metric([name, command], count)
        moved.add_metric([name, "read"], stats.read_bytes)
        moved.add_metric([name, "written"], stats.written_bytes)
        errors.add_metric([name], stats.errors)
        connections.add_metric([name], len(server.connections_of(volume)))
    yield requests
    yield moved
    yield errors
    yield connections
    yield GaugeMetricFamily(
        "reqcrypt_nbd_connections_open",
        "NBD connections open, negotiating ones included (REQCRYPT_NBD_MAX_CONNECTIONS)",
        value=len(server.connections),
    )
    yield CounterMetricFamily(
        "reqcrypt_nbd_connections_refused",
        "NBD connections closed at once: REQCRYPT_NBD_MAX_CONNECTIONS were open",
        value=server.refused,
    )
    yield CounterMetricFamily(
        "reqcrypt_nbd_send_timeouts",
        "NBD connections aborted: no reply taken for REQCRYPT_SEND_TIMEOUT_SECONDS",
        value=server.send_timeouts,
    )


def cluster_metrics(cluster: ClusterNode) -> Iterator[Metric]:
    """This node's leases: what it owns, how long each lease still runs, takeovers."""
    node = cluster.node
    serving = cluster.serving
    now = time.monotonic()
    owned = GaugeMetricFamily(
        "reqcrypt_node_volumes_owned", "volumes this node serves under a lease", labels=["node"]
    )
    pending = GaugeMetricFamily(
        "reqcrypt_node_volumes_pending",
        "leases taken whose devices a live previous holder still claims",
        labels=["node"],
    )
    remaining = GaugeMetricFamily(
        "reqcrypt_volume_lease_remaining_seconds",
        "until this node stops serving the volume unless the lease is renewed",
        labels=["volume", "node"],
    )
    epoch = GaugeMetricFamily(
        "reqcrypt_volume_lease_epoch",
        "the lease's epoch (takeovers)",
        labels=["volume", "node"],
    )
    holdings = sorted(dict(serving.held).values(), key=lambda holding: holding.volume.name)
    owned.add_metric([node], len(holdings))
    pending.add_metric([node], len(serving.pending))
    for holding in holdings:
        name = holding.volume.name
        remaining.add_metric([name, node], max(0.0, holding.deadline - now))
        epoch.add_metric([name, node], holding.lease.epoch)
    ready = GaugeMetricFamily(
        "reqcrypt_node_ready",
        "1: placement may choose this node; 0: its Ceph client is blocklisted (reconnecting)",
        labels=["node"],
    )
    ready.add_metric([node], 0 if cluster.blocklisted else 1)
    yield from (owned, pending, remaining, epoch, ready)
    stats = cluster.stats
    for key, help_text in (
        ("takeovers", "leases this node took (failover, move target, start)"),
        ("leases_lost", "volumes dropped because their lease was not renewed in time"),
        ("claims_blocked", "device claims refused by a live previous holder"),
        ("tick_failures", "lease ticks that failed (database unreachable...)"),
        ("rbd_fenced", "leases released because this node's Ceph client was blocklisted"),
        ("reconnects", "new Ceph connections made after a blocklisting"),
    ):
        family = CounterMetricFamily(f"reqcrypt_node_{key}", help_text, labels=["node"])
        family.add_metric([node], getattr(stats, key))
        yield family
