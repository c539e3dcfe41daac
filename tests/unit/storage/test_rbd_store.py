"""``RbdStore`` on a real (throwaway) Ceph cluster: the block device conformance suite, what
only an RBD image promises, and fencing between two clients of one image."""

from __future__ import annotations

import contextlib
import subprocess
import sys
import textwrap
import threading
import uuid
from collections.abc import Iterator

import pytest

from app.errors import AlreadyExists, DeviceBusy, DeviceClaimed, Fenced, InvalidInput
from app.storage.rbd import CephCluster, RbdStore, _Group
from tests.support import ceph
from tests.support.conformance import SIZE, BlockDeviceTests, read

pytestmark = pytest.mark.ceph


@pytest.fixture(scope="module")
def cluster(ceph_cluster: ceph.Cluster) -> Iterator[CephCluster]:
    connection = CephCluster(ceph_cluster.conf)
    yield connection
    connection.close()


@pytest.fixture
def image(ceph_cluster: ceph.Cluster) -> Iterator[str]:
    """A fresh image name; whatever the test left under it is removed."""
    name = f"t-{uuid.uuid4().hex[:12]}"
    yield name
    if name in ceph_cluster.images():
        ceph_cluster.run("rbd", "rm", f"{ceph.POOL}/{name}")


class TestRbdStore(BlockDeviceTests[RbdStore]):
    @pytest.fixture
    def device(self, cluster: CephCluster, image: str) -> Iterator[RbdStore]:
        store = RbdStore(cluster.ioctx(ceph.POOL), image, SIZE, create=True)
        yield store
        store.remove()

    def test_bytes_land_in_the_image(self, device: RbdStore, ceph_cluster: ceph.Cluster) -> None:
        device.writev(8192, [b"p" * 4096, b"q" * 512])
        device.flush()
        exported = ceph_cluster.export(device.image_name)
        assert exported[8192 : 8192 + 4608] == b"p" * 4096 + b"q" * 512

    def test_vectored_read_of_many_segments_fills_each(self, device: RbdStore) -> None:
        pattern = bytes(range(256)) * 256  # 64 KiB, every 512-byte sector distinct
        device.write(0, pattern)
        segments = [bytearray(512) for _ in range(128)]
        device.readv_into(0, [memoryview(segment) for segment in segments])
        assert b"".join(segments) == pattern

    def test_allocated_bytes_grow_with_writes(self, device: RbdStore) -> None:
        assert device.allocated_bytes() == 0
        device.write(0, b"a" * 4096)
        assert device.allocated_bytes() > 0

    def test_a_submitted_read_of_many_segments_fills_each(self, device: RbdStore) -> None:
        pattern = bytes(range(256)) * 256
        device.write(0, pattern)
        segments = [bytearray(512) for _ in range(128)]
        device.submit_readv(0, [memoryview(segment) for segment in segments])()
        assert b"".join(segments) == pattern

    def test_a_read_into_adjacent_slices_of_one_buffer_fills_each(self, device: RbdStore) -> None:
        """Adjacent segments go to librbd as one iovec entry; each still gets its bytes."""
        pattern = bytes(range(256)) * 64  # 16 KiB
        device.write(0, pattern)
        whole = bytearray(len(pattern))
        view = memoryview(whole)
        segments = [view[start : start + 512] for start in range(0, len(pattern), 512)]
        device.submit_readv(0, [*segments[:7], memoryview(bytearray(512)), *segments[8:]])()
        assert whole[: 7 * 512] == pattern[: 7 * 512]
        assert whole[8 * 512 :] == pattern[8 * 512 :]

    def test_one_segment_requests_land_where_vectored_ones_find_them(
        self, device: RbdStore
    ) -> None:
        """A one-segment request goes to librbd as a plain buffer, not an iovec array: its
        bytes are where a vectored request finds them, and the other way round."""
        pattern = bytes(range(256)) * 32  # 8 KiB
        device.submit_writev(4096, [pattern])()  # read-only
        halves = [bytearray(4096), bytearray(4096)]
        device.submit_readv(4096, [memoryview(half) for half in halves])()
        assert b"".join(halves) == pattern
        device.submit_writev(65536, [memoryview(bytearray(pattern[:4096])), pattern[4096:]])()
        whole = bytearray(8192)
        device.submit_readv(65536, [memoryview(whole)])()
        assert whole == pattern

    def test_remove_deletes_the_image(
        self, cluster: CephCluster, ceph_cluster: ceph.Cluster, image: str
    ) -> None:
        store = RbdStore(cluster.ioctx(ceph.POOL), image, SIZE, create=True)
        assert image in ceph_cluster.images()
        store.remove()
        assert image not in ceph_cluster.images()


class TestRbdStoreWithoutAio(BlockDeviceTests[RbdStore]):
    """``rbd_aio = false``: submissions are the synchronous calls, done when they return."""

    @pytest.fixture
    def device(self, cluster: CephCluster, image: str) -> Iterator[RbdStore]:
        store = RbdStore(cluster.ioctx(ceph.POOL), image, SIZE, create=True, aio=False)
        yield store
        store.remove()


def test_a_batch_waited_in_any_order_gives_each_request_its_own_result(
    cluster: CephCluster, image: str
) -> None:
    """A thread's submissions up to its first wait are one group: that wait sleeps for all of
    them, and each wait still ends with its own request done, whatever the order."""
    store = RbdStore(cluster.ioctx(ceph.POOL), image, SIZE, create=True)
    try:
        patterns = [bytes([index]) * 4096 for index in range(1, 17)]
        writes = [store.submit_writev(index * 8192, [p]) for index, p in enumerate(patterns)]
        for wait in reversed(writes):
            wait()
        buffers = [bytearray(4096) for _ in patterns]
        reads = [
            store.submit_readv(index * 8192, [memoryview(buffer)])
            for index, buffer in enumerate(buffers)
        ]
        for index in (5, 0, 15, 1, *range(2, 5), *range(6, 15)):
            reads[index]()
            assert buffers[index] == patterns[index]
    finally:
        store.remove()


def test_a_submitted_write_s_buffers_are_free_once_submitted(
    cluster: CephCluster, image: str
) -> None:
    """librbd copies a write's segments before ``submit_writev`` returns: the caller may
    overwrite them before the wait and the image still gets what was submitted."""
    store = RbdStore(cluster.ioctx(ceph.POOL), image, SIZE, create=True)
    try:
        segments = [bytearray(b"x" * 4096), bytearray(b"y" * 512)]
        wait = store.submit_writev(0, [memoryview(segment) for segment in segments])
        for segment in segments:
            segment[:] = b"!" * len(segment)
        wait()
        assert read(store, 0, 4608) == b"x" * 4096 + b"y" * 512
    finally:
        store.remove()


def test_a_request_waited_on_another_thread_and_one_submitted_after_a_wait(
    cluster: CephCluster, image: str
) -> None:
    store = RbdStore(cluster.ioctx(ceph.POOL), image, SIZE, create=True)
    try:
        first = store.submit_writev(0, [b"a" * 4096])
        waiter = threading.Thread(target=first)
        waiter.start()
        waiter.join(timeout=30)
        assert not waiter.is_alive()
        store.submit_writev(4096, [b"b" * 4096])()  # a new group: the first one was waited
        assert read(store, 0, 8192) == b"a" * 4096 + b"b" * 4096
    finally:
        store.remove()


def test_a_write_after_a_flush_is_done_only_once_the_osd_has_it(
    cluster: CephCluster, ceph_cluster: ceph.Cluster, image: str
) -> None:
    """librbd's default cache acknowledges writes before the OSD answers once it has seen a
    flush: a client fenced meanwhile would acknowledge a write that never lands."""
    store = RbdStore(cluster.ioctx(ceph.POOL), image, SIZE, create=True)
    try:
        store.write(0, b"a" * 4096)
        store.flush()
        with ceph_cluster.osd_paused():
            writing = threading.Thread(target=store.submit_writev(0, [b"b" * 4096]))
            writing.start()
            writing.join(timeout=1)
            assert writing.is_alive()
        writing.join(timeout=60)
        assert not writing.is_alive()
        assert read(store, 0, 4096) == b"b" * 4096
    finally:
        store.remove()


def test_a_request_joining_a_group_already_waited_for_waits_for_its_own_completion(
    cluster: CephCluster, image: str
) -> None:
    """Another thread may close a group between a submission's look-up of it and its count:
    the group's wait may then be over without it, and the request's own wait collects it."""
    store = RbdStore(cluster.ioctx(ceph.POOL), image, SIZE, create=True)
    try:
        store.write(0, b"j" * 4096)
        group = _Group()
        group.wait()  # closed, nothing in it
        buffer = bytearray(4096)
        late = store._readv(0, [memoryview(buffer)], group)
        assert group.members[0].code is None
        late()
        assert buffer == b"j" * 4096
        assert group.members[0].code == 4096
        late()  # collected once (a librbd completion is released when collected): the result stays
    finally:
        store.remove()


def test_creating_an_existing_image_is_refused_and_keeps_it(
    cluster: CephCluster, image: str
) -> None:
    first = RbdStore(cluster.ioctx(ceph.POOL), image, SIZE, create=True)
    first.write(0, b"keep" * 128)
    with pytest.raises(AlreadyExists):
        RbdStore(cluster.ioctx(ceph.POOL), image, SIZE, create=True)
    assert read(first, 0, 512) == b"keep" * 128
    first.remove()


def test_a_missing_pool_is_invalid_input(cluster: CephCluster) -> None:
    with pytest.raises(InvalidInput, match="pool 'no-such-pool' does not exist"):
        cluster.ioctx("no-such-pool")


def test_ping_reaches_the_monitors(cluster: CephCluster) -> None:
    cluster.ping()


# ---------------------------------------------------------------------------- fencing


@pytest.fixture
def two_clients(ceph_cluster: ceph.Cluster, image: str) -> Iterator[tuple[RbdStore, RbdStore]]:
    """The same image opened through two librados connections, as two nodes would."""
    old, new = CephCluster(ceph_cluster.conf), CephCluster(ceph_cluster.conf)
    first = RbdStore(old.ioctx(ceph.POOL), image, SIZE, create=True)
    second = RbdStore(new.ioctx(ceph.POOL), image, SIZE)
    yield first, second
    first.close()
    second.release()
    second.remove()
    old.close()
    new.close()


def test_a_fenced_client_s_submitted_io_raises_and_lands_nothing(
    two_clients: tuple[RbdStore, RbdStore], ceph_cluster: ceph.Cluster
) -> None:
    first, second = two_clients
    first.claim()
    first.write(0, b"o" * 4096)
    second.claim(take_over=True)
    with pytest.raises(Fenced, match="blocklisted"):
        first.submit_writev(0, [b"x" * 4096])()
    with pytest.raises(Fenced, match="blocklisted"):
        first.submit_readv(0, [memoryview(bytearray(4096))])()
    assert ceph_cluster.export(second.image_name)[:4096] == b"o" * 4096


def test_a_claimed_image_refuses_another_claim_and_its_writes(
    two_clients: tuple[RbdStore, RbdStore],
) -> None:
    first, second = two_clients
    first.claim()
    first.write(0, b"1" * 512)
    with pytest.raises(DeviceClaimed, match="claimed by another node"):
        second.claim()
    with pytest.raises(Fenced, match="exclusive lock"):
        second.write(0, b"2" * 512)
    assert read(second, 0, 512) == b"1" * 512
    first.release()
    second.claim()
    second.write(0, b"2" * 512)
    assert read(first, 0, 512) == b"2" * 512


def test_take_over_fences_the_old_owner_its_writes_never_land(
    two_clients: tuple[RbdStore, RbdStore], ceph_cluster: ceph.Cluster
) -> None:
    first, second = two_clients
    first.claim()
    first.write(0, b"o" * 4096)
    second.claim(take_over=True)
    with pytest.raises(Fenced, match="blocklisted"):
        first.write(0, b"x" * 4096)
    with pytest.raises(Fenced, match="blocklisted"):
        first.writev(4096, [b"x" * 512, b"x" * 512])
    with pytest.raises(Fenced):
        first.flush()
    second.write(8192, b"n" * 512)
    second.flush()
    exported = ceph_cluster.export(second.image_name)
    assert exported[:4096] == b"o" * 4096
    assert exported[4096:5120] == bytes(1024)
    assert exported[8192:8704] == b"n" * 512
    blocklist = ceph_cluster.run("ceph", "osd", "blocklist", "ls")
    assert blocklist.strip()  # the old client's address is listed


def test_take_over_fences_another_process(ceph_cluster: ceph.Cluster, image: str) -> None:
    """A separate process holds the claim and keeps writing; after the take-over none of its
    writes land, and it sees ``Fenced``."""
    holder = textwrap.dedent(
        f"""
        import sys
        from pathlib import Path
        from app.errors import Fenced
        from app.storage.rbd import CephCluster, RbdStore
        cluster = CephCluster(Path({str(ceph_cluster.conf)!r}))
        store = RbdStore(cluster.ioctx("rbd"), {image!r}, {SIZE}, create=True)
        store.claim()
        store.write(0, b"h" * 512)
        store.flush()
        print("claimed", flush=True)
        sys.stdin.readline()
        try:
            store.write(0, b"X" * 512)
        except Fenced:
            print("fenced", flush=True)
        else:
            print("wrote", flush=True)
        """
    )
    with subprocess.Popen(
        [sys.executable, "-c", holder], stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True
    ) as process:
        assert process.stdin is not None
        assert process.stdout is not None
        assert process.stdout.readline().strip() == "claimed"
        connection = CephCluster(ceph_cluster.conf)
        taker = RbdStore(connection.ioctx(ceph.POOL), image, SIZE)
        with pytest.raises(DeviceBusy):
            taker.claim()
        taker.claim(take_over=True)
        process.stdin.write("go\n")
        process.stdin.flush()
        assert process.stdout.readline().strip() == "fenced"
        assert read(taker, 0, 512) == b"h" * 512
        taker.release()
        taker.close()
        connection.close()
        process.stdin.close()
        assert process.wait(timeout=30) == 0


def test_taking_over_an_unclaimed_or_own_image_fences_nobody(
    two_clients: tuple[RbdStore, RbdStore],
) -> None:
    first, second = two_clients
    second.claim(take_over=True)  # nobody held it
    second.write(0, b"a" * 512)
    second.claim(take_over=True)  # already ours: not broken, so not blocklisted
    second.write(0, b"b" * 512)
    second.flush()
    assert read(first, 0, 512) == b"b" * 512


def test_an_image_open_in_another_client_is_not_removable(
    two_clients: tuple[RbdStore, RbdStore],
) -> None:
    first, second = two_clients
    with pytest.raises(DeviceBusy, match="open by another client"):
        first.check_unwatched()
    first.close()
    second.check_unwatched()  # only its own handle watches


def test_release_without_a_claim_is_a_no_op(two_clients: tuple[RbdStore, RbdStore]) -> None:
    first, second = two_clients
    first.release()
    first.write(0, b"w" * 512)  # librbd takes the lock implicitly, cooperatively
    first.release()
    second.claim()  # nothing managed held it
    assert read(second, 0, 512) == b"w" * 512


def test_a_connection_known_blocklisted_flushes_nothing(
    ceph_cluster: ceph.Cluster, image: str
) -> None:
    """Once a refused I/O or ``ping`` found the connection blocklisted, its flushes are
    ``Fenced``: librbd, not yet told, would answer one with nothing in flight as done."""
    connection = CephCluster(ceph_cluster.conf)
    store = RbdStore(connection.ioctx(ceph.POOL), image, SIZE, create=True, cluster=connection)
    try:
        store.write(0, b"a" * 512)
        store.flush()
        connection.blocklisted = True
        with pytest.raises(Fenced, match="blocklisted"):
            store.flush()
    finally:
        store.close()
        connection.close()


@pytest.mark.parametrize("noticed_by", ["ping", "write"])
def test_a_taken_over_connection_knows_it_is_blocklisted(
    ceph_cluster: ceph.Cluster, image: str, noticed_by: str
) -> None:
    """What makes a fenced node give up its RBD volumes and reconnect, and fails its /readyz
    meanwhile: the monitors' blocklist (asked by ``ping``), or the first I/O the OSDs refuse."""
    old, new = CephCluster(ceph_cluster.conf), CephCluster(ceph_cluster.conf)
    first = RbdStore(old.ioctx(ceph.POOL), image, SIZE, create=True, cluster=old)
    second = RbdStore(new.ioctx(ceph.POOL), image, SIZE, cluster=new)
    try:
        first.claim()
        old.ping()
        second.claim(take_over=True)
        assert not old.blocklisted  # nothing asked yet
        if noticed_by == "write":
            with pytest.raises(Fenced, match="blocklisted"):
                first.write(0, b"x" * 512)
            assert old.blocklisted
        with pytest.raises(Fenced, match="until it reconnects"):
            old.ping()
        assert old.blocklisted
        new.ping()
        assert not new.blocklisted
    finally:
        first.close()
        second.release()
        second.close()
        old.close()
        new.close()


def test_a_blocklisted_connection_reconnects_as_a_new_client_that_writes(
    ceph_cluster: ceph.Cluster, image: str
) -> None:
    """Ceph's blocklist names the fenced client's address; a new connection has another,
    so the images reopened on it are writable again."""
    mine, thieves = CephCluster(ceph_cluster.conf), CephCluster(ceph_cluster.conf)
    try:
        store = RbdStore(mine.ioctx(ceph.POOL), image, SIZE, create=True, cluster=mine)
        store.claim()
        thief = RbdStore(thieves.ioctx(ceph.POOL), image, SIZE, cluster=thieves)
        thief.claim(take_over=True)  # blocklists ``mine``
        thief.release()
        thief.close()
        with pytest.raises(Fenced, match="blocklisted"):
            store.write(0, b"x" * 512)
        assert mine.blocklisted
        mine.reconnect(store.close)
        assert not mine.blocklisted
        mine.ping()  # the monitors do not list the new client
        reopened = RbdStore(mine.ioctx(ceph.POOL), image, SIZE, cluster=mine)
        reopened.claim()
        reopened.write(0, b"n" * 512)
        reopened.flush()
        reopened.release()
        reopened.close()
        assert ceph_cluster.export(image)[:512] == b"n" * 512
    finally:
        thieves.close()
        mine.close()


def test_a_failed_request_in_a_batch_fails_alone(
    cluster: CephCluster, ceph_cluster: ceph.Cluster, image: str
) -> None:
    """One wait collects the whole batch; a request librbd refuses (a read past the end of
    an image another client shrank) fails its own wait, its neighbours get their bytes."""
    store = RbdStore(cluster.ioctx(ceph.POOL), image, SIZE, create=True)
    try:
        store.write(0, b"a" * 4096 + b"b" * 4096)
        ceph_cluster.run(
            "rbd", "resize", "--allow-shrink", "--size", f"{SIZE // 2}B", f"{ceph.POOL}/{image}"
        )
        buffers = [bytearray(4096) for _ in range(3)]
        reads = [
            store.submit_readv(offset, [memoryview(buffer)])
            for offset, buffer in zip((0, SIZE - 4096, 4096), buffers, strict=True)
        ]
        reads[2]()  # collects all three
        assert buffers[2] == b"b" * 4096
        with pytest.raises(OSError, match="read of"):
            reads[1]()
        reads[0]()
        assert buffers[0] == b"a" * 4096
    finally:
        store.remove()


def test_a_batch_fenced_midway_fails_from_the_fence_on_and_releases_every_completion(
    two_clients: tuple[RbdStore, RbdStore], ceph_cluster: ceph.Cluster
) -> None:
    """Requests of one batch submitted before and after another node took the image over:
    the later ones fail Fenced and never land, the earlier ones end either way, and every
    wait returns (each completion collected once, whatever the order)."""
    first, second = two_clients
    first.claim()
    first.write(0, b"o" * 65536)
    before = [first.submit_writev(index * 4096, [b"x" * 4096]) for index in range(4)]
    second.claim(take_over=True)
    after = [first.submit_writev(index * 4096, [b"y" * 4096]) for index in range(4, 8)]
    for wait in after[::-1]:
        with pytest.raises(Fenced, match="blocklisted"):
            wait()
    for wait in before:
        with contextlib.suppress(Fenced):
            wait()
    landed = ceph_cluster.export(second.image_name)[:65536]
    assert landed[4 * 4096 : 8 * 4096] == b"o" * 4 * 4096
    assert all(landed[i * 4096 : (i + 1) * 4096] in (b"o" * 4096, b"x" * 4096) for i in range(4))
