"""Drafters that cost nothing: proposals from the sequence itself or from token statistics.

A drafter guesses the next tokens; the target model verifies them with exact
speculative sampling, so the output law is the target's whatever the guesses are.
These drafters share the target's vocabulary (they work on its token ids) and run
no model at all.

* :class:`Drafter`: the interface, for bringing your own drafter.
* :class:`PromptLookup`: copy what followed the latest earlier occurrence of the
  sequence's last n-gram (Hugging Face's ``prompt_lookup_num_tokens``).
* :class:`NGram`: propose the most frequent continuation under token n-gram counts
  learnt from texts (through the target's tokenizer) and online from the sequence.
* :class:`Chain`: several sources in order (say lookup, then n-gram, then a draft
  model); the first with a proposal wins.
* :class:`SuffixDrafter`: SuffixDecoding's suffix trees over this request's prompt and
  output and over earlier requests' outputs; continuations chosen by frequency.
* Draft-length policies: :class:`PositionalDraftLength` (the default for drafters:
  acceptance per position and strength of evidence against the target's
  :class:`CostCurve`; drafts what pays, possibly nothing) and :class:`FixedDraftLength`
  (always ``gamma``); :class:`DraftLengthPolicy` is their interface.
"""

from specdec.drafters.base import Drafter
from specdec.drafters.chain import Chain
from specdec.drafters.cost import CostCurve
from specdec.drafters.length import DraftLengthPolicy, FixedDraftLength
from specdec.drafters.lookup import PromptLookup
from specdec.drafters.ngram import NGram
from specdec.drafters.positional import PositionalDraftLength
from specdec.drafters.suffix import SuffixDrafter

__all__ = [
    "Chain",
    "CostCurve",
    "DraftLengthPolicy",
    "Drafter",
    "FixedDraftLength",
    "NGram",
    "PositionalDraftLength",
    "PromptLookup",
    "SuffixDrafter",
]
