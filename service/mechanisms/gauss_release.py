"""What ``analyze_gauss``'s Gram step releases (:class:`GaussRelease`), in a module of its own so
that the steps which read it (the explained-variance estimate) need not import the mechanism."""

from __future__ import annotations

from dataclasses import dataclass

from service.mechanisms.linalg import FloatArray


@dataclass(frozen=True)
class GaussRelease:
    """What the Gram step releases: basis ``(d, k)``, eigenvalues ``(k,)`` and the trace of
    ``H + E`` (the sum of all its eigenvalues), both rounded to ``sigma / 1000``.

    ``exact_energy`` is not released: ``(sum_i ||U^T y_i||^2, sum_i ||(I - U U^T) y_i||^2)``
    over the Gram's own rows ``y_i``, read off the exact ``H`` (``tr(U^T H U)`` and
    ``tr(H)`` minus it) so that the explained-variance step, which noises exactly these sums
    when its rows are the Gram's, needs no second pass over the rows; ``None`` when the
    caller did not ask for it."""

    basis: FloatArray
    eigenvalues: FloatArray
    trace: float
    exact_energy: tuple[float, float] | None = None
