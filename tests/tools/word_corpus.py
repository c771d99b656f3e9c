"""Writes a small text corpus of random lines of 12 words from a fixed vocabulary, for the GPT
tests: word_corpus.py OUT SEED CHARS (at least CHARS characters; the same seed, the same file)."""
import random, sys

out, seed, chars = sys.argv[1], int(sys.argv[2]), int(sys.argv[3])
random.seed(seed)
words = "in the beginning god created heaven and earth . and the earth was without form".split()
text = ""
while len(text) < chars:
    text += " ".join(random.choice(words) for _ in range(12)) + "\n"
open(out, "w").write(text)
