"""Clients that load a cluster's volume and record every operation in a ``History``.

Each client is a thread with its own keep-alive connection to one entry node, following
307s to the owner (the token sent again on every hop). It writes unique payloads to
random blocks, reads blocks back and flushes, and records each operation's invocation and
outcome: 204/206 ok; a 4xx fail (refused before anything happened); anything else, a 5xx
or no answer, info (it may or may not have taken effect). After the faults heal,
``final_reads`` reads every block once more (``final``) for the lost-write rule.
"""

from __future__ import annotations

import random
import threading
import time
from collections.abc import Mapping
from dataclasses import dataclass

import httpx

from app.api.routes.data import LEASE_EPOCH
from tests.support.cluster import bearer_on_every_hop
from tests.support.history import History, Kind, Operation, Status
from tests.support.servers import HEADERS

BLOCK = 4096


@dataclass(frozen=True)
class Availability:
    """What the clients saw of the volume from the fault on: the longest stretch with no
    operation completing ok, and when a node other than ``before`` first acknowledged a
    write (None: none did)."""

    unavailable_s: float
    takeover_s: float | None


class ClusterLoad:
    """``processes`` clients over ``blocks`` blocks of volume ``name``; ``nodes`` maps each
    base URL a response may come from (a node's own, or the proxy it advertises) to its id."""

    def __init__(
        self,
        history: History,
        entries: list[str],
        nodes: Mapping[str, str],
        *,
        name: str = "v",
        blocks: int = 8,
        processes: int = 3,
        timeout: float = 3.0,
        seed: int = 0,
    ) -> None:
        self.history = history
        self.entries = entries
        self.nodes = dict(nodes)
        self.name = name
        self.blocks = blocks
        self.processes = processes
        self.timeout = timeout
        self._random = random.Random(seed)
        self._stop = threading.Event()
        self._threads: list[threading.Thread] = []

    def __enter__(self) -> ClusterLoad:
        self._prime()
        for process in range(self.processes):
            entry = self.entries[process % len(self.entries)]
            thread = threading.Thread(
                target=self._run,
                args=(process, entry, self._random.randrange(1 << 30)),
                name=f"load-{process}",
                daemon=True,
            )
            thread.start()
            self._threads.append(thread)
        return self

    def __exit__(self, *_: object) -> None:
        self._stop.set()
        for thread in self._threads:
            thread.join(timeout=self.timeout + 10)
            assert not thread.is_alive(), f"{thread.name} did not stop"

    def _client(self, entry: str) -> httpx.Client:
        return httpx.Client(
            base_url=entry,
            headers=HEADERS,
            timeout=self.timeout,
            follow_redirects=True,
            event_hooks={"request": [bearer_on_every_hop]},
        )

    def _node(self, response: httpx.Response) -> str | None:
        return self.nodes.get(f"{response.url.scheme}://{response.url.host}:{response.url.port}")

    def _run(self, process: int, entry: str, seed: int) -> None:
        choose = random.Random(seed)
        with self._client(entry) as client:
            while not self._stop.is_set():
                block = choose.randrange(self.blocks)
                roll = choose.random()
                if roll < 0.55:
                    self.write(client, process, block)
                elif roll < 0.9:
                    self.read(client, process, block)
                else:
                    self.flush(client, process)

    def _path(self, suffix: str) -> str:
        return f"/v1/volumes/{self.name}/{suffix}"

    def write(self, client: httpx.Client, process: int, block: int) -> Operation:
        payload = self.history.unique_payload(block, BLOCK)
        op = self.history.invoke(process, Kind.WRITE, volume=self.name, block=block, value=payload)
        offset = block * BLOCK
        try:
            response = client.put(
                self._path("data"),
                content=payload,
                headers={"Content-Range": f"bytes {offset}-{offset + BLOCK - 1}/*"},
            )
        except httpx.HTTPError:
            return self.history.info(op)
        return self._complete(op, response, 204)

    def read(
        self, client: httpx.Client, process: int | str, block: int, *, final: bool = False
    ) -> Operation:
        op = self.history.invoke(process, Kind.READ, volume=self.name, block=block, final=final)
        offset = block * BLOCK
        try:
            response = client.get(
                self._path("data"), headers={"Range": f"bytes={offset}-{offset + BLOCK - 1}"}
            )
        except httpx.HTTPError:
            return self.history.info(op)
        if response.status_code == 206:
            return self.history.ok(op, value=response.content, node=self._node(response))
        return self.history.fail(op, node=self._node(response))  # a read changes nothing

    def flush(self, client: httpx.Client, process: int) -> Operation:
        op = self.history.invoke(process, Kind.FLUSH, volume=self.name)
        try:
            response = client.post(self._path("flush"))
        except httpx.HTTPError:
            return self.history.info(op)
        return self._complete(op, response, 204)

    def _complete(self, op: Operation, response: httpx.Response, ok: int) -> Operation:
        node = self._node(response)
        if response.status_code == ok:
            epoch = response.headers.get(LEASE_EPOCH)
            return self.history.ok(op, node=node, epoch=None if epoch is None else int(epoch))
        if 400 <= response.status_code < 500:
            return self.history.fail(op, node=node)
        return self.history.info(op, node=node)

    def _prime(self) -> None:
        """Write every block once and flush, recorded: a block of an encrypted volume never
        written reads as the decryption of the device's zeros, not as zeros."""
        with self._client(self.entries[0]) as client:
            for block in range(self.blocks):
                assert self.write(client, -1, block).status is Status.OK
            assert self.flush(client, -1).status is Status.OK

    def final_reads(self, entry: str, settle: float = 30.0) -> None:
        """Read every block once the faults have healed, retrying until the volume answers."""
        with self._client(entry) as client:
            for block in range(self.blocks):
                deadline = time.monotonic() + settle
                while True:
                    done = self.read(client, "final", block, final=True)
                    if done.status is Status.OK:
                        break
                    assert time.monotonic() < deadline, f"block {block} unreadable after healing"
                    time.sleep(0.1)

    def availability(self, fault_ns: int, before: str | None) -> Availability:
        """Seen from the clients from ``fault_ns`` on (see ``Availability``)."""
        done = sorted(
            op.complete_ns
            for op in self.history.operations()
            if op.status is Status.OK and op.complete_ns is not None and op.complete_ns >= fault_ns
        )
        gaps = [b - a for a, b in zip([fault_ns, *done], done, strict=False)]
        takeover = min(
            (
                op.complete_ns - fault_ns
                for op in self.history.operations()
                if op.kind is Kind.WRITE
                and op.status is Status.OK
                and op.complete_ns is not None
                and op.complete_ns >= fault_ns
                and op.node not in (None, before)
            ),
            default=None,
        )
        return Availability(
            max(gaps, default=0) / 1e9, None if takeover is None else takeover / 1e9
        )
