"""Reading the commands out of README.md and docs/: fenced blocks, the commands in them, and what each one needs.

`tests/test_docs_walk.py` runs what this module finds. The conventions it enforces, which the docs follow:

- A ```bash or ```sh block holds commands to run as written, from the repository root, on a CPU machine. A
  command that cannot run there says why in the same line, in a trailing comment that holds one of `MARKERS`
  (``# needs a GPU``, ``# needs Docker``, ...). A command that spans lines (``\\`` continuations, a here-document,
  a multi-line loop) carries it on one of its own lines, never on a here-document's text.
- A ```console block is a terminal session: ``$ `` starts a command, the lines after it are what it prints.
- A ```bash template (or ```sh template) block is a template: its placeholders (``MODEL``, ``$TOKEN``, a host)
  are the reader's to fill in, and it is not run. Syntax illustrations and printed output go in ```text blocks.
- Every fence names its language: a bare ``` fence is an error, so nothing slips past the walk unread.
- A ```python block is a program: the blocks of one file run in order in one interpreter, as a reader pastes them.

Inline code in the prose names commands and flags; it is not walked. A command the reader is meant to run is in a
fenced block.
"""

from __future__ import annotations

import re
from collections.abc import Iterator
from pathlib import Path

import attrs

ROOT = Path(__file__).resolve().parent.parent

# Why a command is not run, in the words a trailing comment must use.
MARKERS = (
    "needs a GPU",
    "needs several GPUs",
    "needs Docker",
    "needs Kubernetes",
    "needs a Ray cluster",
    "needs the network",
    "the test suite",
    "an install",
)
SHELL = ("bash", "sh", "console")
FENCE = re.compile(r"^(?P<indent> *)```(?P<info>.*)$")
HEREDOC = re.compile(r"<<-?\s*(['\"]?)(?P<word>\w+)\1")
SERVE = re.compile(r"^(\w+=\S*\s+)*(spinf-serve|python -m spinf) serve\b")


def doc_files() -> list[Path]:
    """README.md, then docs/quickstart.md (where a new user goes next), then the rest of docs/ in name order."""
    docs = sorted((ROOT / "docs").rglob("*.md"))
    quickstart = ROOT / "docs" / "quickstart.md"
    return [ROOT / "README.md", quickstart, *(path for path in docs if path != quickstart)]


@attrs.frozen
class Block:
    """One fenced block: its file, the line of its opening fence, the info string and the text between the fences."""

    path: Path
    line: int
    info: str
    text: str

    @property
    def lang(self) -> str:
        return self.info.split()[0] if self.info.split() else ""

    @property
    def is_template(self) -> bool:
        return self.info.split()[1:] == ["template"]

    @property
    def where(self) -> str:
        return f"{_shown(self.path)}:{self.line}"


@attrs.frozen
class Command:
    """One shell command of a block: its first line's number, its code lines (continuations and loop bodies
    included), the here-document text that follows them, and the output a console block shows after it."""

    block: Block
    line: int
    code: tuple[str, ...]
    heredoc: tuple[str, ...] = ()
    output: tuple[str, ...] = ()

    @property
    def text(self) -> str:
        return "\n".join(self.code + self.heredoc)

    @property
    def where(self) -> str:
        return f"{_shown(self.block.path)}:{self.line}"

    @property
    def marker(self) -> str | None:
        """The marker in one of the command's trailing comments, or None."""
        quote = None
        for line in self.code:
            quote, comment = _scan(line, quote)
            for marker in MARKERS:
                if re.search(rf"#\s*{re.escape(marker)}\b", comment):
                    return marker
        return None

    @property
    def is_serve(self) -> bool:
        return SERVE.match(self.code[0]) is not None


def _shown(path: Path) -> Path:
    return path.relative_to(ROOT) if path.is_relative_to(ROOT) else path


def blocks(path: Path) -> list[Block]:
    """The fenced blocks of a Markdown file (fences may be indented, as in a list item)."""
    found, lines = [], path.read_text().splitlines()
    start, info, indent, body = None, "", "", []
    for number, line in enumerate(lines, 1):
        match = FENCE.match(line)
        if start is None and match:
            start, info, indent, body = number, match["info"].strip(), match["indent"], []
        elif start is not None and match and match["info"].strip() == "":
            found.append(Block(path, start, info, "\n".join(body)))
            start = None
        elif start is not None:
            body.append(line[len(indent) :] if line.startswith(indent) else line)
    if start is not None:
        raise ValueError(f"{path}:{start}: a fence that is never closed")
    return found


def commands(block: Block) -> list[Command]:
    """The commands of a shell block, in order."""
    lines = block.text.splitlines()
    if block.lang == "console":
        return list(_console(block, lines))
    return list(_script(block, list(enumerate(lines, block.line + 1))))


def _console(block: Block, lines: list[str]) -> Iterator[Command]:
    starts = [index for index, line in enumerate(lines) if line.startswith("$ ")]
    if not starts or starts[0] != 0:
        raise ValueError(f"{block.where}: a console block starts with a '$ ' command")
    for number, index in enumerate(starts):
        end = starts[number + 1] if number + 1 < len(starts) else len(lines)
        code = [lines[index][2:]]
        index += 1
        while code[-1].endswith("\\") and index < end:
            code.append(lines[index])
            index += 1
        yield Command(block, block.line + 1 + starts[number], tuple(code), output=tuple(lines[index:end]))


def _script(block: Block, numbered: list[tuple[int, str]]) -> Iterator[Command]:
    index = 0
    while index < len(numbered):
        number, line = numbered[index]
        if not line.strip() or line.lstrip().startswith("#"):
            index += 1
            continue
        code, heredoc, depth, quote = [], [], 0, None
        while index < len(numbered):
            line = numbered[index][1]
            code.append(line)
            index += 1
            quote, comment = _scan(line, quote)
            part = line[: len(line) - len(comment)]
            words = re.findall(r"[\w-]+", part)
            depth += sum(word in ("do", "then") for word in words) - sum(word in ("done", "fi") for word in words)
            if quote is None and (match := HEREDOC.search(part)):
                while index < len(numbered) and numbered[index][1] != match["word"]:
                    heredoc.append(numbered[index][1])
                    index += 1
                heredoc.append(numbered[index][1] if index < len(numbered) else "")
                index += 1
            if quote is None and depth <= 0 and (heredoc or not part.rstrip().endswith("\\")):
                break
        yield Command(block, number, tuple(code), tuple(heredoc))


def _scan(line: str, quote: str | None = None) -> tuple[str | None, str]:
    """The quote still open at the end of ``line`` (given the one open at its start) and its trailing comment: from
    a ``#`` outside quotes that starts the line or follows whitespace."""
    escaped = False
    for index, char in enumerate(line):
        if escaped:
            escaped = False
        elif char == "\\" and quote != "'":
            escaped = True
        elif quote:
            quote = None if char == quote else quote
        elif char in "'\"":
            quote = char
        elif char == "#" and (index == 0 or line[index - 1].isspace()):
            return None, line[index:]
    return quote, ""


def substitute_port(text: str, port: int) -> str:
    """The docs' examples talk to ``localhost:8000``; the walk's server listens on ``port``."""
    return re.sub(r"\b(localhost|127\.0\.0\.1):8000\b", rf"\g<1>:{port}", text)
