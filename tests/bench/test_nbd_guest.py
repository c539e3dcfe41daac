"""A Linux guest uses a reqcrypt volume as a virtio disk through qemu's NBD client.

qemu boots a stock Debian kernel (dmcrypt-oracle's cache, see tests/support/linux_guest.py) with
``-drive file=nbd://127.0.0.1:PORT/EXPORT,format=raw,cache=none`` on a virtio-blk device.
In the guest GNU dd writes a known plaintext with O_DIRECT, in 512 B, 4 KiB and 1 MiB
blocks at aligned and unaligned offsets, reads each piece back with O_DIRECT and prints
SHA-256 hashes, then flushes. The host compares those hashes with the plaintext and with
what reqcrypt's HTTP API reads, checks the backing images against ciphertext computed
without reqcrypt (the real kernel's, for a kernel fixture; pyca's AES-XTS per sector for
the 16 MiB volume), and that the volume's statistics counted the NBD I/O and the flush.

A bench (boots a VM, tens of seconds under TCG): ``.venv/bin/pytest -m bench -s
tests/bench/test_nbd_guest.py``. docs/nbd.md ("Linux guest") says what it needs.
"""

from __future__ import annotations

import hashlib
import os
import re
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest
from cryptography.hazmat.primitives.ciphers import Cipher, algorithms, modes

from tests.support.certs import make_pki
from tests.support.factories import xts_table
from tests.support.keys import XTS_KEY
from tests.support.linux_guest import Disk, GuestImage, GuestRun, GuestUnavailable, boot, find_image
from tests.support.nbd_servers import NbdServer, export, running
from tests.support.vectors import CASES, stream

pytestmark = pytest.mark.bench

KIB, MIB = 1 << 10, 1 << 20
SIZE = 16 * MIB
PIECES = [  # (offset, block size, count): every byte written once, in this order
    (0, 4 * KIB, 64),  # 4 KiB, aligned
    (256 * KIB, 512, 3),
    (257 * KIB + 512, 4 * KIB, 63),  # 4 KiB at 1536 bytes past a 4 KiB boundary
    (509 * KIB + 512, MIB, 3),  # 1 MiB, not even 4 KiB aligned
    (3581 * KIB + 512, 512, 5),
    (3584 * KIB, 4 * KIB, 128),
    (4 * MIB, MIB, 11),  # 1 MiB, aligned
    (15 * MIB, 4 * KIB, 255),
    (16 * MIB - 4 * KIB, 512, 8),  # the device's last sectors
]
KERNEL_CASE = "aes-xts-plain64-k64"
KERNEL_PIECES = [
    (0, 4 * KIB, 3),
    (12 * KIB, 512, 1),
    (12 * KIB + 512, 4 * KIB, 12),  # 4 KiB at 512 bytes past a 4 KiB boundary
    (60 * KIB + 512, 512, 7),
]


def test_the_pieces_tile_each_volume() -> None:
    for pieces, size in ((PIECES, SIZE), (KERNEL_PIECES, 64 * KIB)):
        end = 0
        for offset, block, count in pieces:
            assert offset == end
            end += block * count
        assert end == size


@pytest.fixture(scope="module")
def image() -> GuestImage:
    try:
        return find_image()
    except GuestUnavailable as error:
        unavailable = str(error)
    pytest.fail(unavailable, pytrace=False)


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[NbdServer]:
    with running(tmp_path_factory.mktemp("guest") / "data") as nbd:
        yield nbd


@pytest.fixture(scope="module")
def tls_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[NbdServer]:
    """NBD with TLS forced and client certificates verified (qemu's tls-creds-x509)."""
    pki = make_pki(tmp_path_factory.mktemp("pki"))
    with running(tmp_path_factory.mktemp("guest-tls") / "data", pki) as nbd:
        yield nbd


@pytest.fixture
def http(server: NbdServer) -> Iterator[httpx.Client]:
    with server.client() as client:
        yield client


def nbd_disk(server: NbdServer, name: str) -> Disk:
    """The export as a virtio disk, over TLS when the server insists on it."""
    if server.pki is None:
        return Disk(name, server.uri(name))
    drive = (
        f"driver=nbd,server.type=inet,server.host=localhost,server.port={server.nbd_port},"
        f"export={name},tls-creds=tls0"
    )
    return Disk(name, drive=drive)


def tls_args(server: NbdServer) -> tuple[str, ...]:
    if server.pki is None:
        return ()
    return ("-object", f"tls-creds-x509,id=tls0,dir={server.pki},endpoint=client")


def sha256(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def xts_plain64(key: bytes, plaintext: bytes) -> bytes:
    """dm-crypt aes-xts-plain64 from its definition, with pyca alone: tweak = le64 sector."""
    out = bytearray()
    for sector in range(len(plaintext) // 512):
        encryptor = Cipher(algorithms.AES(key), modes.XTS(sector.to_bytes(16, "little")))
        out += encryptor.encryptor().update(plaintext[sector * 512 : (sector + 1) * 512])
    return bytes(out)


def kernel_fixture() -> tuple[str, bytes, str]:
    """The fixture's table (device ``{dev}``), plaintext and the kernel's backing hash."""
    case = CASES[KERNEL_CASE]
    (line,) = case["table"]
    (key,) = case["keys"]
    table = line.replace("{key0}", stream(key["seed"], key["size"]).hex())
    plaintext = stream(case["plaintext"]["seed"], case["plaintext"]["size"])
    return table, plaintext, case["kernel"]["backing_sha256"]


GUEST_HELPERS = r"""
need() { [ -b "$1" ] || { echo "FAIL no disk $2"; exit 1; }; }
w() {  # dev src offset bs count: O_DIRECT both sides, offsets in bytes
    gdd if=$2 of=$1 bs=$4 count=$5 skip=$3 seek=$3 iflag=direct,skip_bytes \
        oflag=direct,seek_bytes conv=notrunc status=none || echo "FAIL write $3 $4 $5"
}
r() {  # tag dev offset bs count
    h=$(gdd if=$2 bs=$4 count=$5 skip=$3 iflag=direct,skip_bytes status=none | sha256sum)
    echo "READ $1 $3 $4 $5 ${h%% *}"
}
up() { cut -d' ' -f1 /proc/uptime; }
"""


def guest_script(pieces: dict[str, list[tuple[int, int, int]]]) -> str:
    """Write each volume's pieces from its source disk, flush, read them back, hash all."""
    lines = [GUEST_HELPERS]
    for tag in pieces:
        lines.append(f'need "$(disk {tag})" {tag}; need "$(disk {tag}-src)" {tag}-src')
        queue = f"/sys/block/$(basename $(disk {tag}))/queue"
        lines.append(
            f'echo "QUEUE {tag} $(cat {queue}/logical_block_size) $(cat {queue}/max_sectors_kb)'
            f' $(cat {queue}/max_segments) $(cat {queue}/write_cache)"'
        )
    lines.append('echo "PHASE write $(up)"')
    for tag, layout in pieces.items():
        lines += [f"w $(disk {tag}) $(disk {tag}-src) {o} {b} {c}" for o, b, c in layout]
    lines.append('echo "PHASE flush $(up)"')
    for tag in pieces:  # fsync(2) on the device: REQ_PREFLUSH -> virtio FLUSH -> NBD_CMD_FLUSH
        lines.append(f"gdd if=/dev/null of=$(disk {tag}) conv=notrunc,fsync status=none")
    lines.append('echo "PHASE read $(up)"')
    for tag, layout in pieces.items():
        lines += [f"r {tag} $(disk {tag}) {o} {b} {c}" for o, b, c in layout]
        lines.append(f"h=$(gdd if=$(disk {tag}) bs=1M iflag=direct status=none | sha256sum)")
        lines.append(f'echo "WHOLE {tag} ${{h%% *}}"')
    lines.append('echo "PHASE done $(up)"')
    return "\n".join(lines) + "\n"


def check_run(run: GuestRun, expected: dict[str, tuple[bytes, list[tuple[int, int, int]]]]) -> None:
    """The guest finished cleanly and read back exactly the plaintext, piece by piece."""
    assert run.exit_status == 0, run.output + run.serial_log[-3000:]
    assert "FAIL" not in run.output, run.output
    reads = {(tag, int(o), int(b), int(c)): h for tag, o, b, c, h in run.lines("READ")}
    for tag, (plaintext, layout) in expected.items():
        for offset, block, count in layout:
            want = sha256(plaintext[offset : offset + block * count])
            assert reads.pop((tag, offset, block, count)) == want, (tag, offset, block, count)
        assert [tag, sha256(plaintext)] in run.lines("WHOLE"), run.output
    assert not reads


@pytest.mark.parametrize("transport", ["plain", "tls"])
def test_guest_writes_and_reads_with_o_direct_through_nbd(
    image: GuestImage, request: pytest.FixtureRequest, transport: str, tmp_path: Path
) -> None:
    """O_DIRECT writes and reads of a real kernel arrive whole and encrypted as dm-crypt
    would, over NBD in clear and over TLS with client certificates."""
    server: NbdServer = request.getfixturevalue("server" if transport == "plain" else "tls_server")
    with server.client() as http:
        guest_o_direct_round_trip(image, server, http, tmp_path)


def guest_o_direct_round_trip(
    image: GuestImage, server: NbdServer, http: httpx.Client, tmp_path: Path
) -> None:
    """The guest writes PIECES of a random 16 MiB volume and KERNEL_PIECES of a kernel
    fixture's volume; an idle third export counts the flushes qemu sends by itself."""
    plaintext = os.urandom(SIZE)
    export(http, "guest", SIZE, table=xts_table("guest-pv", SIZE // 512))
    kernel_table, kernel_plaintext, kernel_backing_sha256 = kernel_fixture()
    assert http.post("/v1/devices", json={"name": "kfx-pv", "size_bytes": 64 * KIB}).is_success
    body = {"name": "kfx", "table": kernel_table.replace("{dev}", "kfx-pv"), "nbd_export": True}
    assert http.post("/v1/volumes", json=body).status_code == 201
    sources = {"guest": plaintext, "kfx": kernel_plaintext}
    disks = []
    for tag, data in sources.items():
        (tmp_path / f"{tag}.raw").write_bytes(data)
        disks.append(nbd_disk(server, tag))
        disks.append(Disk(f"{tag}-src", str(tmp_path / f"{tag}.raw"), readonly=True))
    export(http, "idle", MIB)  # attached, untouched: counts the flushes qemu sends on exit
    disks.append(nbd_disk(server, "idle"))
    layouts = {"guest": PIECES, "kfx": KERNEL_PIECES}

    run = boot(image, guest_script(layouts), disks, tmp_path, qemu_args=tls_args(server))

    check_run(run, {tag: (sources[tag], layouts[tag]) for tag in sources})
    for tag, data in sources.items():
        assert sha256(http.get(f"/v1/volumes/{tag}/data").content) == sha256(data)
    backing = server.data_dir / "devices"
    assert sha256((backing / "kfx-pv.img").read_bytes()) == kernel_backing_sha256
    reference = xts_plain64(bytes.fromhex(XTS_KEY), plaintext)
    assert (backing / "guest-pv.img").read_bytes() == reference
    idle = http.get("/v1/volumes/idle/status").json()
    assert idle["nbd"]["requests"]["write"] == 0
    for tag, data in sources.items():
        status = http.get(f"/v1/volumes/{tag}/status").json()
        nbd, stats = status["nbd"], status["stats"]
        assert nbd["written_bytes"] == len(data)
        assert nbd["read_bytes"] >= 2 * len(data)  # the pieces, then the whole device
        assert nbd["requests"]["flush"] == idle["nbd"]["requests"]["flush"] + 1  # the fsync
        assert nbd["errors"] == 0
        assert stats["w_bios"] == nbd["requests"]["write"] >= sum(c for _, _, c in layouts[tag])
        assert stats["w_sectors"] == len(data) // 512
        assert stats["r_sectors"] >= 2 * len(data) // 512
        assert stats["f_ios"] == idle["stats"]["f_ios"] + 1
        print(
            f"\n{tag}: nbd requests {nbd['requests']}, batches {nbd['batches']}; "
            f"queue w_bios {stats['w_bios']} w_ios {stats['w_ios']} w_merges {stats['w_merges']}"
            f", r_bios {stats['r_bios']} r_ios {stats['r_ios']} r_merges {stats['r_merges']}"
            f", f_ios {stats['f_ios']}"
        )
    print(f"guest: {' '.join(' '.join(q) for q in run.lines('QUEUE'))}")
    print(f"guest phases (uptime s): {run.lines('PHASE')}; qemu wall {run.wall_seconds:.1f} s")


def test_guest_o_direct_throughput(
    image: GuestImage, server: NbdServer, http: httpx.Client, tmp_path: Path
) -> None:
    """Reports sequential O_DIRECT MB/s as the guest's dd measures it; asserts no speed."""
    size = 64 * MIB
    export(http, "speed", size)
    script = GUEST_HELPERS + "\n".join(
        [
            'D=$(disk speed); need "$D" speed',
            "gdd if=/dev/zero of=$D bs=1M count=64 oflag=direct conv=notrunc,fsync 2>&1 | tail -1"
            " | sed 's/^/DD write-1M /'",
            "gdd if=$D of=/dev/null bs=1M iflag=direct 2>&1 | tail -1 | sed 's/^/DD read-1M /'",
            "gdd if=/dev/zero of=$D bs=4K count=2048 oflag=direct conv=notrunc,fsync 2>&1"
            " | tail -1 | sed 's/^/DD write-4K /'",
            "gdd if=$D of=/dev/null bs=4K count=2048 iflag=direct 2>&1 | tail -1"
            " | sed 's/^/DD read-4K /'",
        ]
    )
    run = boot(image, script + "\n", [Disk("speed", server.uri("speed"))], tmp_path)
    assert run.exit_status == 0, run.output + run.serial_log[-3000:]
    figures = {}
    for words in run.lines("DD"):
        match = re.search(r"copied, ([\d.]+) s, ([\d.]+ \S+/s)", " ".join(words[1:]))
        assert match, run.output
        figures[words[0]] = f"{match.group(2)} ({match.group(1)} s)"
    assert set(figures) == {"write-1M", "read-1M", "write-4K", "read-4K"}, run.output
    status = http.get("/v1/volumes/speed/status").json()
    assert status["nbd"]["written_bytes"] == 64 * MIB + 8 * MIB
    print(f"\nguest O_DIRECT through NBD ({image.accel}): {figures}")


def test_a_guest_bio_split_in_pieces_merges_again_in_reqcrypt(
    image: GuestImage, server: NbdServer, http: httpx.Client, tmp_path: Path
) -> None:
    """The guest splits each 1 MiB O_DIRECT bio into 64 KiB requests (``max_sectors_kb``)
    and qemu passes them on unmerged (``request-merging=off``), up to 16 in flight on the
    NBD connection: reqcrypt's queue merges them back into larger requests."""
    size = 8 * MIB
    plaintext = os.urandom(size)
    export(http, "merge", size)
    source = tmp_path / "merge.raw"
    source.write_bytes(plaintext)
    script = GUEST_HELPERS + "\n".join(
        [
            'D=$(disk merge); need "$D" merge; need "$(disk merge-src)" merge-src',
            "echo 64 > /sys/block/$(basename $D)/queue/max_sectors_kb",
            'echo "QUEUE merge $(cat /sys/block/$(basename $D)/queue/max_sectors_kb)"',
            "w $D $(disk merge-src) 0 1048576 8",
            "r merge $D 0 1048576 8",
        ]
    )
    disks = [
        Disk("merge", server.uri("merge"), device_options=",request-merging=off"),
        Disk("merge-src", str(source), readonly=True),
    ]
    run = boot(image, script + "\n", disks, tmp_path)
    assert run.exit_status == 0, run.output + run.serial_log[-3000:]
    assert "FAIL" not in run.output, run.output
    assert run.lines("QUEUE") == [["merge", "64"]]
    assert run.lines("READ") == [["merge", "0", "1048576", "8", sha256(plaintext)]]
    assert http.get("/v1/volumes/merge/data").content == plaintext
    assert (server.data_dir / "devices" / "merge-pv.img").read_bytes() == xts_plain64(
        bytes.fromhex(XTS_KEY), plaintext
    )
    status = http.get("/v1/volumes/merge/status").json()
    nbd, stats = status["nbd"], status["stats"]
    assert nbd["requests"]["write"] == size // (64 * KIB)  # qemu did not merge
    assert stats["w_bios"] == size // (64 * KIB)
    assert stats["w_merges"] > 0
    assert stats["w_ios"] == stats["w_bios"] - stats["w_merges"]
    print(
        f"\nmerge: nbd requests {nbd['requests']}, batches {nbd['batches']}; w_bios "
        f"{stats['w_bios']} -> w_ios {stats['w_ios']} (w_merges {stats['w_merges']}, "
        f"wareq_sz {stats['wareq_sz']:.0f} KiB); r_bios {stats['r_bios']} -> r_ios "
        f"{stats['r_ios']} (r_merges {stats['r_merges']})"
    )
