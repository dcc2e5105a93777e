"""What the engine's core asks of a model stack (`spinf.engine.gemma4`, `spinf.engine.qwen35`), declared once.

The scorer, the decoder and the graphs call a stack's text model through `TextStack` and its media embedders
through `Embedders`, and never ask which stack they have: whatever differs between the stacks (the plan of a pass,
the head, what the decoder keeps per row, whether CUDA graphs replay its passes) is a method each stack answers.
`MediaTokens` are the token ids a checkpoint writes around and inside a media item, which both stacks' media
readers give the compiler. No stack imports the scorer, the loop or the engine; the core imports no stack module
beyond the opening that loads one.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING, Protocol

import attrs
import torch

if TYPE_CHECKING:
    from spinf.engine.attention import AttentionPlan
    from spinf.engine.extraction.budget import CaptureCost
    from spinf.engine.graphs import PassGraphs
    from spinf.engine.layout import PassLayout


@attrs.frozen
class MediaTokens:
    """The token ids around and inside a media item (A.14.1): start marker, placeholder, end marker."""

    boi: int
    eoi: int
    image: int
    video: int
    boa: int | None = None
    eoa: int | None = None
    audio: int | None = None


class StackConfig(Protocol):
    """The parts of a stack's text config the core reads."""

    vocab_size: int
    eos_token_ids: tuple[int, ...]


class TextStack(Protocol):
    """A stack's text model over one packed pass of jobs with tries (or one decode step's rows).

    ``layers`` are its decoder layers (the decoder keeps one buffer per layer); ``head_mode`` the LM head's
    precision mode (`spinf.engine.head`)."""

    cfg: StackConfig
    layers: Sequence[torch.nn.Module]
    head_mode: str

    def __call__(self, token_ids: torch.Tensor, plan: object) -> torch.Tensor:
        """Hidden states [num_tokens, hidden] (before the final norm) of a pass under the plan `pass_plan` made,
        or of a decode step's rows under an `AttentionPlan` with its ``decode``."""
        ...

    def pass_plan(self, layout: PassLayout, attention: AttentionPlan) -> object:
        """The plan the forward takes for ``layout``, around the scorer's tree-attention plan ``attention`` (its
        kernel tables, capture and media)."""
        ...

    def read_logprobs(self, hidden_rows: torch.Tensor) -> torch.Tensor:
        """Full-vocabulary fp32 log-softmax [rows, vocab] at the given (pre-norm) hidden rows (the CPU head)."""
        ...

    def full_logprobs(self, hidden_rows: torch.Tensor) -> torch.Tensor:
        """`read_logprobs` with every row's numbers independent of the other rows on a GPU too (what the decoder
        searches and samples on)."""
        ...

    def option_logprobs(
        self, hidden_rows: torch.Tensor, pick_rows: torch.Tensor, pick_cols: torch.Tensor, bounds: list[int]
    ) -> torch.Tensor:
        """fp32 log-probs of token ``pick_cols[i]`` at read row ``pick_rows[i]`` (the GPU head): the read rows in
        chunks of `spinf.engine.head.HEAD_ROWS`, the picks of chunk ``c`` being ``bounds[c]:bounds[c + 1]``."""
        ...

    def runs_fused(self) -> bool:
        """Whether a pass with a kernel plan takes a fused GPU path (what a captured CUDA graph holds)."""
        ...

    def tile_rows(self) -> set[int]:
        """The tree-attention kernel's query rows per program, one per layer kind (the GPU pass plans' tables)."""
        ...

    def capture_cost(self) -> CaptureCost:
        """What the decoder holds per captured or generated row and per prefix."""
        ...

    def head_precision(self) -> str:
        """The head's part of the system fingerprint (api spec §11)."""
        ...

    def pass_graphs(self, device: torch.device, tile_rows: set[int]) -> PassGraphs | None:
        """The CUDA graphs that replay this model's small passes on ``device`` (`spinf.engine.graphs`); None: its
        passes all run eagerly."""
        ...


class Embedders(Protocol):
    """A checkpoint's loaded media embedders (the Gemma layouts' embedders or tower, the Qwen vision tower)."""

    @property
    def kinds(self) -> frozenset[str]:
        """The media kinds loaded."""
        ...

    def embed(self, items: list) -> list[torch.Tensor]:
        """Each item's embedding rows ``[its placeholders, hidden]``, each item's rows its own."""
        ...
