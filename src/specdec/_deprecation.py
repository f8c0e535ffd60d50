"""Renamed arguments: the old name still works for one minor version, with a warning.

A public argument renamed in 0.3 keeps its old name until 0.4, as CHANGELOG.md lists:
passing it warns (``DeprecationWarning``, pointing at the caller), and passing both
names is Python's own "multiple values" ``TypeError``.
"""

from __future__ import annotations

import functools
import warnings

__all__ = ["renamed_arguments"]


def renamed_arguments(where: str, **new_names: str):
    """Decorate a function so that each old keyword argument is taken as its new name.

    Parameters
    ----------
    where : str
        The callable as users write it (``"SuffixDrafter()"``), for the warning.
    **new_names : str
        ``old_name="new_name"`` for each renamed argument.

    Returns
    -------
    callable
        The decorator; the decorated function keeps its signature
        (``inspect.signature`` follows ``__wrapped__``).
    """

    def decorate(function):
        @functools.wraps(function)
        def call(*args, **kwargs):
            for old, new in new_names.items():
                if old not in kwargs:
                    continue
                if new in kwargs:
                    raise TypeError(f"{where} got both {new}= and its old name {old}=")
                warnings.warn(
                    f"{where}: {old}= is deprecated since 0.3 and goes in 0.4; use {new}=",
                    DeprecationWarning,
                    stacklevel=2,
                )
                kwargs[new] = kwargs.pop(old)
            return function(*args, **kwargs)

        return call

    return decorate
