"""A crypt volume on RBD images (a real throwaway cluster): a batch's requests are in
flight on the OSD together, each fails alone, and the ciphertext is what any store gets."""

from __future__ import annotations

import threading
import time
import uuid
from collections.abc import Iterator, Sequence

import pytest

from app.errors import Fenced
from app.io.ops import Io
from app.storage.base import Wait
from app.storage.memory import MemoryStore
from app.storage.rbd import CephCluster, RbdStore
from tests.support import ceph
from tests.support.keys import XTS_KEY
from tests.support.volumes import make_volume

pytestmark = pytest.mark.ceph

SIZE = 1 << 20
SECTORS = SIZE // 512


class CountingRbdStore(RbdStore):
    """Counts the reads it has put on the cluster (``aio_read`` returned)."""

    submitted = 0

    def submit_readv(self, offset: int, buffers: Sequence[memoryview]) -> Wait:
        wait = super().submit_readv(offset, buffers)
        self.submitted += 1
        return wait


def crypt_line(start: int, device: str) -> str:
    return f"{start} {SECTORS} crypt aes-xts-plain64 {XTS_KEY} 0 {device} 0"


@pytest.fixture
def images(ceph_cluster: ceph.Cluster) -> Iterator[list[str]]:
    """Two fresh image names; whatever the test left under them is removed."""
    names = [f"t-{uuid.uuid4().hex[:12]}" for _ in range(2)]
    yield names
    for name in names:
        if name in ceph_cluster.images():
            ceph_cluster.run("rbd", "rm", f"{ceph.POOL}/{name}")


@pytest.fixture
def connection(ceph_cluster: ceph.Cluster) -> Iterator[CephCluster]:
    cluster = CephCluster(ceph_cluster.conf)
    yield cluster
    cluster.close()


def test_the_reads_of_one_batch_are_on_the_osd_together(
    ceph_cluster: ceph.Cluster, connection: CephCluster, images: list[str]
) -> None:
    """With the OSD stopped no read can complete: a dispatcher that waits for each before
    starting the next puts one on the cluster, one that overlaps them puts all."""
    count = 16
    pattern = bytes(range(256)) * (count * 32)  # count x 8 KiB
    writer = RbdStore(connection.ioctx(ceph.POOL), images[0], SIZE, create=True)
    volume = make_volume({"pv": writer}, crypt_line(0, "pv"))
    volume.write(0, pattern)
    volume.remove()
    writer.close()  # a new handle below: nothing is served from this one's cache
    store = CountingRbdStore(connection.ioctx(ceph.POOL), images[0], SIZE)
    volume = make_volume({"pv": store}, crypt_line(0, "pv"))
    ios = [Io.read(index * 8192, memoryview(bytearray(4096))) for index in range(count)]
    reader = threading.Thread(target=volume.submit_batch, args=(ios,))
    try:
        with ceph_cluster.osd_paused():
            reader.start()
            deadline = time.monotonic() + 10
            while store.submitted < count and time.monotonic() < deadline:
                time.sleep(0.01)
            on_the_cluster = store.submitted
        reader.join(30)
        assert on_the_cluster == count
        for index, io in enumerate(ios):
            assert io.error is None
            assert io.buffer == pattern[index * 8192 : index * 8192 + 4096]
    finally:
        volume.remove()
        store.close()


def test_a_fenced_image_fails_only_its_requests_of_a_batch(
    ceph_cluster: ceph.Cluster, images: list[str]
) -> None:
    """One volume over two images, the first reached through a connection another node
    has fenced: in one batch, the first image's requests raise ``Fenced`` and land
    nothing; the second image's complete."""
    fenced, healthy, taker = (CephCluster(ceph_cluster.conf) for _ in range(3))
    first = RbdStore(fenced.ioctx(ceph.POOL), images[0], SIZE, create=True, cluster=fenced)
    second = RbdStore(healthy.ioctx(ceph.POOL), images[1], SIZE, create=True)
    volume = make_volume(
        {"a": first, "b": second}, f"{crypt_line(0, 'a')}\n{crypt_line(SECTORS, 'b')}"
    )
    try:
        volume.write(0, b"o" * 8192)
        first.claim()
        before = ceph_cluster.export(images[0])
        owner = RbdStore(taker.ioctx(ceph.POOL), images[0], SIZE)
        owner.claim(take_over=True)
        owner.close()
        ios = [
            Io.write(0, memoryview(b"x" * 4096)),
            Io.write(SIZE, memoryview(b"y" * 4096)),
            Io.write(8192, memoryview(b"x" * 4096), fua=True),
            Io.write(SIZE + 8192, memoryview(b"z" * 4096), fua=True),
        ]
        volume.submit_batch(ios)
        assert [type(io.error) for io in ios] == [Fenced, type(None), Fenced, type(None)]
        assert fenced.blocklisted
        assert ceph_cluster.export(images[0]) == before
        assert volume.read(SIZE, 4096) == b"y" * 4096
        assert volume.read(SIZE + 8192, 4096) == b"z" * 4096
    finally:
        volume.remove()
        first.close()
        second.close()
        for cluster in (fenced, healthy, taker):
            cluster.close()


def test_the_image_holds_the_ciphertext_a_memory_store_gets(
    ceph_cluster: ceph.Cluster, connection: CephCluster, images: list[str]
) -> None:
    """The same batches, overlapping and FUA writes among them, and a partial write,
    on an RBD image and on memory: byte for byte the same device."""
    rbd_store = RbdStore(connection.ioctx(ceph.POOL), images[0], SIZE, create=True)
    memory = MemoryStore(SIZE)
    for store in (rbd_store, memory):
        volume = make_volume({"pv": store}, crypt_line(0, "pv"))
        volume.submit_batch(
            [Io.write(4096 * index, memoryview(bytes([index + 1]) * 4096)) for index in range(32)]
        )
        volume.submit_batch(
            [
                Io.write(0, memoryview(b"a" * 16384)),
                Io.write(8192, memoryview(b"b" * 4096), fua=True),
                Io.write(65536, memoryview(b"c" * 4096)),
            ]
        )
        volume.write(100, b"partial")
        volume.flush()
        volume.remove()
    rbd_store.close()
    assert ceph_cluster.export(images[0])[:SIZE] == bytes(memory.read(0, SIZE))
