"""qemu-nbd serving a LUKS image of the reqcrypt tables' cipher: the peer doing the same job
in C (an NBD export that encrypts), on a file or on an RBD image."""

from __future__ import annotations

import signal
import subprocess
from pathlib import Path

from tests.support.ports import free_port

SECRET = "reqcrypt-bench-passphrase"


class QemuNbd:
    """qemu-nbd serving a LUKS (version 1, as qemu-img writes it) aes-xts-plain64 image with a
    512-bit key, as the reqcrypt table's (PBKDF cut to 10 ms). On a file by default; with
    ``rbd=(conf, pool, image)`` on a new RBD image through qemu's rbd driver, opened with
    ``--cache=none`` (librbd without its cache, as the service opens it)."""

    def __init__(
        self, directory: Path, size: int, rbd: tuple[Path, str, str] | None = None
    ) -> None:
        self.size = size
        self.port = free_port()
        self.uri = f"nbd://127.0.0.1:{self.port}/luks"
        self.process: subprocess.Popen[bytes] | None = None
        if rbd is None:
            image = directory / "luks.img"
            self.target = str(image)
            self.file_options = f"file.filename={image}"
            self.cache: list[str] = []
        else:
            conf, pool, name = rbd
            self.target = f"rbd:{pool}/{name}:conf={conf}"
            self.file_options = (
                f"file.driver=rbd,file.pool={pool},file.image={name},file.conf={conf}"
            )
            self.cache = ["--cache=none"]

    def start(self) -> None:
        secret = f"secret,id=sec0,data={SECRET}"
        create = [
            "qemu-img", "create", "-q", "-f", "luks", "--object", secret,
            "-o", "key-secret=sec0,cipher-alg=aes-256,cipher-mode=xts,ivgen-alg=plain64,iter-time=10",
            self.target, str(self.size),
        ]  # fmt: skip
        # qemu times its PBKDF with getrusage and gives up ("Unable to get accurate CPU
        # usage") now and then on a busy machine: a few tries.
        for _ in range(10):
            if subprocess.run(create, capture_output=True, timeout=120).returncode == 0:
                break
        else:
            raise AssertionError("qemu-img could not create the LUKS image")
        self.process = subprocess.Popen(
            [
                "qemu-nbd", "--object", secret, "--image-opts",
                f"driver=luks,key-secret=sec0,{self.file_options}", *self.cache,
                "-b", "127.0.0.1", "-p", str(self.port), "-x", "luks", "-t", "-e", "8",
            ],
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
        )  # fmt: skip
        for _ in range(100):
            if subprocess.run(["nbdinfo", "--size", self.uri], capture_output=True).returncode == 0:
                return
            subprocess.run(["sleep", "0.1"], check=True)
        raise AssertionError("qemu-nbd did not start")

    def stop(self) -> None:
        if self.process is not None:
            self.process.send_signal(signal.SIGTERM)
            self.process.wait(timeout=15)
