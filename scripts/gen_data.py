#!/usr/bin/env python3
"""Generates dtrain's shipped tiny datasets (python3 standard library only).

Deterministic: a fixed seed (SEED below) gives byte-identical files on every run.
Run from anywhere:  python3 scripts/gen_data.py   (rewrites the files listed below)

configs/data/tasks/{train,valid}.jsonl
    SFT records in Alpaca form {"instruction", "input", "output"} whose answers can be
    checked exactly (dtrain::data::sft_answer_matches): addition, subtraction and
    multiplication of small numbers, and string tasks on short words (reverse,
    uppercase, count letters, count one letter, sort letters). About half the records
    put the operand in "input", the rest have an empty input. 4000 train / 200 valid;
    no valid (instruction, input) pair occurs in train.
configs/data/basics/{train,valid}.jsonl
    The default job's data (configs/tiny-sft.yaml): tasks a tiny model learns within a
    minute of CPU training, from fixed places in the prompt (BASICS_TASKS below, e.g. is
    a number even or odd, which of two digits is larger, the sum of two digits). The
    answers are a few facts in several phrasings, so training records repeat; no valid
    (instruction, input) pair occurs in train. 4000 train / about 200 valid, generated
    from their own seed (BASICS_SEED) after the files above, which stay as they were.
configs/data/preference/ (dataset_info.json, train_alpaca.json, train_sharegpt.json, valid.jsonl)
    The preference version of the basics: LLaMA-Factory ranking datasets whose chosen
    answer is the right one and rejected a wrong one (the other parity, a number off by
    1-3, another letter). The first PREF_TRAIN basics train records become pairs, half
    alpaca-shaped (instruction/input/chosen/rejected, every fifth with a system prompt)
    in train_alpaca.json, half sharegpt-shaped (conversations ending with the question,
    chosen/rejected gpt messages, every fifth after an earlier answered question) in
    train_sharegpt.json; the basics valid records become valid.jsonl (alpaca-shaped, no
    system or history), held out as they are. Wrong answers from their own seed
    (PREF_SEED); the files above stay as they were.
configs/data/text/{train,valid}.txt
    A plain-text pre-training corpus: paragraphs (documents separated by one blank
    line, the default of `dtrain data prepare --format text`) of templated sentences
    stating the same facts as prose. About 300 KB train / 30 KB valid.
"""

import json
import os
import random

SEED = 20240531
N_TRAIN = 4000
N_VALID = 200
TEXT_TRAIN_BYTES = 300_000
TEXT_VALID_BYTES = 30_000

WORDS = """
apple river stone cloud table green music paper light water house bread tiger
chair horse plant smile dream ocean piano lemon grape mouse snake eagle tulip
candy storm flame frost beach cabin field forest garden island jungle meadow
planet rocket silver spider summer winter autumn spring yellow purple orange
basket bottle button camera candle carpet circle copper dragon engine finger
flower guitar hammer helmet jacket kettle ladder magnet mirror needle parrot
pencil pepper pillow pocket puzzle rabbit ribbon saddle shadow shovel sister
spoon tomato turtle violin wallet window zebra anchor bridge castle desert
falcon ginger harbor igloo jewel koala lantern marble nickel onion pirate quilt
radar salad tunnel umbrella valley walrus yogurt zipper cat dog sun moon star
tree bird fish frog bear wolf lamb duck goat crab king queen ring bell lamp
book door road hill lake rain snow wind fire gold iron salt sand rose leaf
""".split()

SYLLABLES = ["ba", "ko", "mi", "ra", "te", "lu", "no", "pi", "sa", "ve", "du", "ze",
             "fa", "go", "hi", "ju", "ke", "lo", "me", "ni", "po", "qu", "ri", "su"]


def make_word(rng):
    if rng.random() < 0.6:
        return rng.choice(WORDS)
    return "".join(rng.choice(SYLLABLES) for _ in range(rng.randint(2, 3)))


# ---------------------------------------------------------------------------
# SFT tasks: each returns (instruction, input, output). Instructions come in several
# phrasings; when use_input is true the operands move to the "input" field.

def task_add(rng, use_input):
    a, b = rng.randint(0, 99), rng.randint(0, 99)
    if use_input:
        return rng.choice(["Add the two numbers.", "What is the sum of these numbers?"]), f"{a} {b}", str(a + b)
    return rng.choice([f"Add {a} and {b}.", f"What is {a} + {b}?", f"Compute the sum of {a} and {b}."]), "", str(a + b)


def task_sub(rng, use_input):
    a, b = rng.randint(0, 99), rng.randint(0, 99)
    a, b = max(a, b), min(a, b)
    if use_input:
        return rng.choice(["Subtract the second number from the first.",
                           "What is the difference of these numbers?"]), f"{a} {b}", str(a - b)
    return rng.choice([f"Subtract {b} from {a}.", f"What is {a} - {b}?", f"Compute {a} minus {b}."]), "", str(a - b)


def task_mul(rng, use_input):
    a, b = rng.randint(2, 12), rng.randint(2, 12)
    if use_input:
        return rng.choice(["Multiply the two numbers.", "What is the product of these numbers?"]), f"{a} {b}", str(a * b)
    return rng.choice([f"Multiply {a} by {b}.", f"What is {a} * {b}?", f"Compute {a} times {b}."]), "", str(a * b)


def task_reverse(rng, use_input):
    w = make_word(rng)
    if use_input:
        return "Reverse the word.", w, w[::-1]
    return rng.choice([f"Reverse the word '{w}'.", f"Write '{w}' backwards."]), "", w[::-1]


def task_upper(rng, use_input):
    w = make_word(rng)
    if use_input:
        return "Write the word in uppercase.", w, w.upper()
    return rng.choice([f"Write '{w}' in uppercase.", f"Convert '{w}' to capital letters."]), "", w.upper()


def task_count(rng, use_input):
    w = make_word(rng)
    if use_input:
        return "How many letters are in the word?", w, str(len(w))
    return rng.choice([f"How many letters are in '{w}'?", f"Count the letters of '{w}'."]), "", str(len(w))


def task_count_letter(rng, use_input):
    w = make_word(rng)
    c = rng.choice(w) if rng.random() < 0.8 else rng.choice("aeiouxyz")
    if use_input:
        return f"How many times does the letter '{c}' appear in the word?", w, str(w.count(c))
    return f"How many times does the letter '{c}' appear in '{w}'?", "", str(w.count(c))


def task_sort(rng, use_input):
    w = make_word(rng)
    if use_input:
        return "Sort the letters of the word alphabetically.", w, "".join(sorted(w))
    return rng.choice([f"Sort the letters of '{w}' alphabetically.",
                       f"Write the letters of '{w}' in alphabetical order."]), "", "".join(sorted(w))


TASKS = [task_add, task_sub, task_mul, task_reverse, task_upper, task_count, task_count_letter, task_sort]


# The default job's tasks: each answer depends on one or two fixed places of the prompt.
def task_parity(rng, use_input):
    a = rng.randint(0, 999)
    answer = "even" if a % 2 == 0 else "odd"
    if use_input:
        return "Is the number even or odd?", str(a), answer
    return rng.choice([f"Is {a} even or odd?", f"Is the number {a} odd or even?"]), "", answer


def task_add_digits(rng, use_input):
    a, b = rng.randint(0, 9), rng.randint(0, 9)
    if use_input:
        return rng.choice(["Add the two numbers.", "What is the sum of these numbers?"]), f"{a} {b}", str(a + b)
    return rng.choice([f"What is {a} + {b}?", f"Add {a} and {b}."]), "", str(a + b)


def task_larger_digit(rng, use_input):
    a, b = rng.sample(range(10), 2)
    if use_input:
        return "Which of the two numbers is larger?", f"{a} {b}", str(max(a, b))
    return rng.choice([f"Which is larger, {a} or {b}?", f"What is the larger of {a} and {b}?"]), "", str(max(a, b))


def task_last_letter(rng, use_input):
    w = make_word(rng)
    if use_input:
        return "What is the last letter of the word?", w, w[-1]
    return rng.choice([f"What is the last letter of '{w}'?", f"Give the last letter of '{w}'."]), "", w[-1]


BASICS_SEED = 7
BASICS_TASKS = [task_parity, task_add_digits, task_larger_digit, task_last_letter]


def make_records(rng, n):
    seen, records = set(), []
    while len(records) < n:
        task = TASKS[len(records) % len(TASKS)]
        instruction, inp, out = task(rng, rng.random() < 0.5)
        if (instruction, inp) in seen:
            continue
        seen.add((instruction, inp))
        records.append({"instruction": instruction, "input": inp, "output": out})
    rng.shuffle(records)
    return records


def make_basics(rng, n_train, n_valid, tasks):
    # valid first: distinct (instruction, input) pairs, an equal share per task; then train,
    # which may repeat a pair (the tasks have few) but never holds a valid one.
    per = n_valid // len(tasks)
    valid, keys = [], set()
    for task in tasks:
        k = 0
        while k < per:
            instruction, inp, out = task(rng, rng.random() < 0.5)
            if (instruction, inp) in keys:
                continue
            keys.add((instruction, inp))
            valid.append({"instruction": instruction, "input": inp, "output": out})
            k += 1
    train = []
    while len(train) < n_train:
        instruction, inp, out = tasks[len(train) % len(tasks)](rng, rng.random() < 0.5)
        if (instruction, inp) not in keys:
            train.append({"instruction": instruction, "input": inp, "output": out})
    rng.shuffle(valid)
    rng.shuffle(train)
    return train, valid


# ---------------------------------------------------------------------------
# Text corpus: paragraphs of facts stated as prose.

def sentence(rng):
    k = rng.randrange(10)
    a, b = rng.randint(0, 99), rng.randint(0, 99)
    w = make_word(rng)
    if k == 0:
        return f"The sum of {a} and {b} is {a + b}."
    if k == 1:
        a, b = max(a, b), min(a, b)
        return f"If you take {b} away from {a}, you are left with {a - b}."
    if k == 2:
        x, y = rng.randint(2, 12), rng.randint(2, 12)
        return f"{x} times {y} equals {x * y}."
    if k == 3:
        return f"The word {w} written backwards is {w[::-1]}."
    if k == 4:
        return f"In capital letters, {w} is written {w.upper()}."
    if k == 5:
        return f"The word {w} has {len(w)} letters."
    if k == 6:
        return f"Sorted alphabetically, the letters of {w} read {''.join(sorted(w))}."
    if k == 7:
        v = make_word(rng)
        return f"The {w} sat next to the {v} near the {rng.choice(WORDS)}."
    if k == 8:
        return f"Every {w} likes a quiet {rng.choice(WORDS)} in the {rng.choice(['morning', 'evening', 'night'])}."
    return f"Counting from {a}, the next three numbers are {a + 1}, {a + 2} and {a + 3}."


def make_text(rng, target_bytes):
    paragraphs, size = [], 0
    while size < target_bytes:
        p = " ".join(sentence(rng) for _ in range(rng.randint(3, 6)))
        paragraphs.append(p)
        size += len(p) + 2
    return "\n\n".join(paragraphs) + "\n"


# ---------------------------------------------------------------------------

def write(path, text):
    os.makedirs(os.path.dirname(path), exist_ok=True)
    with open(path, "w", encoding="utf-8", newline="\n") as f:
        f.write(text)


# ---------------------------------------------------------------------------
# Preference pairs: the basics with a wrong answer to reject.

PREF_SEED = 11
PREF_TRAIN = 2000
PREF_SYSTEM = "Answer with one word or number."


def wrong_answer(rng, answer):
    if answer in ("even", "odd"):
        return "odd" if answer == "even" else "even"
    if answer.isdigit():
        v = int(answer)
        w = v + rng.choice([-3, -2, -1, 1, 2, 3])
        return str(w if w >= 0 else v + rng.randint(1, 3))
    return rng.choice([c for c in "abcdefghijklmnopqrstuvwxyz" if c != answer])


def make_preference(rng, train, valid):
    records = train[:PREF_TRAIN]
    half = len(records) // 2
    alpaca, sharegpt = [], []
    for i, r in enumerate(records[:half]):
        p = {"instruction": r["instruction"], "input": r["input"], "chosen": r["output"],
             "rejected": wrong_answer(rng, r["output"])}
        if i % 5 == 4:
            p["system"] = PREF_SYSTEM
        alpaca.append(p)
    question = lambda r: r["instruction"] + ("\n" + r["input"] if r["input"] else "")
    for i, r in enumerate(records[half:]):
        turns = []
        if i % 5 == 4:
            earlier = records[half + i - 1]
            turns += [{"from": "human", "value": question(earlier)}, {"from": "gpt", "value": earlier["output"]}]
        turns.append({"from": "human", "value": question(r)})
        sharegpt.append({"conversations": turns, "chosen": {"from": "gpt", "value": r["output"]},
                         "rejected": {"from": "gpt", "value": wrong_answer(rng, r["output"])}})
    held_out = [{"instruction": r["instruction"], "input": r["input"], "chosen": r["output"],
                 "rejected": wrong_answer(rng, r["output"])} for r in valid]
    info = {
        "basics_pref_alpaca": {"file_name": "train_alpaca.json", "ranking": True,
                               "columns": {"prompt": "instruction", "query": "input", "chosen": "chosen",
                                           "rejected": "rejected", "system": "system"}},
        "basics_pref_sharegpt": {"file_name": "train_sharegpt.json", "formatting": "sharegpt", "ranking": True,
                                 "columns": {"messages": "conversations", "chosen": "chosen",
                                             "rejected": "rejected"}},
        "basics_pref_valid": {"file_name": "valid.jsonl", "ranking": True,
                              "columns": {"prompt": "instruction", "query": "input", "chosen": "chosen",
                                          "rejected": "rejected"}},
    }
    return info, alpaca, sharegpt, held_out


def main():
    root = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "configs", "data")
    rng = random.Random(SEED)
    records = make_records(rng, N_TRAIN + N_VALID)
    valid, train = records[:N_VALID], records[N_VALID:]
    dump = lambda rs: "".join(json.dumps(r, ensure_ascii=False) + "\n" for r in rs)
    write(os.path.join(root, "tasks", "train.jsonl"), dump(train))
    write(os.path.join(root, "tasks", "valid.jsonl"), dump(valid))
    write(os.path.join(root, "text", "train.txt"), make_text(rng, TEXT_TRAIN_BYTES))
    write(os.path.join(root, "text", "valid.txt"), make_text(rng, TEXT_VALID_BYTES))
    basics_train, basics_valid = make_basics(random.Random(BASICS_SEED), N_TRAIN, N_VALID, BASICS_TASKS)
    write(os.path.join(root, "basics", "train.jsonl"), dump(basics_train))
    write(os.path.join(root, "basics", "valid.jsonl"), dump(basics_valid))
    info, alpaca, sharegpt, held_out = make_preference(random.Random(PREF_SEED), basics_train, basics_valid)
    pretty = lambda v: json.dumps(v, ensure_ascii=False, indent=2) + "\n"
    write(os.path.join(root, "preference", "dataset_info.json"), pretty(info))
    write(os.path.join(root, "preference", "train_alpaca.json"), pretty(alpaca))
    write(os.path.join(root, "preference", "train_sharegpt.json"), pretty(sharegpt))
    write(os.path.join(root, "preference", "valid.jsonl"), dump(held_out))


if __name__ == "__main__":
    main()
