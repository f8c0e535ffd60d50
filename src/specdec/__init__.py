"""specdec: exact speculative decoding with a compiled hot loop.

A drop-in replacement for a NumPy speculative-sampling loop::

    from specdec import SpeculativeDecoder
    ids, stats = SpeculativeDecoder(gamma=4, temperature=1.0).generate(
        draft_model, target_model, prompt_ids, max_new_tokens=50)

``draft_model`` may also be a drafter that costs nothing (``specdec.drafters``:
prompt lookup, token n-grams, or a ``Chain`` of them and a draft model).  Serving
engines call the verification step alone: :func:`verify` and :func:`verify_batch`
(``specdec.engine``), and :func:`verify_tree` for a tree of candidates.  Real models
plug in through ``specdec.models``.

``decoder.stream(...)`` yields each target pass's tokens as they are made (a
:class:`TokenStream`); ``generate`` and ``sample`` take a Hugging Face-style
``streamer=``; ``decoder.chat(model, messages)`` applies the model's chat template and
returns text (a :class:`TextStream` of pieces with ``stream=True``).

The kernels come from the compiled core (``BACKEND == "cython"``) unless
``SPECDEC_PUREPYTHON=1`` is set or the core was not built (``"python"``).
"""

from specdec._backend import BACKEND, available_backends
from specdec._decoder import SpeculativeDecoder
from specdec._sampling import sample, sample_stream
from specdec._stats import SpeculativeDecodingStats
from specdec._streaming import TextStream, TokenStream
from specdec._tree import verify_tree
from specdec.engine import BatchResult, verify, verify_batch

__version__ = "0.3.0.dev0"

__all__ = [
    "BACKEND",
    "BatchResult",
    "SpeculativeDecoder",
    "SpeculativeDecodingStats",
    "TextStream",
    "TokenStream",
    "__version__",
    "available_backends",
    "sample",
    "sample_stream",
    "verify",
    "verify_batch",
    "verify_tree",
]
