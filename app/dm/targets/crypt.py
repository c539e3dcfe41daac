"""``crypt``: sectors are encrypted through the volume's engine onto a device range (dm-crypt)."""

from __future__ import annotations

import time
from collections.abc import Sequence
from dataclasses import replace
from typing import Literal

from app.blk import mempool
from app.blk.request import Request
from app.blk.trace import Tracer
from app.crypto.keys import KeyMaterial
from app.crypto.transform import CryptTransform
from app.dm.table import CryptParams
from app.dm.targets.base import (
    BlockDevice,
    MapContext,
    MapResult,
    Started,
    Target,
    finish_io,
    finished,
)
from app.engine.base import Engine, EngineRequest, EngineResult
from app.engine.kcryptd import Completion, QueueFlags, crypt_path
from app.errors import InvalidInput, InvalidState
from app.vocab import (
    REQ_OP_READ,
    REQ_OP_WRITE,
    REQ_OP_WRITE_ZEROES,
    SECTOR_SHIFT,
    Op,
    completed,
)

_NOTHING = MapResult()


class CryptTarget(Target):
    def __init__(
        self,
        start: int,
        length: int,
        params: CryptParams,
        transform: CryptTransform,
        device: BlockDevice,
        engine: Engine,
    ) -> None:
        super().__init__(start, length)
        self.params = params
        self.transform = transform
        self.device = device
        self.engine = engine
        flags = QueueFlags(
            same_cpu_crypt=params.same_cpu_crypt,
            submit_from_crypt_cpus=params.submit_from_crypt_cpus,
            no_read_workqueue=params.no_read_workqueue,
            no_write_workqueue=params.no_write_workqueue,
        )
        # The store completes in its submitter's thread, as brd does.
        self._hops = {op: len(crypt_path(op, flags, Completion()).hops) for op in ("read", "write")}

    @property
    def prompt(self) -> bool:
        return self.device.prompt and not self.engine.paced

    def _trace(self, tracer: Tracer, request: Request, done: EngineResult) -> None:
        """The request's engine calls as one blktrace message (app.blk.trace documents it)."""
        plan = done.plan
        tracer.message(
            time.perf_counter_ns(),
            f"crypt {plan.op} {request.sector} + {request.nr_sectors} calls={len(plan.calls)} "
            f"mode={'bulk' if plan.bulk else 'per-unit'} units={plan.nbytes // plan.data_unit_size} "
            f"unit_size={plan.data_unit_size} iv={self.params.cipher.ivmode or 'none'}",
        )

    def map(self, request: Request, context: MapContext) -> MapResult:
        return finished(self.submit(request, context))

    def submit(self, request: Request, context: MapContext) -> Started:
        start = self.start
        relative = request.sector - start
        position = (self.params.offset + relative) << SECTOR_SHIFT  # on the device, in bytes
        if len(request.bios) == 1:  # a lone bio: no comprehension
            bio = request.bios[0]
            bios = [(bio.sector - start, bio.nr_sectors)]
        else:
            bios = [(bio.sector - start, bio.nr_sectors) for bio in request.bios]
        if request.op == REQ_OP_READ:
            # The ciphertext lands in the bio's pages and is decrypted there, in place.
            reading = self.device.submit_readv(position, request.segments)
            if reading is completed:  # read already: decrypted now, nothing left to wait for
                return self._decrypt(request, relative, context, bios)

            def decrypt() -> MapResult:
                reading()
                return self._decrypt(request, relative, context, bios)

            return decrypt
        if request.op == REQ_OP_WRITE_ZEROES or (
            request.op == REQ_OP_WRITE and request.may_overwrite
        ):
            # Its submitter never reads the plaintext again (write-zeroes: zeros of the
            # target's own): encrypted where it lies.
            segments = (
                request.segments
                if request.op == REQ_OP_WRITE
                else [memoryview(bytearray(request.nr_sectors << SECTOR_SHIFT))]
            )
            done = self._encrypt(request, segments, relative, context, bios)
            writing = self.device.submit_writev(position, done.outputs)
            return finish_io(self.device, request, writing, self._result(done, "write"))
        if request.op == REQ_OP_WRITE:
            segments = request.segments
            # The ciphertext goes to a warm buffer of this thread's pool (dm-crypt's bio_out
            # pages), free again once the device has taken it.
            nbytes = request.nr_sectors << SECTOR_SHIFT
            pages = mempool.take(nbytes)
            try:
                done = self._encrypt(
                    request, segments, relative, context, bios, _cut(pages[:nbytes], segments)
                )
                writing = self.device.submit_writev(position, done.outputs)
            finally:
                mempool.give(pages)
            return finish_io(self.device, request, writing, self._result(done, "write"))
        if request.op == Op.DISCARD:
            if not self.params.allow_discards:
                raise InvalidState("discard needs the allow_discards crypt option")
            self.device.discard(position, request.nr_sectors << SECTOR_SHIFT)
        if request.fua:
            self.device.flush()
        return _NOTHING

    def _decrypt(
        self, request: Request, relative: int, context: MapContext, bios: list[tuple[int, int]]
    ) -> MapResult:
        """The request's ciphertext, read into its segments, decrypted where it lies."""
        done = self.engine.process(
            EngineRequest(  # positional: keywords would make the class call build a dict
                "decrypt",
                self.transform,
                request.segments,
                relative,
                context.dispatch_mode,
                bios,
                request.segments,
                context.max_read_bytes,
            )
        )
        if request.tracer is not None:
            self._trace(request.tracer, request, done)
        return self._result(done, "read")

    def _encrypt(
        self,
        request: Request,
        segments: Sequence[memoryview],
        relative: int,
        context: MapContext,
        bios: list[tuple[int, int]],
        into: Sequence[memoryview] | None = None,
    ) -> EngineResult:
        """``segments`` encrypted into ``into`` (None: in place)."""
        done = self.engine.process(
            EngineRequest(  # positional: keywords would make the class call build a dict
                "encrypt",
                self.transform,
                segments,
                relative,
                context.dispatch_mode,
                bios,
                segments if into is None else into,
                context.max_write_bytes,
            )
        )
        if request.tracer is not None:
            self._trace(request.tracer, request, done)
        return done

    def _result(self, done: EngineResult, op: Literal["read", "write"]) -> MapResult:
        """The request's calls and times; its hops priced at the engine's queue hop cost."""
        hop_ns = self.engine.profile.queue_hop_ns
        queue_ns = self._hops[op] * hop_ns if hop_ns else 0.0
        return MapResult(len(done.plan.calls), done.modelled_ns, queue_ns)

    def flush(self) -> None:
        self.device.flush()

    def wipe(self) -> None:
        self.transform.wipe()


def _cut(buffer: memoryview, segments: Sequence[memoryview]) -> list[memoryview]:
    """``buffer`` cut into one view per segment, of the same sizes."""
    if len(segments) == 1:
        return [buffer]
    views = []
    position = 0
    for segment in segments:
        views.append(buffer[position : position + segment.nbytes])
        position += segment.nbytes
    return views


def crypt_message(params: CryptParams, words: Sequence[str], *, suspended: bool) -> CryptParams:
    """The target's ``dmsetup message`` handler (dm-crypt's crypt_message): ``key set|wipe``.

    Returns the line's new parameters without touching the running target, so the
    control plane can persist them before the volume installs them.
    """
    if len(words) < 2 or words[0].lower() != "key" or words[1].lower() not in ("set", "wipe"):
        raise InvalidInput("unsupported message; crypt accepts 'key set <hex>' and 'key wipe'")
    if not suspended:
        raise InvalidState("crypt key messages need the volume suspended")
    if words[1].lower() == "wipe":
        if len(words) != 2:
            raise InvalidInput("'key wipe' takes no argument")
        size = len(params.key) if params.key is not None else params.wiped_key_size
        return replace(params, key=None, wiped_key_size=size)
    if len(words) != 3:
        raise InvalidInput("'key set' takes exactly one key")
    key = KeyMaterial.from_hex(words[2])
    params.cipher.check_key(key)
    return replace(params, key=key, wiped_key_size=0)
