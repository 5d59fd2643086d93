#!/usr/bin/env python3
"""Independent reader of the TensorBoard event files dtrain writes, for its tests.

    tfevents_read.py LOGDIR [--metrics METRICS_JSONL] [--allow-torn-tail]

Shares no code with the writer: it parses the TFRecord framing itself, recomputes both
masked CRC32C checksums of every record with its own CRC32C (table-driven, Castagnoli
polynomial), decodes the Event / Summary / SessionLog protobuf wire format by hand (field
numbers of TensorFlow's event.proto and summary.proto) and replays the files the way
TensorBoard does: files in name order, each starting with file_version "brain.Event:2",
and a SessionLog START at step S dropping the points read before it whose step is >= S.

With --metrics, every scalar must match the run's metrics.jsonl: the same steps per tag
(train/loss, train/lr, train/grad_norm, train/tokens_per_s, and train/loss_scale,
train/comm_bytes_sent and train/comm_seconds where present, and train/<name> for each name a
training record lists in "extra_metrics"; eval/loss and eval/ppl from the eval records), each
value the record's value rounded to float32, each wall_time the record's time_ms / 1000.

Prints one JSON object on stdout: {"ok": true, "files": [...], "records": N, "sessions":
[start steps], "purged": N, "scalars": {tag: [[step, value, wall_time], ...]},
"metrics_checked": N, "torn_tail": [...]}, exit 0; or {"ok": false, "error": "..."} (also
on stderr), exit 1. A record cut short at the end of a file (a killed writer) is an error
unless --allow-torn-tail, which keeps every complete record before it.
"""

import json
import math
import os
import struct
import sys


class FormatError(Exception):
    pass


# ---------------------------------------------------------------------------
# CRC-32C: reflected Castagnoli polynomial 0x82F63B78, init and final xor 0xffffffff.

def _crc_table():
    table = []
    for i in range(256):
        c = i
        for _ in range(8):
            c = (c >> 1) ^ 0x82F63B78 if c & 1 else c >> 1
        table.append(c)
    return table


_TABLE = _crc_table()


def crc32c(data):
    c = 0xFFFFFFFF
    for b in data:
        c = _TABLE[(c ^ b) & 0xFF] ^ (c >> 8)
    return c ^ 0xFFFFFFFF


def masked(crc):
    return ((((crc >> 15) | (crc << 17)) & 0xFFFFFFFF) + 0xA282EAD8) & 0xFFFFFFFF


# ---------------------------------------------------------------------------
# TFRecord framing: u64 length, u32 masked crc of the length bytes, data, u32 masked crc
# of the data, all little-endian.

def records(path, allow_torn_tail):
    """The data of every record of path; (records, torn_offset or None)."""
    with open(path, "rb") as f:
        buf = f.read()
    out = []
    off = 0
    while off < len(buf):
        if len(buf) - off < 12:
            return _torn(path, off, len(buf) - off, "its header", out, allow_torn_tail)
        (length,) = struct.unpack_from("<Q", buf, off)
        (length_crc,) = struct.unpack_from("<I", buf, off + 8)
        want = masked(crc32c(buf[off:off + 8]))
        if length_crc != want:
            raise FormatError("%s: record %d at offset %d: length checksum mismatch (stored 0x%08x, computed 0x%08x)"
                              % (path, len(out), off, length_crc, want))
        end = off + 12 + length + 4
        if end > len(buf):
            return _torn(path, off, len(buf) - off, "%d data bytes" % length, out, allow_torn_tail)
        data = buf[off + 12:off + 12 + length]
        (data_crc,) = struct.unpack_from("<I", buf, off + 12 + length)
        want = masked(crc32c(data))
        if data_crc != want:
            raise FormatError("%s: record %d at offset %d: data checksum mismatch (stored 0x%08x, computed 0x%08x)"
                              % (path, len(out), off, data_crc, want))
        out.append(data)
        off = end
    return out, None


def _torn(path, off, have, what, out, allow):
    if not allow:
        raise FormatError("%s: record %d at offset %d is truncated: %d bytes left, short of %s"
                          % (path, len(out), off, have, what))
    return out, off


# ---------------------------------------------------------------------------
# Protobuf wire format: (field number, wire type, value) triples; varints as int, fixed64
# and fixed32 as their 8 / 4 bytes, length-delimited as bytes.

def _varint(buf, pos):
    result = shift = 0
    while True:
        if pos >= len(buf):
            raise FormatError("varint runs past the end of the message")
        b = buf[pos]
        pos += 1
        result |= (b & 0x7F) << shift
        if not b & 0x80:
            return result, pos
        shift += 7
        if shift >= 64:
            raise FormatError("varint longer than 10 bytes")


def fields(buf):
    pos = 0
    while pos < len(buf):
        key, pos = _varint(buf, pos)
        number, wire = key >> 3, key & 7
        if wire == 0:
            value, pos = _varint(buf, pos)
        elif wire == 1:
            value, pos = buf[pos:pos + 8], pos + 8
        elif wire == 2:
            n, pos = _varint(buf, pos)
            value, pos = buf[pos:pos + n], pos + n
        elif wire == 5:
            value, pos = buf[pos:pos + 4], pos + 4
        else:
            raise FormatError("field %d has unsupported wire type %d" % (number, wire))
        if pos > len(buf):
            raise FormatError("field %d runs past the end of the message" % number)
        yield number, wire, value


def _expect(number, wire, want, message):
    if wire != want:
        raise FormatError("%s field %d has wire type %d, expected %d" % (message, number, wire, want))


def decode_event(data):
    """Event {wall_time = 1 (double), step = 2 (int64), file_version = 3, summary = 5,
    session_log = 7}; anything else dtrain never writes is an error."""
    ev = {"wall_time": 0.0, "step": 0}
    for number, wire, value in fields(data):
        if number == 1:
            _expect(number, wire, 1, "Event")
            ev["wall_time"] = struct.unpack("<d", value)[0]
        elif number == 2:
            _expect(number, wire, 0, "Event")
            ev["step"] = value - (1 << 64) if value >= 1 << 63 else value
        elif number == 3:
            _expect(number, wire, 2, "Event")
            ev["file_version"] = value.decode("utf-8")
        elif number == 5:
            _expect(number, wire, 2, "Event")
            ev["summary"] = decode_summary(value)
        elif number == 7:
            _expect(number, wire, 2, "Event")
            ev["session_log"] = decode_session_log(value)
        else:
            raise FormatError("Event has unexpected field %d" % number)
    if sum(k in ev for k in ("file_version", "summary", "session_log")) > 1:
        raise FormatError("Event sets more than one field of its 'what' oneof")
    return ev


def decode_summary(data):
    """Summary {repeated Value value = 1}; Value {tag = 1, simple_value = 2 (float)}."""
    values = []
    for number, wire, value in fields(data):
        if number != 1:
            raise FormatError("Summary has unexpected field %d" % number)
        _expect(number, wire, 2, "Summary")
        v = {}
        for n2, w2, x in fields(value):
            if n2 == 1:
                _expect(n2, w2, 2, "Summary.Value")
                v["tag"] = x.decode("utf-8")
            elif n2 == 2:
                _expect(n2, w2, 5, "Summary.Value")
                v["simple_value"] = struct.unpack("<f", x)[0]
            else:
                raise FormatError("Summary.Value has unexpected field %d" % n2)
        if "tag" not in v or "simple_value" not in v:
            raise FormatError("Summary.Value without a tag or a simple_value: %r" % v)
        values.append(v)
    return values


def decode_session_log(data):
    status = 0
    for number, wire, value in fields(data):
        if number != 1:
            raise FormatError("SessionLog has unexpected field %d" % number)
        _expect(number, wire, 0, "SessionLog")
        status = value
    return {"status": status}


SESSION_START = 1


# ---------------------------------------------------------------------------
# A log directory replayed as TensorBoard reads it.

def read_dir(logdir, allow_torn_tail):
    names = sorted(n for n in os.listdir(logdir) if "tfevents" in n)
    if not names:
        raise FormatError("%s: no event files (events.out.tfevents.*)" % logdir)
    scalars = {}
    sessions, torn = [], []
    nrec = purged = 0
    for name in names:
        path = os.path.join(logdir, name)
        datas, torn_at = records(path, allow_torn_tail)
        if torn_at is not None:
            torn.append({"file": name, "offset": torn_at})
        for i, data in enumerate(datas):
            try:
                ev = decode_event(data)
            except FormatError as e:
                raise FormatError("%s: record %d: %s" % (path, i, e))
            nrec += 1
            if i == 0:
                if ev.get("file_version") != "brain.Event:2":
                    raise FormatError("%s: the first record is not file_version brain.Event:2: %r" % (path, ev))
                continue
            if "file_version" in ev:
                raise FormatError("%s: record %d repeats file_version" % (path, i))
            if "session_log" in ev and ev["session_log"]["status"] == SESSION_START:
                start = ev["step"]
                sessions.append(start)
                for tag in scalars:
                    kept = [p for p in scalars[tag] if p[0] < start]
                    purged += len(scalars[tag]) - len(kept)
                    scalars[tag] = kept
            for v in ev.get("summary", []):
                scalars.setdefault(v["tag"], []).append([ev["step"], v["simple_value"], ev["wall_time"]])
    return {"files": names, "records": nrec, "sessions": sessions, "purged": purged, "scalars": scalars,
            "torn_tail": torn}


# ---------------------------------------------------------------------------
# Against metrics.jsonl.

TRAIN_TAGS = {"loss": "train/loss", "lr": "train/lr", "grad_norm": "train/grad_norm",
              "tokens_per_s": "train/tokens_per_s", "loss_scale": "train/loss_scale",
              "comm_bytes_sent": "train/comm_bytes_sent", "comm_seconds": "train/comm_seconds"}
EVAL_TAGS = {"eval_loss": "eval/loss", "eval_ppl": "eval/ppl"}


def as_f32(x):
    return struct.unpack("<f", struct.pack("<f", x))[0]


def same(a, b):
    return (math.isnan(a) and math.isnan(b)) or a == b


def check_metrics(result, metrics_path):
    with open(metrics_path) as f:
        rows = [json.loads(line) for line in f if line.strip()]
    want = {}  # tag -> [(step, value or None for JSON null, time_ms)]
    for r in rows:
        table = TRAIN_TAGS if "loss" in r else EVAL_TAGS if "eval_loss" in r else {}
        for key, tag in table.items():
            if key == "loss_scale" and tag not in result["scalars"]:
                continue  # written with fp16 only
            if key.startswith("comm_") and key not in r:
                continue  # written with several ranks only
            want.setdefault(tag, []).append((r["step"], r[key], r["time_ms"]))
        if "loss" in r:
            # The step's named metrics: top-level keys listed in "extra_metrics", as train/<name>.
            for name in r.get("extra_metrics", []):
                want.setdefault("train/" + name, []).append((r["step"], r[name], r["time_ms"]))
    got = result["scalars"]
    if sorted(want) != sorted(got):
        raise FormatError("tags differ: event files %s, metrics.jsonl %s" % (sorted(got), sorted(want)))
    checked = 0
    for tag, rows in want.items():
        steps_got, steps_want = [p[0] for p in got[tag]], [r[0] for r in rows]
        if steps_got != steps_want:
            raise FormatError("%s: steps differ: event files %s, metrics.jsonl %s" % (tag, steps_got, steps_want))
        for (step, value, wall), (_, expect, time_ms) in zip(got[tag], rows):
            # metrics.jsonl writes inf/NaN as null; the event file keeps the float.
            ok = not math.isfinite(value) if expect is None else same(value, as_f32(expect))
            if not ok:
                raise FormatError("%s at step %d: event file %r, metrics.jsonl %r" % (tag, step, value, expect))
            if round(wall * 1000) != time_ms:
                raise FormatError("%s at step %d: wall_time %r is not time_ms %d / 1000" % (tag, step, wall, time_ms))
            checked += 1
    return checked


def main(argv):
    args, metrics, allow = [], None, False
    it = iter(argv)
    for a in it:
        if a == "--metrics":
            metrics = next(it, None)
        elif a == "--allow-torn-tail":
            allow = True
        else:
            args.append(a)
    if len(args) != 1 or (metrics is None and "--metrics" in argv):
        sys.stderr.write("usage: tfevents_read.py LOGDIR [--metrics METRICS_JSONL] [--allow-torn-tail]\n")
        return 2
    try:
        result = read_dir(args[0], allow)
        result["metrics_checked"] = check_metrics(result, metrics) if metrics else 0
    except (FormatError, OSError, ValueError, KeyError) as e:
        msg = "%s: %s" % (type(e).__name__, e)
        sys.stderr.write("tfevents_read: %s\n" % msg)
        print(json.dumps({"ok": False, "error": msg}))
        return 1
    result["ok"] = True
    # JSON has no inf/NaN: such values are written as the strings "inf", "-inf", "nan".
    for points in result["scalars"].values():
        for p in points:
            if not math.isfinite(p[1]):
                p[1] = str(p[1])
    print(json.dumps(result))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
