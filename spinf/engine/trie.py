"""Token tries and jobs: how an input's questions become branches after its content.

A `Job` is one prefix (BOS and the content, ending at the cut when there is one) and one `TokenTrie` of every token
path that hangs off it: prompt suffixes (filled templates) and, under each prompt's end, the lead-ins of its
multi-token options. Every distinct path is stored once, so a template's stem is shared by its combinations and a
lead-in by its options. A read is a ``(node, token)`` pair: the log-probability of ``token`` at the row of ``node``
(``PREFIX_END`` for the prefix's last row).

Pure Python; the pass layout (`spinf.engine.layout`) turns jobs into the arrays the model runs.
"""

from __future__ import annotations

import attrs

PREFIX_END = -1  # the read node of a prompt with no tokens of its own: the prefix's last row


class TokenTrie:
    """Nodes numbered in insertion order; children kept in insertion order for the pre-order layout."""

    def __init__(self) -> None:
        self.tokens: list[int] = []
        self.parent: list[int] = []
        self.depth: list[int] = []
        self._children: list[dict[int, int]] = []
        self._roots: dict[int, int] = {}
        self.layout_memo = None  # the pass layout's per-trie part (spinf.engine.layout.local_layout); reset on change

    def __len__(self) -> int:
        return len(self.tokens)

    def insert(self, seq: tuple[int, ...] | list[int]) -> list[int]:
        """Add a token path; return the node of each of its tokens."""
        nodes = []
        children, parent = self._roots, PREFIX_END
        for token in seq:
            node = children.get(token)
            if node is None:
                self.layout_memo = None
                node = len(self.tokens)
                children[token] = node
                self.tokens.append(token)
                self.parent.append(parent)
                self.depth.append(0 if parent == PREFIX_END else self.depth[parent] + 1)
                self._children.append({})
            nodes.append(node)
            children, parent = self._children[node], node
        return nodes

    def preorder(self) -> list[int]:
        """Node ids in pre-order, so every subtree is one contiguous run."""
        order: list[int] = []
        stack = list(reversed(self._roots.values()))
        while stack:
            node = stack.pop()
            order.append(node)
            stack.extend(reversed(self._children[node].values()))
        return order


@attrs.define
class Job:
    """One prefix and its trie; ``reads`` collects the ``(node, token)`` pairs whose log-probs are wanted, ``ends``
    the nodes where an extraction slot starts (`PREFIX_END` for an empty template): there the pass keeps the
    full-vocabulary log-probs and the keys and values of the path for the decoder (engine spec A.12.1, B.13)."""

    prefix: tuple[int, ...]
    trie: TokenTrie = attrs.field(factory=TokenTrie)
    reads: set[tuple[int, int]] = attrs.field(factory=set)
    ends: set[int] = attrs.field(factory=set)
    # the prefix's media items (`spinf.media.items`), each with the prefix row of its first placeholder
    media: tuple[tuple[int, object], ...] = ()
    # the prefix's first rows that no choice of questions changes (its BOS and content up to where a join cut could
    # fall): the Qwen stack runs them with the chunked recurrence (`spinf.engine.qwen35.chunked`); 0: none
    fixed: int = 0

    @property
    def num_tokens(self) -> int:
        return len(self.prefix) + len(self.trie)

    def path_nodes(self) -> int:
        """The trie nodes on the paths from the root to the ``ends`` (each once): the branch rows a pass captures."""
        seen: set[int] = set()
        for node in self.ends:
            while node != PREFIX_END and node not in seen:
                seen.add(node)
                node = self.trie.parent[node]
        return len(seen)


def add_prompt(
    job: Job, branch: tuple[int, ...], spellings: list[tuple[int, ...]], *, extracts: bool = False
) -> list[list[tuple[int, int]]]:
    """Insert one prompt's own tokens and its spellings' lead-ins; return each spelling's reads in order.

    Token ``t`` of a spelling is read at the node of the token before it: the prompt's last node for the first
    token, then the spelling's own lead-in nodes (engine spec A.7). An extraction prompt (``extracts``) has no
    spellings; its end node joins ``job.ends``.
    """
    prompt_nodes = job.trie.insert(branch)
    end = prompt_nodes[-1] if prompt_nodes else PREFIX_END
    if extracts:
        job.ends.add(end)
        job.trie.layout_memo = None
    out = []
    for tokens in spellings:
        lead = job.trie.insert(branch + tokens[:-1])[len(branch) :] if len(tokens) > 1 else []
        nodes = [end, *lead]
        reads = list(zip(nodes, tokens, strict=True))
        job.reads.update(reads)
        job.trie.layout_memo = None
        out.append(reads)
    return out


def end_node(job: Job, branch: tuple[int, ...]) -> int:
    """The node where ``branch`` (already in the trie) ends: its last token's node, or `PREFIX_END` when empty."""
    return job.trie.insert(branch)[-1] if branch else PREFIX_END
