"""Small models for the demo, the benchmarks and the tests: no download, no framework.

- :mod:`specdec.toymodels.byte_kn`: :class:`~specdec.toymodels.byte_kn.ByteKneserNey`, an
  interpolated Kneser-Ney byte model (the demo's draft and target);
- :mod:`specdec.toymodels.byte_corpus`: its training text (the Python standard library's
  source), held-out prompts and the on-disk cache of trained models;
- :mod:`specdec.toymodels.tables`: :class:`~specdec.toymodels.tables.TableModel` pairs with a
  chosen per-token acceptance, for ``specdec bench`` and ``bench/``.

They ship in the wheel because ``specdec demo`` and ``specdec bench`` use them.  The
timing harness that runs them is :mod:`specdec.measure`.
"""
