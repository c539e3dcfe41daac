"""A Linux guest under qemu for benchmarks that need a real kernel as the block client.

It reuses what dmcrypt-oracle caches (its ``setup``, as root): a
stock Debian kernel and an initramfs with a static busybox, GNU dd (``/usr/local/bin/gdd``,
for ``iflag=direct``/``oflag=direct`` and its throughput line) and the virtio modules. We
append a small cpio of our own holding ``/guest/init`` and the caller's shell script, and
boot with ``rdinit=/guest/init``; the kernel unpacks concatenated archives in order, so the
oracle's files stay as they are. Nothing is written to the oracle's cache.

Disks are virtio-blk devices named by ``serial=`` (the guest finds them through
``/sys/block/vd*/serial``). The script's stdout and stderr go to a result disk, read back
by the host after the guest powers off; the serial console keeps only the kernel's log.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import time
from dataclasses import dataclass
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
ORACLE = (
    Path(os.environ["DMCRYPT_ORACLE"]).parent
    if os.environ.get("DMCRYPT_ORACLE")
    else REPO.parent / "shared" / "tools" / "dmcrypt-oracle"
)
"""The oracle's directory: beside the repository (``../shared``), or where
``DMCRYPT_ORACLE`` (its executable, as for scripts/make-kernel-fixtures) says."""
CACHE = Path(
    os.environ.get("DMCRYPT_ORACLE_CACHE")
    or Path("~root").expanduser() / ".cache" / "dmcrypt-oracle"
)
"""Where the oracle's ``setup`` caches the kernel: the oracle's own default (under root's
home: it runs as root), or ``DMCRYPT_ORACLE_CACHE`` as for the oracle."""
SETUP_HINT = (
    f"the Linux guest needs qemu-system-x86_64 and dmcrypt-oracle's cached kernel and "
    f"initramfs in {CACHE}: run `sudo {ORACLE}/setup` (Debian packages qemu-system-x86, "
    f"kmod, dmsetup, coreutils; about 35 s the first time), then "
    f"`{ORACLE}/dmcrypt-oracle info` to check"
)
RESULT_BYTES = 1 << 20

INIT = r"""#!/bin/busybox sh
/bin/busybox mkdir -p /proc /sys /dev /tmp /sbin /usr/bin /usr/sbin
/bin/busybox --install -s
export PATH=/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin
export LD_LIBRARY_PATH=/lib/x86_64-linux-gnu
mount -t proc proc /proc
mount -t sysfs sysfs /sys
mount -t devtmpfs devtmpfs /dev 2>/dev/null
mount -t tmpfs tmpfs /tmp
modprobe virtio_pci
modprobe virtio_blk
disk() {
    for s in /sys/block/vd*; do
        [ "$(cat $s/serial 2>/dev/null)" = "$1" ] && { echo /dev/${s##*/}; return 0; }
    done
    return 1
}
i=0
while ! disk res >/dev/null; do i=$((i+1)); [ $i -gt 400 ] && break; sleep 0.05; done
RES=$(disk res)
echo "BOOTED uptime=$(cut -d' ' -f1 /proc/uptime) kernel=$(uname -r)" > /tmp/result
( . /guest/job.sh ) >> /tmp/result 2>&1
echo "EXIT $?" >> /tmp/result
echo "END uptime=$(cut -d' ' -f1 /proc/uptime)" >> /tmp/result
[ -n "$RES" ] && dd if=/tmp/result of=$RES conv=fsync 2>/dev/null
poweroff -f
"""


class GuestUnavailable(RuntimeError):
    """qemu or the oracle's cached kernel is missing; the message says how to set it up."""


@dataclass(frozen=True)
class GuestImage:
    kver: str
    vmlinuz: Path
    initramfs: Path
    accel: str


@dataclass(frozen=True)
class Disk:
    """A virtio-blk disk: ``source`` is a file path or a qemu URI such as ``nbd://…``, or
    ``drive`` gives the ``-drive`` options that say where the blocks are (e.g. ``driver=nbd,…``)."""

    serial: str
    source: str = ""
    readonly: bool = False
    cache: str = "none"
    device_options: str = ""
    """Extra ``virtio-blk-pci`` properties, e.g. ``,request-merging=off``."""
    drive: str = ""

    def drive_options(self) -> str:
        where = self.drive or f"file={self.source.replace(',', ',,')},format=raw"
        readonly = ",readonly=on" if self.readonly else ""
        return f"{where},if=none,id={self.serial},cache={self.cache}{readonly}"


@dataclass(frozen=True)
class GuestRun:
    output: str
    serial_log: str
    wall_seconds: float
    exit_status: int | None

    def lines(self, tag: str) -> list[list[str]]:
        """The words after ``tag`` on each output line that starts with it."""
        return [line.split()[1:] for line in self.output.splitlines() if line.split()[:1] == [tag]]


def find_image() -> GuestImage:
    """The oracle's cached kernel and initramfs, or GuestUnavailable saying what is missing."""
    if shutil.which("qemu-system-x86_64") is None:
        raise GuestUnavailable(f"qemu-system-x86_64 is not installed; {SETUP_HINT}")
    try:
        current = json.loads((CACHE / "current.json").read_text())
    except (OSError, ValueError) as error:
        raise GuestUnavailable(f"no {CACHE / 'current.json'} ({error}); {SETUP_HINT}") from None
    vmlinuz, initramfs = Path(current["vmlinuz"]), Path(current["initramfs"])
    for path in (vmlinuz, initramfs):
        if not path.is_file():
            raise GuestUnavailable(f"{path} is missing; {SETUP_HINT}")
    return GuestImage(current["kver"], vmlinuz, initramfs, _accel())


def _accel() -> str:
    """KVM only when asked for, or when the oracle's probe found it working (it cannot nest here)."""
    requested = os.environ.get("DMCRYPT_ORACLE_ACCEL", "auto")
    if requested in ("tcg", "kvm"):
        return requested
    try:
        return "kvm" if json.loads((CACHE / "accel.json").read_text()).get("kvm_ok") else "tcg"
    except (OSError, ValueError):
        return "tcg"


def cpio_newc(files: dict[str, bytes]) -> bytes:
    """A newc archive of directories and executable files (what ``/guest`` needs)."""
    entries: list[tuple[str, int, bytes]] = []
    directories = sorted({str(Path(name).parent) for name in files} - {"/", "."})
    entries += [(name, 0o040755, b"") for name in directories]
    entries += [(name, 0o100755, data) for name, data in sorted(files.items())]
    entries.append(("TRAILER!!!", 0, b""))
    out = bytearray()
    for inode, (name, mode, data) in enumerate(entries, start=1):
        encoded = name.lstrip("/").encode() + b"\0"
        fields = (inode, mode, 0, 0, 1, 0, len(data), 0, 0, 0, 0, len(encoded), 0)
        out += b"070701" + "".join(f"{value:08X}" for value in fields).encode() + encoded
        out += bytes(-len(out) % 4) + data
        out += bytes(-len(out) % 4)
    return bytes(out)


def boot(
    image: GuestImage,
    script: str,
    disks: list[Disk],
    workdir: Path,
    *,
    qemu_args: tuple[str, ...] = (),
    timeout: float = 300,
) -> GuestRun:
    """Boot the guest, run ``script`` (busybox sh; ``disk SERIAL`` names a disk) and power off.

    ``qemu_args`` go before the disks (``-object tls-creds-x509,…`` for an NBD over TLS)."""
    initrd = workdir / "initrd.cpio"
    with initrd.open("wb") as out:
        with image.initramfs.open("rb") as oracle:
            shutil.copyfileobj(oracle, out)
        out.write(cpio_newc({"/guest/init": INIT.encode(), "/guest/job.sh": script.encode()}))
    result = workdir / "result.img"
    result.write_bytes(bytes(RESULT_BYTES))
    serial_log = workdir / "serial.log"
    command = [
        "qemu-system-x86_64",
        "-nodefaults",
        "-display",
        "none",
        "-no-reboot",
        "-machine",
        "pc",
        "-m",
        "512",
        "-smp",
        "1",
        "-accel",
        image.accel,
        "-kernel",
        str(image.vmlinuz),
        "-initrd",
        str(initrd),
        "-append",
        "console=ttyS0,115200 panic=-1 oops=panic mitigations=off rdinit=/guest/init",
        "-serial",
        f"file:{serial_log}",
    ]
    command += list(qemu_args)
    for disk in [Disk("res", str(result), cache="writeback"), *disks]:
        command += [
            "-drive",
            disk.drive_options(),
            "-device",
            f"virtio-blk-pci,drive={disk.serial},serial={disk.serial}{disk.device_options}",
        ]
    started = time.monotonic()
    process = subprocess.Popen(
        command, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, stderr=subprocess.STDOUT
    )
    try:
        qemu_output, _ = process.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        process.kill()  # our own qemu child, by PID
        qemu_output, _ = process.communicate()
    wall = time.monotonic() - started
    output = result.read_bytes().split(b"\0", 1)[0].decode(errors="replace")
    serial = serial_log.read_text(errors="replace") if serial_log.exists() else ""
    if qemu_output.strip():
        serial += "\n--- qemu ---\n" + qemu_output.decode(errors="replace")
    exits = [line.split()[1] for line in output.splitlines() if line.startswith("EXIT ")]
    return GuestRun(output, serial, wall, int(exits[0]) if exits else None)
