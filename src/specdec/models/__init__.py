"""Adapters that make real language models usable as ``specdec`` models."""

from specdec.models.llama_cpp import LlamaCppModel, TransformersModel, smollm2_path

__all__ = ["LlamaCppModel", "TransformersModel", "smollm2_path"]
