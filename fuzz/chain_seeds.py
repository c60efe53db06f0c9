#!/usr/bin/env python3
# SPDX-License-Identifier: Apache-2.0 OR BSD-3-Clause
"""Writes the seed corpus of the `chain` fuzz target into fuzz/corpus/chain/.

Input format (see fuzz_targets/chain.rs): a 16-byte header (queue size, descriptor table,
available ring and used ring offsets, next available and next used index, flags), then an
image of guest memory from GPA 0. Every seed uses a queue of 8: descriptor table at 0x000,
available ring at 0x080, used ring at 0x0a0, requests from 0x100, responses from 0x200.
"""
import os
import struct

NEXT, WRITE, INDIRECT = 1, 2, 4
EVENT_IDX, AVAIL_HIGH = 1, 4
SIZE, DESC, AVAIL, USED = 8, 0x000, 0x080, 0x0A0
OP_NOP, OP_STATS, OP_COPY = 0x00, 0x03, 0x10
SPACE_GPA, SPACE_DEVMEM = 0, 1
RESP = 32  # struct cxla_resp
STATS = 16 * 8  # struct cxla_stats


def desc(addr, length, flags=0, nxt=0):
    return struct.pack("<QIHH", addr, length, flags, nxt)


def hdr(opcode, tag):
    return struct.pack("<HHIQ", opcode, 0, 0, tag)


def sge(addr, length, space):
    return struct.pack("<QIHH", addr, length, space, 0)


def seed(descs, heads, data, flags=0, avail=AVAIL, next_avail=0, idx=None):
    """descs: descriptor table; heads: available ring; data: {gpa: bytes}."""
    image = bytearray(0x200)
    for i, d in enumerate(descs):
        image[DESC + 16 * i : DESC + 16 * (i + 1)] = d
    if avail < len(image):
        image[avail + 2 : avail + 4] = struct.pack("<H", len(heads) if idx is None else idx)
        for i, h in enumerate(heads):
            image[avail + 4 + 2 * i : avail + 6 + 2 * i] = struct.pack("<H", h)
    for gpa, b in data.items():
        if len(image) < gpa + len(b):
            image.extend(bytes(gpa + len(b) - len(image)))
        image[gpa : gpa + len(b)] = b
    header = struct.pack("<HHHHHHB3x", SIZE, DESC, avail, USED, next_avail, 0, flags)
    return header + bytes(image)


NOP_REQ = {0x100: hdr(OP_NOP, 1)}
SEEDS = {
    # Request, then the response buffer.
    "nop": seed([desc(0x100, 16, NEXT, 1), desc(0x200, RESP, WRITE)], [0], NOP_REQ),
    # Header and COPY record, the two scatter-gather entries, the response: 256 bytes of
    # guest RAM at 0x400 to device memory offset 0.
    "copy3": seed(
        [
            desc(0x100, 24, NEXT, 1),
            desc(0x140, 32, NEXT, 2),
            desc(0x200, RESP, WRITE),
        ],
        [0],
        {
            0x100: hdr(OP_COPY, 2) + struct.pack("<II", 1, 1),
            0x140: sge(0x400, 0x100, SPACE_GPA) + sge(0, 0x100, SPACE_DEVMEM),
            0x400: bytes(range(256)),
        },
    ),
    # One descriptor naming an indirect table of three: STATS, with its response and
    # counters split over two writable descriptors; EVENT_IDX on.
    "indirect": seed(
        [desc(0x300, 48, INDIRECT)],
        [0],
        {
            0x100: hdr(OP_STATS, 3),
            0x300: desc(0x100, 16, NEXT, 1)
            + desc(0x200, 64, WRITE | NEXT, 2)
            + desc(0x240, RESP + STATS - 64, WRITE),
        },
        flags=EVENT_IDX,
    ),
    # 0 -> 1 -> 0 -> ...: ends when the chain is as long as the queue.
    "loop": seed(
        [desc(0x100, 16, NEXT, 1), desc(0x200, RESP, WRITE | NEXT, 0)], [0], NOP_REQ
    ),
    # Head 200 in a queue of 8, then a valid NOP chain.
    "bad_head": seed(
        [desc(0x100, 16, NEXT, 1), desc(0x200, RESP, WRITE)], [200, 0], NOP_REQ
    ),
    # Available ring at the end of the high region: its index (0) says two requests are
    # pending from next_avail 0xfffe, whose entry lies past the region (the daemon used to
    # spin on it for ever).
    "avail_outside": seed(
        [desc(0x100, 16, NEXT, 1), desc(0x200, RESP, WRITE)],
        [],
        NOP_REQ,
        flags=AVAIL_HIGH,
        avail=0xFFF8,
        next_avail=0xFFFE,
    ),
    # The available ring's index is the used ring's flags word: the device's own
    # notification-flag writes move it (the daemon used to spin here too).
    "rings_overlap": seed(
        [desc(0x100, 16, NEXT, 1), desc(0x200, RESP, WRITE)],
        [0],
        NOP_REQ,
        avail=USED - 2,
        idx=1,
    ),
}

if __name__ == "__main__":
    out = os.path.join(os.path.dirname(os.path.abspath(__file__)), "corpus", "chain")
    os.makedirs(out, exist_ok=True)
    for name, data in SEEDS.items():
        with open(os.path.join(out, name), "wb") as f:
            f.write(data)
