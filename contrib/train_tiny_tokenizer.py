"""Trains the tokenizer of the built-in tiny model ``spinf/tiny-gemma4`` and writes it into the package.

This script owns ``spinf/catalog/tiny_gemma4/tokenizer.json``: a byte-level BPE tokenizer of exactly 8192
entries whose special tokens sit at Gemma's ids (``<pad>`` 0, ``<eos>`` 1, ``<bos>`` 2, ``<unk>`` 3, then the
turn, image and audio markers at 4..11). The weights of the tiny model are random; the tokenizer is real so
that tests and the quickstart see ordinary English split into ordinary tokens.

Corpus (fixed, in this order; all plain UTF-8 English shipped by Debian 12):

* the license texts in ``/usr/share/common-licenses`` (package ``base-files``), regular files only, sorted by
  name; the unversioned names (``GPL``, ``LGPL``, ``GFDL``) are symlinks to versioned ones and are skipped so no
  text counts twice;
* the Vim user manual, ``/usr/share/vim/vim90/doc/usr_*.txt`` (package ``vim-runtime``), sorted by name; it
  is the prose part of the Vim docs (the reference docs are mostly command and option names);
* a small seed text: each answer word of ``SEED_WORDS`` as ``"Word Word"`` and ``"word word"``, repeated
  ``SEED_REPEATS`` times. The corpus alone leaves " yes", " Yes" and "Yes" split in two, and callers score
  yes/no style questions, so the seed makes those words ordinary BPE merges (no added tokens involved).

The corpus digest is pinned in ``CORPUS_SHA256``: if a Debian update changes a file the script stops and says
so, rather than silently writing a different tokenizer (pass ``--allow-corpus-drift`` to accept the change).
Training is deterministic (the BPE trainer breaks count ties by token ids, which follow the sorted byte
alphabet), so running the script twice writes byte-identical files; ``--check`` verifies the file in the tree.

Run from the repository root: ``python contrib/train_tiny_tokenizer.py`` (or ``--check``).
"""

from __future__ import annotations

import argparse
import hashlib
import os
import sys
from itertools import pairwise
from pathlib import Path

from tokenizers import Tokenizer, decoders, models, pre_tokenizers, processors, trainers

LICENSE_DIR = Path("/usr/share/common-licenses")
LICENSE_FILES = (
    "Apache-2.0",
    "Artistic",
    "BSD",
    "CC0-1.0",
    "GFDL-1.2",
    "GFDL-1.3",
    "GPL-1",
    "GPL-2",
    "GPL-3",
    "LGPL-2",
    "LGPL-2.1",
    "LGPL-3",
    "MPL-1.1",
    "MPL-2.0",
)
VIM_DOC_DIR = Path("/usr/share/vim/vim90/doc")
VIM_USER_MANUAL = tuple(
    f"usr_{part}.txt"
    for part in (
        "01 02 03 04 05 06 07 08 09 10 11 12 20 21 22 23 24 25 26 27 28 29 30 31 32 40 41 42 43 44 45 50 51 52 90 toc"
    ).split()
)
CORPUS_FILES = tuple(LICENSE_DIR / name for name in LICENSE_FILES) + tuple(
    VIM_DOC_DIR / name for name in VIM_USER_MANUAL
)
CORPUS_SHA256 = "9c12282dc190f124d00c15b3923606881801bb3040d27200d8c2d5937d5b1bc5"

SEED_WORDS = ("yes", "no", "true", "false", "positive", "negative")
SEED_REPEATS = 64

VOCAB_SIZE = 8192
SPECIAL_TOKENS = (
    "<pad>",
    "<eos>",
    "<bos>",
    "<unk>",
    "<start_of_turn>",
    "<end_of_turn>",
    "<start_of_image>",
    "<end_of_image>",
    "<image_soft_token>",
    "<start_of_audio>",
    "<end_of_audio>",
    "<audio_soft_token>",
)
# Words that must come out as one token; the leading-space forms are what follows a prompt like "Answer:".
SINGLE_TOKEN_WORDS = (
    " yes",
    " no",
    " Yes",
    " No",
    " true",
    " false",
    " positive",
    " negative",
    "Yes",
    "yes",
    "No",
    "no",
)

DEFAULT_OUTPUT = Path(__file__).resolve().parents[1] / "spinf" / "catalog" / "tiny_gemma4" / "tokenizer.json"


def read_corpus() -> list[str]:
    """The corpus texts in their fixed order; stops with the missing paths when Debian files are absent."""
    missing = [str(path) for path in CORPUS_FILES if not path.is_file()]
    if missing:
        sys.exit(
            "corpus files are missing (install Debian 12 packages base-files and vim-runtime):\n  "
            + "\n  ".join(missing)
        )
    texts = [path.read_bytes().decode("utf-8") for path in CORPUS_FILES]
    seed_lines = [f"{word.capitalize()} {word.capitalize()}\n{word} {word}\n" for word in SEED_WORDS]
    texts.append("".join(seed_lines) * SEED_REPEATS)
    return texts


def corpus_digest(texts: list[str]) -> str:
    """sha256 over the texts, each prefixed by its length so that moving text between files changes it."""
    digest = hashlib.sha256()
    for text in texts:
        data = text.encode("utf-8")
        digest.update(len(data).to_bytes(8, "big"))
        digest.update(data)
    return digest.hexdigest()


def train(texts: list[str]) -> Tokenizer:
    """A byte-level BPE tokenizer trained on ``texts``, with Gemma's special ids and a ``<bos>`` template."""
    tokenizer = Tokenizer(models.BPE())
    # No prefix space: text cut at any offset re-encodes the same way, and words after a space get "Ġword".
    tokenizer.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=True)
    tokenizer.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=VOCAB_SIZE,
        special_tokens=list(SPECIAL_TOKENS),
        # All 256 byte symbols, so any text encodes without <unk>.
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    tokenizer.train_from_iterator(texts, trainer=trainer, length=len(texts))
    # Only a template, no ByteLevel post-processor: offsets stay untrimmed, so each token's (start, end)
    # includes its leading space and the pieces tile the text.
    tokenizer.post_processor = processors.TemplateProcessing(
        single="<bos>:0 $A:0",
        pair="<bos>:0 $A:0 <bos>:1 $B:1",
        special_tokens=[("<bos>", SPECIAL_TOKENS.index("<bos>"))],
    )
    return tokenizer


def verify(tokenizer: Tokenizer) -> list[str]:
    """The ways ``tokenizer`` misses its contract, as messages; empty when it is right."""
    problems = []
    if tokenizer.get_vocab_size(with_added_tokens=True) != VOCAB_SIZE:
        problems.append(f"vocabulary has {tokenizer.get_vocab_size(with_added_tokens=True)} entries, not {VOCAB_SIZE}")
    for expected_id, token in enumerate(SPECIAL_TOKENS):
        if tokenizer.token_to_id(token) != expected_id:
            problems.append(f"{token} has id {tokenizer.token_to_id(token)}, not {expected_id}")
    for word in SINGLE_TOKEN_WORDS:
        tokens = tokenizer.encode(word, add_special_tokens=False).tokens
        if len(tokens) != 1:
            problems.append(f"{word!r} is {len(tokens)} tokens: {tokens}")
    if tokenizer.encode("", add_special_tokens=True).ids != [SPECIAL_TOKENS.index("<bos>")]:
        problems.append("encoding '' with special tokens does not give [<bos>]")
    ascii_text = "Is this review positive?  Yes, 3.14\n\n\tno.\n"
    offsets = tokenizer.encode(ascii_text, add_special_tokens=False).offsets
    if "".join(ascii_text[start:end] for start, end in offsets) != ascii_text:
        problems.append("token offsets do not tile an ASCII text")
    # Tokens holding different bytes of one character all carry that character's offsets, so text is cut at
    # each token's end rather than by concatenating spans.
    text = "naïve café — 日本語 🙂 ✓ ok"
    offsets = tokenizer.encode(text, add_special_tokens=False).offsets
    ends = [0] + [end for _, end in offsets]
    if ends != sorted(ends) or "".join(text[a:b] for a, b in pairwise(ends)) != text:
        problems.append("token ends do not cut a non-ASCII text into its characters")
    return problems


def serialize(tokenizer: Tokenizer) -> bytes:
    """The tokenizer.json bytes: pretty, like the files on the Hub, with a final newline."""
    return (tokenizer.to_str(pretty=True) + "\n").encode("utf-8")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--output", type=Path, default=DEFAULT_OUTPUT, help="where to write tokenizer.json")
    parser.add_argument("--check", action="store_true", help="train and compare with --output, writing nothing")
    parser.add_argument("--allow-corpus-drift", action="store_true", help="accept a corpus whose digest changed")
    args = parser.parse_args(argv)

    texts = read_corpus()
    digest = corpus_digest(texts)
    if digest != CORPUS_SHA256 and not args.allow_corpus_drift:
        print(f"corpus digest is {digest}, expected {CORPUS_SHA256}", file=sys.stderr)
        print("the Debian files changed; rerun with --allow-corpus-drift and update CORPUS_SHA256", file=sys.stderr)
        return 1
    tokenizer = train(texts)
    problems = verify(tokenizer)
    for problem in problems:
        print(f"tokenizer check failed: {problem}", file=sys.stderr)
    if problems:
        return 1
    data = serialize(tokenizer)
    if args.check:
        same = args.output.is_file() and args.output.read_bytes() == data
        print(f"{args.output}: {'up to date' if same else 'DIFFERS from a fresh training run'}")
        return 0 if same else 1
    args.output.parent.mkdir(parents=True, exist_ok=True)
    partial = args.output.with_name(args.output.name + ".partial")
    partial.write_bytes(data)
    os.replace(partial, args.output)
    print(f"wrote {args.output} ({len(data)} bytes, sha256 {hashlib.sha256(data).hexdigest()})")
    return 0


if __name__ == "__main__":
    sys.exit(main())
