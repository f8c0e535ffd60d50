"""The runs both commands time: calibration before the clock, plain sampling, text.

``specdec demo`` and ``specdec generate`` time a speculative and a plain run on the same
target; both measure the target's cost curve before either clock starts
(:func:`calibrate`), stream plain sampling through the same :class:`specdec.TextStream`
as speculative decoding (:func:`plain_stream`, :func:`text_of`), so that both stop at
any stop id.
"""

from __future__ import annotations

import specdec
from specdec import TextStream
from specdec.cli.output import stderr_line

__all__ = ["CALIBRATION_MESSAGE", "calibrate", "plain_stream", "text_of"]


#: Said on stderr before the target's cost curve is measured (see :func:`calibrate`).
CALIBRATION_MESSAGE = "measuring the model's cost of a pass over 1..16 tokens (once)..."


def calibrate(target, quiet: bool) -> None:
    """Measure the target's cost curve now, if it would be measured at its first use.

    The adaptive draft length reads the curve when it first weighs a draft, inside the
    timed speculative run: one to a few seconds (more on a loaded machine) that plain
    sampling never pays.  Measured here, during the warm-up, it is said on stderr and
    left out of both timings.

    Parameters
    ----------
    target : object
        The target model; only adapters with a pending calibration are measured.
    quiet : bool
        Say nothing on stderr.
    """
    pending = getattr(target, "_cost_curve_pending", None)
    if pending is None or not pending():
        return  # given, already measured, or a model without a calibration
    if not quiet:
        stderr_line(CALIBRATION_MESSAGE)
    target.cost_curve  # noqa: B018 (measures it; kept by the adapter)


def plain_stream(target, prompt, max_tokens: int, eos, controls: dict, seed, backend):
    """Plain sampling (``specdec.sample``'s loop) as a :class:`TokenStream`, one token a pass.

    So that plain sampling stops at any stop id through the same :class:`TextStream` as
    speculative decoding does (``sample`` takes one end-of-sequence id).

    Parameters
    ----------
    target : model
        The target.
    prompt : sequence of int
        The prompt's ids.
    max_tokens : int
        Most new tokens.
    eos : int or None
        The id the loop itself stops after.
    controls : dict
        ``temperature``, ``top_k``, ``top_p`` and ``min_p``.
    seed : int or None
        Seed of the run's generator.
    backend : str or None
        Kernel backend.

    Returns
    -------
    specdec.TokenStream
    """
    return specdec.sample_stream(
        target, prompt, max_tokens, eos, **controls, seed=seed, backend=backend
    )


def text_of(tokens, detokenize, stops, write=None):
    """Run a :class:`TokenStream` to its first stop id; return ``(new ids, stats)``.

    The ids end before the stop token; the stats count every token the loop made
    final, the stop token included (it took a pass).

    Parameters
    ----------
    tokens : specdec.TokenStream
        The run.
    detokenize : callable
        ``detokenize(list of int) -> str``.
    stops : collection of int
        Ids that end the text.
    write : callable, optional
        ``write(piece)`` for each piece of text as it comes.

    Returns
    -------
    ids : list of int
    stats : SpeculativeDecodingStats
    """
    text = TextStream(tokens, detokenize, stops)
    for piece in text:
        if write is not None:
            write(piece)
    return text.ids, text.stats
