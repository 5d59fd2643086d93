#!/usr/bin/env python3
"""Writes a JSON array of N pseudo-random lines mixing English, Chinese, Japanese, Korean,
Cyrillic/Arabic, emoji (with skin tones and ZWJ sequences), code, digits, white-space runs,
literal U+2581, combining marks and special-token text, for the tokenizer reference test
(tests/data/tokenizer_spm_test.cpp) and scripts/tokenizer_bench.sh. Deterministic for a seed.
    gen_tokenizer_text.py N OUT.json [SEED]"""
import json
import random
import sys

ENGLISH = ("The quick brown fox jumps over the lazy dog. It wasn't the fox's fault; they'd've said so. "
           "Tokenizers split text into pieces, and the model learns which pieces follow which. "
           "I'm sure you'll agree we're ready, aren't we? She'd know. ALL CAPS and MiXeD cAsE. "
           "Supercalifragilisticexpialidocious antidisestablishmentarianism pneumonoultramicroscopic.").split(" ")
CHINESE = ["中文字符", "和日本語", "我们今天去公园散步", "机器学习模型的训练", "分布式系统", "你好，世界！", "龘靐齉", "鑫"]
JAPANESE = ["日本語のテキスト", "こんにちは", "カタカナとひらがな", "東京都", "ｱｲｳｴｵ", "ありがとうございました。"]
OTHER = ["한국어도", "Привет, как дела?", "Ελληνικά γράμματα", "مرحبا بالعالم", "שלום", "café naïve résumé",
         "Ångström Straße", "e\u0301 a\u030a", "ﬁ ligature", "Ⅳ ² ½", "\u2581already\u2581metaspace",
         "ÿþ", "\u00a0nbsp\u00a0", "tab\tinside", "\u3000ideographic\u3000space"]
EMOJI = ["😀", "👍🏽", "👨‍👩‍👧‍👦", "🇯🇵", "❤️", "🤖", "🧪", "✨", "🫠", "🏳️‍🌈"]
CODE = ["def add(a, b):", "    return a + b  # sum", "for (int i = 0; i < n; ++i) { sum += v[i] * 2.5e-3; }",
        "if x == 0:\n\tprint(\"zero\")", "std::vector<int32_t> ids;", "<div class=\"x\">&amp;</div>",
        "SELECT * FROM t WHERE id = 42;", "x => x ** 2", "#include <cstdio>", "a_b__c___d", "λx.x"]
DIGITS = ["0", "7", "42", "1234567890", "3.14159", "-17", "1,000,000", "2024-01-31", "0x1F", "٣", "１２３"]
SPACES = [" ", "  ", "   ", "\t", "\t\t", " \t ", "\n", "\n\n", "    ", "\r\n", "      "]
SPECIAL = ["<s>", "</s>", "<unk>", "<s", "</s >", "< s>", "<s><s>", " <s> ", "</s></s>", "<unk><unk>"]


def line(rng):
    parts = []
    for _ in range(rng.randint(0, 14)):
        r = rng.random()
        if r < 0.30:
            w = rng.choice(ENGLISH)
        elif r < 0.40:
            w = rng.choice(CHINESE)
        elif r < 0.48:
            w = rng.choice(JAPANESE)
        elif r < 0.55:
            w = rng.choice(OTHER)
        elif r < 0.62:
            w = rng.choice(EMOJI)
        elif r < 0.72:
            w = rng.choice(CODE)
        elif r < 0.80:
            w = rng.choice(DIGITS)
        elif r < 0.86:
            w = rng.choice(SPECIAL)
        else:
            w = rng.choice(SPACES)
        parts.append(w)
        parts.append(rng.choice([" ", " ", " ", "", "  ", "\t", "\n"]) if rng.random() < 0.8 else "")
    return "".join(parts)


def main():
    n = int(sys.argv[1])
    rng = random.Random(int(sys.argv[3]) if len(sys.argv) > 3 else 1)
    lines = [line(rng) for _ in range(n)]
    with open(sys.argv[2], "w", encoding="utf-8") as f:
        json.dump(lines, f, ensure_ascii=False)


if __name__ == "__main__":
    main()
