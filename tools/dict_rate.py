#!/usr/bin/python3
"""tools/dict_rate.py - how much of a text sample is English words: the share
of its words found in Debian's wamerican dictionary
(/usr/share/dict/american-english), and the longest run of one word
repeated. Words: the text split on whitespace, punctuation stripped at both
ends (apostrophes inside a word kept: "don't"), case-folded; tokens with a
digit are skipped; a word ending in "'s" also counts when its stem is in
the dictionary (the dictionary lists most possessives, not all).

    tools/dict_rate.py SAMPLE.txt [SAMPLE.txt ...]
    slapo train ... | tools/dict_rate.py --sample -   (the text between the
                                                      "--- sample ---" lines)

Prints, per file: words, rate, longest repeat run; exits 0.
"""
import re
import string
import sys

DICT = "/usr/share/dict/american-english"
STRIP = string.punctuation + "“”‘’—–…«»"


def load_dict(path=DICT):
    with open(path, encoding="utf-8") as f:
        return {w.strip().casefold() for w in f if w.strip()}


def words_of(text):
    out = []
    for tok in text.split():
        w = tok.strip(STRIP).replace("’", "'").casefold()
        if not w or any(ch.isdigit() for ch in w):
            continue
        out.append(w)
    return out


def rate(words, vocab):
    known = sum(1 for w in words if w in vocab or (w.endswith("'s") and w[:-2] in vocab))
    return known / len(words) if words else 0.0


def longest_repeat(words):
    best = run = 0
    prev = None
    for w in words:
        run = run + 1 if w == prev else 1
        prev = w
        best = max(best, run)
    return best


def sample_of(text):
    m = re.search(r"--- sample ---\n(.*?)\n---\n", text, re.S)
    return m.group(1) if m else text


def main(argv):
    sample = "--sample" in argv
    paths = [a for a in argv if a != "--sample"] or ["-"]
    vocab = load_dict()
    for p in paths:
        text = sys.stdin.read() if p == "-" else open(p, encoding="utf-8", errors="replace").read()
        if sample:
            text = sample_of(text)
        ws = words_of(text)
        print(f"{p}: {len(ws)} words, dictionary rate {100 * rate(ws, vocab):.1f} %, "
              f"longest repeat {longest_repeat(ws)}")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
