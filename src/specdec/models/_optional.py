"""Import an optional dependency, or say which extra installs it."""

from __future__ import annotations

import importlib
from types import ModuleType


def import_optional(
    module: str, needed_by: str, extra: str, package: str | None = None
) -> ModuleType:
    """Import *module*, or raise an ImportError with the ``pip install`` line.

    The adapters import their heavy dependencies (llama.cpp, torch,
    transformers) only when one is created, so that ``import specdec.models``
    stays cheap and works without them.

    Parameters
    ----------
    module : str
        Dotted module name, e.g. ``"llama_cpp"``.
    needed_by : str
        What needs it, for the message, e.g. ``"LlamaCppModel"``.
    extra : str
        The cyspecdec extra that installs it, e.g. ``"llama"``.
    package : str, optional
        The distribution's name when it is not the module's, e.g.
        ``"llama-cpp-python"``.

    Returns
    -------
    module

    Raises
    ------
    ImportError
        If the module cannot be imported; the message names the extra.
    """
    try:
        return importlib.import_module(module)
    except ImportError as exc:
        raise ImportError(
            f"{needed_by} needs the {package or module.split('.')[0]} package ({exc}); "
            "install it with "
            f'pip install "cyspecdec[{extra}]"'
        ) from exc
