"""Type stubs for the compiled core (the pure-Python twin is ``specdec._fallback``)."""

import numpy as np
import numpy.typing as npt

from specdec._validation import SamplingControls

_Logits = npt.NDArray[np.float32] | npt.NDArray[np.float64]
#: arrays of ``specdec._common.LAW_DTYPE`` (fields shift, tau, zmin, total)
_Laws = npt.NDArray[np.void]

class Workspace:
    """Scratch memory for the kernels, sized for one vocabulary."""

    vocab_size: int
    def __init__(self, vocab_size: int) -> None: ...

def sample_token(
    logits: _Logits,
    controls: SamplingControls,
    rng: np.random.Generator,
    law_out: _Laws,
    weights_out: _Logits,
    work: Workspace,
) -> int: ...
def row_laws(
    rows: _Logits,
    controls: SamplingControls,
    laws_out: _Laws,
    weights_out: _Logits,
    work: Workspace,
) -> None: ...
def verify(
    target_rows: _Logits,
    draft_tokens: npt.NDArray[np.int64],
    draft_weights: _Logits | None,
    draft_laws: _Laws | None,
    bonus: bool,
    controls: SamplingControls,
    rng: np.random.Generator,
    work: Workspace,
    block: bool = False,
) -> tuple[int, int]: ...
def verify_tree(
    target_rows: _Logits,
    draft_tokens: npt.NDArray[np.int64],
    parents: npt.NDArray[np.int64],
    draft_weights: _Logits | None,
    draft_laws: _Laws | None,
    controls: SamplingControls,
    rng: np.random.Generator,
    work: Workspace,
    path_out: npt.NDArray[np.int64],
) -> tuple[int, int]: ...

class _BatchStep:
    """One batched verification's sequences, verified by every thread calling ``run``.

    Compiled only: the engine's pure-Python path goes a sequence at a time.
    """

    n_accepted: npt.NDArray[np.int64]
    next_tokens: npt.NDArray[np.int64]
    tokens: npt.NDArray[np.int64]
    failures: npt.NDArray[np.int64]
    def __init__(
        self,
        target: _Logits,
        draft: _Logits | None,
        ids: npt.NDArray[np.int64],
        lengths: npt.NDArray[np.int64],
        controls: SamplingControls,
        generators: list[np.random.Generator | None],
        block: bool,
    ) -> None: ...
    def run(self, work: Workspace, laws_out: _Laws, weights_out: _Logits) -> None: ...
    def first_failure(self) -> int: ...
