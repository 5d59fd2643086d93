#!/usr/bin/env python3
# Test cases for dtrain's NFC (tests/data/unicode_nfc_test.cpp): a JSON list of
# [input, unicodedata.normalize('NFC', input)] pairs:
#  - every code point with a canonical decomposition or a non-zero combining class, as
#    itself and in NFD;
#  - decomposed characters followed by their marks and extra combining marks in random
#    orders (so canonical ordering and blocking decide the result);
#  - Hangul: every L V pair, random L V T triples, LV syllables followed by a T, lone jamo;
#  - random mixed strings of ASCII, Latin, Greek, Hangul, CJK, jamo, decomposable letters
#    and combining marks.
#   python3 scripts/gen_nfc_cases.py OUT.json [SEED] [RANDOM_STRINGS]
import json
import random
import sys
import unicodedata


def main():
    out = sys.argv[1]
    rng = random.Random(int(sys.argv[2]) if len(sys.argv) > 2 else 1)
    count = int(sys.argv[3]) if len(sys.argv) > 3 else 4000
    nfc = lambda s: unicodedata.normalize("NFC", s)
    nfd = lambda s: unicodedata.normalize("NFD", s)
    special, marks = [], []
    for cp in range(0x110000):
        if 0xD800 <= cp <= 0xDFFF:
            continue
        c = chr(cp)
        d = unicodedata.decomposition(c)
        if unicodedata.combining(c):
            marks.append(c)
            special.append(c)
        elif d and not d.startswith("<"):
            special.append(c)
    inputs = []
    for c in special:
        inputs += [c, nfd(c), "a" + nfd(c) + "b"]
    for _ in range(count):  # a decomposed letter, its marks shuffled with 1-4 others
        base = nfd(rng.choice(special))
        seq = list(base[1:]) + [rng.choice(marks) for _ in range(rng.randint(1, 4))]
        rng.shuffle(seq)
        inputs.append(base[0] + "".join(seq))
    L = [chr(0x1100 + i) for i in range(19)]
    V = [chr(0x1161 + i) for i in range(21)]
    T = [chr(0x11A8 + i) for i in range(27)]
    inputs += [l + v for l in L for v in V]
    for _ in range(count // 4):
        inputs.append(rng.choice(L) + rng.choice(V) + rng.choice(T))
        inputs.append(chr(0xAC00 + 28 * rng.randrange(399)) + rng.choice(T))  # LV + T
        inputs.append(chr(0xAC00 + rng.randrange(11172)) + rng.choice(T))     # LVT + T: no composition
        inputs.append(rng.choice(V + T) + rng.choice(L) + rng.choice(T + V + L))
    pools = [
        [chr(c) for c in range(0x20, 0x7F)],
        [chr(c) for c in range(0xC0, 0x250)],
        [chr(c) for c in range(0x370, 0x400)],
        [chr(c) for c in range(0xAC00, 0xAC00 + 11172, 7)],
        [chr(c) for c in range(0x4E00, 0x4E80)],
        L + V + T, special, marks,
    ]
    for _ in range(count):
        inputs.append("".join(rng.choice(rng.choice(pools)) for _ in range(rng.randint(1, 24))))
    json.dump([[s, nfc(s)] for s in inputs], open(out, "w"))


if __name__ == "__main__":
    main()
