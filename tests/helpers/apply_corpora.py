"""Generate specs/data/tiny-corpus.txt and specs/data/sentiment.{csv,jsonl} deterministically.

The committed files are the artefacts; this script documents where they came from and
a test checks that it reproduces them byte for byte. Run: python tests/helpers/apply_corpora.py
The prose is template-generated from a seeded random.Random (stable across CPython 3.x),
so it is original text with no licence attached, and regular enough that a tiny
byte-level model's loss falls clearly within a couple of hundred steps.
"""

from __future__ import annotations

import csv
import io
import json
import os
import random

DATA_DIR = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "specs", "data")

PEOPLE = [
    "the miller",
    "the old shepherd",
    "the baker's daughter",
    "a young clerk",
    "the schoolmaster",
    "the ferryman",
    "my grandmother",
    "the blacksmith",
    "a travelling tinker",
    "the widow Hale",
    "the vicar",
    "two fishermen",
    "the innkeeper",
    "a tired soldier",
    "the children",
]
PLACES = [
    "the village green",
    "the mill by the river",
    "the long road to town",
    "the harbour",
    "the church on the hill",
    "the market square",
    "the edge of the wood",
    "the narrow bridge",
    "the orchard",
    "the inn at the crossroads",
    "the quiet lane",
    "the top of the cliff",
]
TIMES = [
    "In the morning",
    "Before dawn",
    "At noon",
    "Late in the evening",
    "On the first day of spring",
    "When the harvest was in",
    "Every Sunday",
    "In the winter",
    "After the storm",
    "At dusk",
]
VERBS = [
    "walked to",
    "looked across",
    "waited by",
    "spoke of",
    "remembered",
    "hurried past",
    "sang about",
    "came back to",
    "dreamed of",
    "wrote a letter about",
]
ADJS = ["grey", "quiet", "bright", "cold", "green", "crooked", "warm", "empty", "busy", "ancient", "small"]
NOUNS = ["rain", "wind", "bread", "lamp", "boat", "bell", "garden", "letter", "horse", "fire", "river", "road"]
FEELINGS = ["glad", "weary", "hopeful", "uneasy", "content", "restless", "proud", "sorry"]
CONNECT = ["and", "but", "so", "because", "while"]


def _sentence(r: random.Random) -> str:
    kind = r.randrange(6)
    p, q = r.choice(PEOPLE), r.choice(PEOPLE)
    if kind == 0:
        s = f"{r.choice(TIMES)}, {p} {r.choice(VERBS)} {r.choice(PLACES)}."
    elif kind == 1:
        s = f"{p} said that the {r.choice(NOUNS)} was {r.choice(ADJS)}, {r.choice(CONNECT)} {q} was {r.choice(FEELINGS)}."
    elif kind == 2:
        s = f"The {r.choice(ADJS)} {r.choice(NOUNS)} stood near {r.choice(PLACES)}, and nobody knew why."
    elif kind == 3:
        s = f'"Will you bring the {r.choice(NOUNS)}?" asked {p}. "I will," said {q}, "if the {r.choice(NOUNS)} is {r.choice(ADJS)}."'
    elif kind == 4:
        s = f"{p} was {r.choice(FEELINGS)}, for the {r.choice(NOUNS)} had come back to {r.choice(PLACES)}."
    else:
        s = f"{r.choice(TIMES)} the {r.choice(NOUNS)} was {r.choice(ADJS)} {r.choice(CONNECT)} the {r.choice(NOUNS)} was {r.choice(ADJS)}."
    return s[0].upper() + s[1:]


def tiny_corpus(target_bytes: int = 300_000, seed: int = 1234) -> str:
    r = random.Random(seed)
    paragraphs, size = [], 0
    while size < target_bytes:
        para = " ".join(_sentence(r) for _ in range(r.randint(3, 7)))
        paragraphs.append(para)
        size += len(para) + 1
    return "\n".join(paragraphs) + "\n"


GOOD = ["wonderful", "delicious", "friendly", "excellent", "lovely", "fresh", "perfect", "charming", "great"]
BAD = ["awful", "cold", "rude", "terrible", "stale", "dirty", "boring", "disappointing", "bland"]
THINGS = ["soup", "service", "bread", "room", "view", "coffee", "music", "staff", "garden", "pie", "tea", "price"]
OPEN = ["", "Honestly, ", "I think ", "Sadly, ", "To be fair, ", "Overall, "]
CLOSE = ["", " I would come back.", " Never again.", " Worth the trip.", " What a day."]


def sentiment_rows(n: int = 400, seed: int = 99) -> list[dict[str, str]]:
    r = random.Random(seed)
    rows = []
    for i in range(n):
        positive = i % 2 == 0
        words = GOOD if positive else BAD
        text = f"{r.choice(OPEN)}the {r.choice(THINGS)} was {r.choice(words)} and the {r.choice(THINGS)} was {r.choice(words)}."
        closer = r.choice(CLOSE[:4] if positive else [CLOSE[0], CLOSE[2], CLOSE[4]])
        text = (text[0].upper() + text[1:] + closer).strip()
        rows.append({"text": text, "label": "positive" if positive else "negative"})
    return rows


def sentiment_csv(rows: list[dict[str, str]]) -> str:
    buf = io.StringIO()
    w = csv.DictWriter(buf, fieldnames=["text", "label"], lineterminator="\n")
    w.writeheader()
    w.writerows(rows)
    return buf.getvalue()


def sentiment_jsonl(rows: list[dict[str, str]]) -> str:
    return "".join(json.dumps(row) + "\n" for row in rows)


def expected_files() -> dict[str, str]:
    rows = sentiment_rows()
    return {
        "tiny-corpus.txt": tiny_corpus(),
        "sentiment.csv": sentiment_csv(rows),
        "sentiment.jsonl": sentiment_jsonl(rows),
    }


if __name__ == "__main__":
    os.makedirs(DATA_DIR, exist_ok=True)
    for name, text in expected_files().items():
        with open(os.path.join(DATA_DIR, name), "w", encoding="utf-8", newline="") as f:
            f.write(text)
        print(f"wrote specs/data/{name} ({len(text.encode()):,} bytes)")
