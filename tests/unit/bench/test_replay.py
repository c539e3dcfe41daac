import csv
import io
import time
from dataclasses import replace

import pytest

from app.bench.replay import ReplayConfig, model_spec, parse_trace, render_report, replay
from app.bench.report import cells_csv
from app.blk import Bio, BlockQueue, Op, QueueLimits
from app.blk.trace import format_event, format_trailer
from app.engine.presets import NONE_DEVICE, OMAP_AES_AM335X, SDCARD_BBB, SOFTWARE
from app.errors import InvalidInput

CBC = ReplayConfig(cipher="aes-cbc-plain64")

BLKPARSE = """\
  8,0    3        1     0.000000000   697  Q  WS 2048 + 8 [kjournald]
  8,0    3        2     0.000001829   697  G  WS 2048 + 8 [kjournald]
  8,0    3        3     0.000002000   697  Q  WS 2056 + 8 [kjournald]
  8,0    3        4     0.000002100   697  M  WS 2056 + 8 [kjournald]
  8,0    3        5     0.000003000   697  Q FWS [kjournald]
  8,0    3        6     0.000004000   697  Q   D 9000 + 8 [fstrim]
garbage here
  8,0    1        7     0.000424577     0  C  WS 2048 + 16 [0]
  8,0    2        1     0.000500000   698  Q   R 4096 + 256 [dd]
CPU3 (8,0):
 Reads Queued:           0,        0KiB  Writes Queued:           2,        8KiB
Total (8,0):
 Writes Queued:           2,        8KiB
Events (8,0): 9 entries
Skips: 0 forward (0 -   0.0%)
"""


def test_blkparse_takes_q_events_skips_the_rest_and_counts_bad_lines():
    trace = parse_trace(BLKPARSE)
    assert trace.format == "blkparse"
    assert [(b.op, b.sector, b.nr_sectors) for b in trace.bios] == [
        (Op.WRITE, 2048, 8),
        (Op.WRITE, 2056, 8),
        (Op.READ, 4096, 256),
    ]
    assert trace.bios[2].time_ns == 500_000
    assert trace.bad.count == 1
    assert trace.bad.examples == [(7, "garbage here")]
    assert trace.skipped == 5  # G, M, C, the flush and the discard


def test_fio_iolog_v2_waits_advance_time():
    text = (
        "fio version 2 iolog\n/dev/sdb add\n/dev/sdb open\n/dev/sdb write 0 4096\n"
        "/dev/sdb wait 1500 0\n/dev/sdb read 8192 4096\n/dev/sdb write 3 7\n/dev/sdb close\n"
    )
    trace = parse_trace(text)
    assert trace.format == "fio iolog v2"
    assert [(b.time_ns, b.op, b.sector, b.nr_sectors) for b in trace.bios] == [
        (0, Op.WRITE, 0, 8),
        (1_500_000, Op.READ, 16, 8),
    ]
    assert trace.bad.count == 1


def test_fio_iolog_v3_timestamps_are_milliseconds():
    text = (
        "fio version 3 iolog\n10 /dev/sdb add\n10 /dev/sdb open\n12 /dev/sdb write 0 65536\n"
        "15 /dev/sdb read 65536 65536\n20 /dev/sdb close\n"
    )
    trace = parse_trace(text)
    assert [(b.time_ns, b.op) for b in trace.bios] == [(0, Op.WRITE), (3_000_000, Op.READ)]
    assert trace.bad.count == 0


def test_unknown_fio_version_is_refused():
    with pytest.raises(InvalidInput, match="versions 2 and 3"):
        parse_trace("fio version 1 iolog\n")


def test_cipher_text_becomes_the_engines_view():
    assert model_spec("aes-cbc-essiv:sha256").ivmode == "essiv"
    assert model_spec("capi:xts(aes)-plain64").chainmode == "xts"
    assert model_spec("aes-ecb").ivmode is None
    with pytest.raises(InvalidInput):
        model_spec("not a cipher")


def write_bio(sector, nr_sectors):
    return Bio(Op.WRITE, sector, nr_sectors, [memoryview(bytes(nr_sectors * 512))])


def read_bio(sector, nr_sectors):
    return Bio(Op.READ, sector, nr_sectors, [memoryview(bytearray(nr_sectors * 512))])


def _recorded_run():
    """A queue traced while batches of bios go in, as the service records them."""
    dispatched = []
    queue = BlockQueue(dispatched.append, limits=QueueLimits(), plug_window_us=50)
    listener = queue.listen()
    batches = [
        [write_bio(8 * i, 8) for i in range(40)],  # back merges past BLK_PLUG_FLUSH_SIZE
        [write_bio(2048 + 8 * i, 8) for i in reversed(range(6))],  # front merges
        [write_bio(4096, 8), write_bio(4112, 8), write_bio(4104, 8)],  # a request merge
        [read_bio(8192 + 16 * i, 16) for i in range(12)] + [write_bio(9000, 8)],
        [write_bio(16384, 4096)],  # split to max_sectors, then merged back into requests
    ]
    for batch in batches:
        queue.submit_bios(batch)
        for bio in batch:
            bio.wait(5)
        time.sleep(0.002)  # separate submissions: well past the plug window
    queue.unlisten(listener)
    events = listener.drain()
    lines = [format_event(event, seq, events[0].time_ns) for seq, event in enumerate(events, 1)]
    text = "\n".join(lines) + "\n" + format_trailer(len(events), listener.dropped)
    return queue.stats.snapshot(), len(dispatched), text


def test_replaying_a_recorded_trace_reproduces_its_merges_exactly():
    stats, requests, text = _recorded_run()
    assert stats["back_merges"] > 0
    assert stats["front_merges"] > 0
    assert stats["request_merges"] > 0
    result = replay(parse_trace(text), SOFTWARE, NONE_DEVICE, ReplayConfig())
    cell = next(c for c in result["cells"] if c["dispatch_mode"] == "request")
    assert (cell["back_merges"], cell["front_merges"], cell["request_merges"]) == (
        stats["back_merges"],
        stats["front_merges"],
        stats["request_merges"],
    )
    assert cell["requests"] == requests
    assert result["trace"]["bad_lines"] == 0


def _sequential_writes(count, nr_sectors=8, gap_ns=0):
    return "\n".join(
        f"  8,0    0 {i + 1:8d} {0:5d}.{i * gap_ns:09d}   100  Q   W {i * nr_sectors} + "
        f"{nr_sectors} [fio]"
        for i in range(count)
    )


def test_request_mode_merges_and_bulk_cuts_engine_calls():
    result = replay(parse_trace(_sequential_writes(64)), OMAP_AES_AM335X, SDCARD_BBB, CBC)
    cells = {(c["engine"], c["dispatch_mode"]): c for c in result["cells"]}
    bio = cells[("omap-aes-am335x", "bio")]
    request = cells[("omap-aes-am335x", "request")]
    stock = cells[("omap-aes-am335x (no bulk)", "bio")]
    assert bio["engine_calls_per_bio"] == 1.0  # one bulk call per bio
    assert stock["engine_calls_per_bio"] == 8.0  # one call per 512-byte unit
    assert request["requests"] < bio["requests"] == 64
    assert request["wareq_sz"] > bio["wareq_sz"] == 4.0
    assert request["modelled_mb_s"] > bio["modelled_mb_s"]
    assert result["gains"]["request_vs_bio"] > 0
    assert result["gains"]["bulk_vs_per_unit"] > 0
    assert "request mode vs bio mode: +" in render_report(result)


def test_open_loop_spreads_bios_the_plug_window_cannot_join():
    spread = parse_trace(_sequential_writes(16, gap_ns=1_000_000))
    result = replay(spread, SOFTWARE, NONE_DEVICE, ReplayConfig())
    request = next(c for c in result["cells"] if c["dispatch_mode"] == "request")
    assert request["merges"] == 0


def test_closed_loop_depth_bounds_bios_in_flight():
    trace = parse_trace(_sequential_writes(32, gap_ns=1_000_000))
    shallow = replay(trace, OMAP_AES_AM335X, SDCARD_BBB, replace(CBC, loop="closed", iodepth=1))
    deep = replay(trace, OMAP_AES_AM335X, SDCARD_BBB, replace(CBC, loop="closed", iodepth=16))
    shallow_request = shallow["cells"][1]
    deep_request = deep["cells"][1]
    assert shallow_request["merges"] == 0  # each bio waits for the one before
    assert deep_request["merges"] > 0
    assert deep_request["modelled_mb_s"] > shallow_request["modelled_mb_s"]


def test_engine_that_cannot_run_the_cipher_is_refused():
    trace = parse_trace(_sequential_writes(2))
    with pytest.raises(InvalidInput, match="chain mode xts"):
        replay(trace, OMAP_AES_AM335X, SDCARD_BBB, ReplayConfig(cipher="aes-xts-plain64"))


def test_trace_without_data_bios_is_refused():
    with pytest.raises(InvalidInput, match="no read or write bios"):
        replay(parse_trace("junk\n"), SOFTWARE, NONE_DEVICE, ReplayConfig())


def test_bench_replay_command_prints_the_report_and_writes_csv(tmp_path):
    from typer.testing import CliRunner

    from app.cli import cli

    trace_file = tmp_path / "sdb.blkparse"
    trace_file.write_text(_sequential_writes(64) + "\nnot an event\n")
    csv_file = tmp_path / "cells.csv"
    result = CliRunner().invoke(
        cli,
        [
            "bench", "replay", str(trace_file), "--cipher", "aes-cbc-plain64",
            "--engine", "omap-aes-am335x", "--device-model", "sdcard-bbb",
            "--csv", str(csv_file),
        ],
    )  # fmt: skip
    assert result.exit_code == 0, result.output
    assert "request mode vs bio mode: +" in result.output
    assert "1 bad lines" in result.output
    assert "line 65: not an event" in result.output
    assert len(csv_file.read_text().splitlines()) == 5  # header and four cells


def test_replay_csv_carries_request_sizes_and_engine_calls_per_bio_as_the_json_does():
    result = replay(
        parse_trace(_sequential_writes(64) + "\n" + BLKPARSE), OMAP_AES_AM335X, SDCARD_BBB, CBC
    )
    rows = list(csv.DictReader(io.StringIO(cells_csv(result["cells"]))))
    assert len(rows) == len(result["cells"]) == 4
    for row, cell in zip(rows, result["cells"], strict=True):
        for column in ("engine_calls_per_bio", "wareq_sz", "rareq_sz", "p90_ms"):
            assert float(row[column]) == cell[column], column
    assert {float(row["rareq_sz"]) for row in rows} != {0.0}
    assert {float(row["wareq_sz"]) for row in rows} != {0.0}
    assert {float(row["engine_calls_per_bio"]) for row in rows} != {0.0}


def test_long_write_stream_runs_past_the_card_buffer_into_the_sustained_regime():
    short = parse_trace(_sequential_writes(64, nr_sectors=2048))  # 64 MiB
    long = parse_trace(_sequential_writes(128, nr_sectors=2048))  # 128 MiB
    short_cell = replay(short, OMAP_AES_AM335X, SDCARD_BBB, CBC)["cells"][1]
    long_cell = replay(long, OMAP_AES_AM335X, SDCARD_BBB, CBC)["cells"][1]
    assert short_cell["write_regime"] == "burst"
    assert long_cell["write_regime"] == "burst+sustained"
    assert long_cell["modelled_mb_s"] < short_cell["modelled_mb_s"]


def test_bios_of_one_instant_share_a_plug_even_with_no_window():
    together = parse_trace(_sequential_writes(8))  # one timestamp, as a batch records
    cell = replay(together, SOFTWARE, NONE_DEVICE, ReplayConfig(plug_window_us=0))["cells"][1]
    assert cell["requests"] == 1
