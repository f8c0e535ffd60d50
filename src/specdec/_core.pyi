"""Type stubs for the compiled core (the pure-Python twin is ``specdec._fallback``)."""

import numpy as np
import numpy.typing as npt

_Logits = npt.NDArray[np.float32] | npt.NDArray[np.float64]

class Workspace:
    """Scratch memory for the kernels, sized for one vocabulary."""

    vocab_size: int
    def __init__(self, vocab_size: int) -> None: ...

def sample_token(
    logits: _Logits,
    temperature: float,
    top_k: int,
    top_p: float,
    min_p: float,
    rng: np.random.Generator,
    law_out: npt.NDArray[np.float64],
    weights_out: _Logits,
    work: Workspace,
) -> int: ...
def verify(
    target_rows: _Logits,
    draft_weights: _Logits,
    draft_tokens: npt.NDArray[np.int64],
    draft_laws: npt.NDArray[np.float64],
    bonus: bool,
    temperature: float,
    top_k: int,
    top_p: float,
    min_p: float,
    rng: np.random.Generator,
    work: Workspace,
) -> tuple[int, int]: ...
