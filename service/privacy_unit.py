"""The privacy unit: people with several rows (issue 34).

Without ``privacy_unit_column`` a dataset's unit is the row: neighbouring datasets replace one
row. With it, the upload names an identifier column; the column is removed from the features,
its values are never stored (nor logged, nor shown), and the store keeps beside the matrix only a
dense per-row unit index (``0 .. n_units - 1`` in order of first appearance). Neighbouring
datasets then differ in *all rows of one person*, and every mechanism must bound a person's
contribution, not a row's, or refuse.

Person-level argument of the Gram steps (``ALGORITHMS.md``, "Privacy unit"). Rows are clipped
to the public ``C`` as before; then each person's rows are scaled together by one factor
``s_p = sqrt(min(1, C^2 / b_p))`` where ``b_p`` is a public-rule size of the person's clipped
contribution ``G_p = sum_i x_i x_i^T``:

- ``frobenius``: ``b_p = ||G_p||_F``, so ``||s_p^2 G_p||_F <= C^2``. Two PSD matrices of
  Frobenius norm at most ``B`` differ by at most ``sqrt(2) B`` in Frobenius norm (their inner
  product is non-negative), and the upper triangle (diagonal included) of a symmetric matrix
  has l2 norm at most its Frobenius norm; each scaled row has ``||y||^2 <= ||G_p'||_2 <= C^2``,
  so the mechanism's own clipping leaves it unchanged. Replacing one person therefore changes
  ``H = sum_p G_p'`` by at most ``sqrt(2) C^2`` (upper triangle, Frobenius, and by
  Hoffman-Wielandt the eigenvalue vector): exactly one row's sensitivity, so a mechanism
  calibrated per row on these rows is calibrated per person. Used by ``spectrum``.
- ``trace``: ``b_p = trace(G_p) = sum_i ||x_i||^2``, so the person's rows, concatenated, have
  norm at most ``C``. ``||G_p'||_F <= trace(G_p') <= C^2`` (PSD), so the Gram argument above
  holds, and any step that adds a per-row point ``(a_i, b_i)`` with ``a_i + b_i = ||y_i||^2``
  (``analyze_gauss``'s explained-variance pair) adds per person a point of the same simplex
  ``{a, b >= 0, a + b <= C^2}``: its sensitivity is one row's too. Used by ``analyze_gauss``.
  It can cost up to ``sqrt(rank G_p)`` more than ``frobenius`` for a person whose rows point
  in different directions, and nothing for a person whose rows are collinear.

Rows are never dropped (a person's rows are scaled down together), so the row count seen by the
mechanism is the public ``n``, and its memory and run time bounds are unchanged. The bound holds
whatever the replaced and the replacing person's row counts, so releases are private for any
replacement of one person; ``n_rows`` and ``n_units`` remain public metadata, as ``n`` was.
The transform is a per-person map fixed by public facts (``C`` and the rule), applied in the
worker where the mechanism's input is prepared, so no mechanism's internals change.

Sample-and-aggregate (``friendly_aggregate``, ``histogram_aggregate``; ``ALGORITHMS.md``,
"Privacy unit"): the data is not transformed; the worker hands the mechanism the unit index
and its partition is of *people*
(:func:`~service.mechanisms.sample_aggregate.random_partition` with ``groups``): people
permuted uniformly, ``t`` (public) subsets of ``floor(P/t)`` or ``ceil(P/t)`` people, each
subset trimmed or cyclically padded to the public ``m = floor(n/t)`` rows by a rule reading
that subset alone. Replacing one person changes one subset, as one row did, so each
aggregator's argument (one ``U_j``, one point moves) holds unchanged, per person. ``t`` must
be at most the public ``n_units``, and histogram boosting (groups of rows) is refused
(:func:`check_partition`). What ``m``
feeds (memory bound, the histogram's ``gamma`` width rule, the preview) stays exactly right
since every subset has ``m`` rows; the width rule assumes independent rows, and rows of one
person are not, which costs utility, never privacy (any public width is private).

A public centre is applied by the worker before the bound (rows ``clip_C(clip_C(x) - c)``,
then bounded per person, and the mechanism runs with ``center = "none"``: the same Gram as its
own public centring, now per person). A private centre and a clip quantile are made per person
inside the mechanism's steps (:mod:`service.privacy_unit_centre`: one vector per person in the
mean, one value per person in the quantile, each person bounded on the centred rows); ``auto``
runs its estimate and its candidates per person (:mod:`service.privacy_unit_auto`). Appends
keep a person's unit index across batches (:mod:`service.unit_keys`), so every one-shot
release bounds each person over all batches.

Steps without such an argument are refused with 422 naming ``privacy_unit_column`` before
anything is charged: exact membership counts and the smooth-sensitivity and gap tests (their
local sensitivities are per row) and ``auto`` at ``delta = 0`` (its only candidate is
smooth_sensitivity). Continual releases bound each person once over all batches: a
person's rows in each batch take what their earlier batches left of the bound
(:func:`continual_batch_rows`).
"""

from __future__ import annotations

import math
import re
import unicodedata
from collections.abc import Iterable, Mapping
from typing import Any, Literal

import numpy as np
import numpy.typing as npt

from service.errors import InvalidInput
from service.mechanisms.base import MechanismOutput, ReleaseSpec
from service.mechanisms.friendly_aggregate import FriendlyAggregate
from service.mechanisms.histogram_aggregate import HistogramAggregate
from service.mechanisms.linalg import FloatArray, clip_rows, gram_rows

#: The form field and API name of the identifier column.
FIELD = "privacy_unit_column"
#: The ``privacy_unit`` the API shows: a row, or a person named by the identifier column.
ROW = "row"
PERSON = "person"

BoundRule = Literal["trace", "frobenius"]

#: Rows clipped and normalised per block (bounded memory whatever ``n``).
CHUNK_ROWS = 65536

#: Mechanisms with a person-level argument, and the rule that bounds a person for them.
PERSON_LEVEL_RULES: dict[str, BoundRule] = {"analyze_gauss": "trace", "spectrum": "frobenius"}

#: Mechanisms whose private centre and clip quantile are made per person
#: (:mod:`service.privacy_unit_centre`: one vector and one value per person).
PERSON_CENTRED: frozenset[str] = frozenset({"analyze_gauss", "spectrum"})

#: Sample-and-aggregate mechanisms: person-level by a partition of people (the worker passes
#: the unit index to their ``run``; the rows are not transformed).
PERSON_PARTITIONED: frozenset[str] = frozenset({"friendly_aggregate", "histogram_aggregate"})

#: Why the others are refused (422 before charging), by mechanism.
_REFUSALS: dict[str, str] = {
    "exact_gapmax": "its score counts rows exactly; one person moves it by their row count",
    "smooth_sensitivity": "its local sensitivity is per row, not per person",
    "gap_perturbation": "its gap test's sensitivity is per row, not per person",
}

#: ``auto``: its estimate and candidates are made per person (service.privacy_unit_auto; the
#: one candidate without a person-level argument, smooth_sensitivity at delta = 0, is refused
#: by auto's plan with 422 naming privacy_unit_column).
AUTO = "auto"

#: Continual mechanisms made per person by :func:`continual_batch_rows`.
PERSON_CONTINUAL: frozenset[str] = frozenset({"continual_gauss"})

#: Coarse buckets of rows per unit shown to the owner: (label, lowest, highest).
ROWS_PER_UNIT_BUCKETS: tuple[tuple[str, int, int | None], ...] = (
    ("1", 1, 1),
    ("2-5", 2, 5),
    ("6-20", 6, 20),
    ("21-100", 21, 100),
    ("over 100", 101, None),
)


def parse_column(value: str | int | None) -> str | int | None:
    """The identifier column as the owner named it: a 0-based index (an integer, or form text of
    ASCII digits only) or a column name (any other non-empty text)."""
    if value is None:
        return None
    if isinstance(value, bool):
        raise InvalidInput(FIELD, "must be a column name or a 0-based column index")
    if isinstance(value, int):
        if value < 0:
            raise InvalidInput(FIELD, "a column index must be >= 0 (0 is the first column)")
        return value
    text = value.strip()
    if not text:
        raise InvalidInput(FIELD, "must not be empty")
    if len(text) > 200:
        raise InvalidInput(FIELD, "at most 200 characters")
    if text.isascii() and text.isdigit():
        return int(text)
    return text


def describe_column(column: str | int) -> str:
    """How the column is stored in the database (the owner's own label, never a value)."""
    return str(column)


class UnitIndexer:
    """Turns identifier values into dense unit indices (order of first appearance).

    Only the mapping's size outlives the upload: the indices are stored, the identifiers are
    dropped with this object. Equal values are one person by :func:`canonical_key`, the first
    rule (text as text, numbers as numbers); the store indexes by keyed digests
    (:mod:`service.unit_keys`), with :func:`person_key` for datasets uploaded from now on.
    """

    def __init__(self) -> None:
        self._index: dict[Any, int] = {}

    def add(self, identifiers: Iterable[Any]) -> npt.NDArray[np.int64]:
        index = self._index
        out = [index.setdefault(canonical_key(value), len(index)) for value in identifiers]
        return np.asarray(out, dtype=np.int64)

    @property
    def n_units(self) -> int:
        return len(self._index)


def canonical_key(value: Any) -> tuple[str, Any]:
    """The first rule (datasets uploaded before :func:`person_key`; their appends keep it, their
    stored digests were made with it): ``("s", text)`` or ``("n", number)`` (an integral float
    is its integer)."""
    if isinstance(value, str):
        return ("s", value)
    if isinstance(value, (float, np.floating)):
        as_float = float(value)
        return ("n", int(as_float)) if as_float.is_integer() else ("n", as_float)
    return ("n", int(value))


#: A number written as text (after :func:`person_key`'s normalisation; casefolded, so ``e``).
_INTEGER_TEXT = re.compile(r"[+-]?\d+")
_DECIMAL_TEXT = re.compile(r"[+-]?(?:\d+\.?\d*|\.\d+)(?:e[+-]?\d+)?")


def person_key(value: Any) -> tuple[str, Any]:
    """What makes two identifiers one person (datasets uploaded from now on).

    The same person must be one unit whatever file and spelling their rows come in: CSV reads
    identifiers as text, Parquet and ``.npy`` as numbers, and a person split into two units is
    bounded twice, so protected only at a multiple of the stated epsilon. Merging two
    identifiers never weakens a bound (a unit of two people bounds each of them), so the rule
    errs towards merging. Text is normalised (Unicode NFKC, case folded, surrounding
    whitespace dropped, inner runs of whitespace one space), and text that is a decimal number
    is that number (``"7"``, ``"7.0"``, ``" 007"`` and ``7`` are one person); numbers are
    compared as numbers, an integral float being its integer."""
    if not isinstance(value, str):
        return canonical_key(value)
    folded = unicodedata.normalize("NFKC", unicodedata.normalize("NFKC", value).casefold())
    text = " ".join(folded.split())
    try:
        if _INTEGER_TEXT.fullmatch(text):
            return ("n", int(text))
        if _DECIMAL_TEXT.fullmatch(text):
            number = float(text)
            if math.isfinite(number):
                return canonical_key(number)
    except ValueError:
        # Over Python's digit limit for int(): compared as text (still normalised).
        pass
    return ("s", text)


#: Integers of at most this magnitude are exact in a float64; beyond it a float is the rounding
#: of several integers.
FLOAT64_EXACT = 2**53


def rounded_key(value: Any) -> tuple[str, Any]:
    """:func:`person_key`, with a number beyond ``2^53`` in magnitude taken as the float64 it
    rounds to (datasets uploaded from now on; :mod:`service.unit_keys`' third rule).

    A float64 file (``.npy``, a Parquet double) can hold an identifier beyond ``2^53`` only
    rounded: ``12345678901234567`` is ``12345678901234568`` there, while the CSV text and a
    Parquet int64 keep it exactly, so one person became two units. Beyond ``2^53`` every
    spelling, text, integer or float, is now its float64 rounding: the two are one person. It
    merges integers within one float64 step (``2^53 + 1`` with ``2^53``), which never weakens
    a bound; below ``2^53`` nothing changes. An integer beyond the float64 range (text of over
    308 digits) is kept exact: no float file holds it."""
    kind, key = person_key(value)
    if kind == "n" and isinstance(key, int) and abs(key) > FLOAT64_EXACT:
        try:
            return ("n", int(float(key)))
        except OverflowError:
            return (kind, key)
    return (kind, key)


#: Default-ignorable code points that are not format characters (category ``Cf``, dropped
#: too): the combining grapheme joiner, Hangul fillers, Khmer inherent vowels, Mongolian free
#: variation selectors and the variation selectors. Each renders as nothing.
_IGNORABLE = frozenset(
    [
        *(0x034F, 0x115F, 0x1160, 0x17B4, 0x17B5, 0x3164, 0xFFA0),
        *range(0x180B, 0x1810),
        *range(0xFE00, 0xFE10),
        *range(0xE0100, 0xE01F0),
    ]
)


def visible_text(text: str) -> str:
    """``text`` without its invisible characters: format characters (``Cf``: zero-width space
    and joiners, word joiner, a byte-order mark inside a value, left-to-right and other bidi
    marks, soft hyphen) and the other default-ignorable code points (:data:`_IGNORABLE`)."""
    if text.isascii():
        return text  # no ASCII character is invisible in this sense
    return "".join(
        ch for ch in text if ord(ch) not in _IGNORABLE and unicodedata.category(ch) != "Cf"
    )


def visible_key(value: Any) -> tuple[str, Any]:
    """:func:`rounded_key` of text without its invisible characters (:func:`visible_text`;
    datasets uploaded from now on, :mod:`service.unit_keys`' fourth rule).

    An identifier copied from a web page, a right-to-left document or a spreadsheet may carry
    characters that render as nothing: ``"\u200e7"`` (a left-to-right mark) or ``"7\u200b"``
    (a zero-width space) looks exactly like ``"7"``, and :func:`person_key`'s whitespace rule
    does not drop them (they are not whitespace), so the person became a second unit, each
    bounded apart (protected only at twice epsilon). Dropping them only merges identifiers,
    which never weakens a bound."""
    if isinstance(value, str):
        value = visible_text(value)
    return rounded_key(value)


#: Characters that render as a hyphen-minus or a minus sign: every dash punctuation (``Pd``:
#: hyphen, non-breaking hyphen, figure, en and em dashes, ...) and the minus sign (U+2212, also
#: what NFKC makes of superscript and subscript minus).
_MINUS_SIGN = "\u2212"
#: A number written with digit groups of three, one separator throughout (a space, also what
#: NFKC makes of a no-break or thin space; a comma; an apostrophe, straight or curly; an
#: underscore), a point as the decimal mark: ``1,234``, ``1 234 567``, ``1'234.5``.
_GROUPED_NUMBER = re.compile(r"[+-]?\d{1,3}(?P<sep>[ ,'_\u2019])\d{3}(?:(?P=sep)\d{3})*(?:\.\d*)?")


def spelled_text(text: str) -> str:
    """``text`` as :func:`visible_key` reads it (invisible characters dropped, NFKC, whitespace
    runs one space), with every dash and the minus sign a hyphen-minus, and the separators of
    a number's digit groups dropped."""
    folded = " ".join(unicodedata.normalize("NFKC", visible_text(text)).split())
    if not folded.isascii():
        folded = "".join(
            "-" if ch == _MINUS_SIGN or unicodedata.category(ch) == "Pd" else ch for ch in folded
        )
    grouped = _GROUPED_NUMBER.fullmatch(folded)
    if grouped:
        folded = folded.replace(grouped["sep"], "")
    return folded


def spelled_key(value: Any) -> tuple[str, Any]:
    """:func:`visible_key` of text in :func:`spelled_text`'s spelling (datasets uploaded from
    now on; :mod:`service.unit_keys`' fifth rule).

    Two more ways one identifier is written that the earlier rules kept apart (an outside
    audit of issue 34): a word processor or a web page writes ``123\u201145\u20116789`` (the
    non-breaking hyphen), ``AB\u201312`` (an en dash) or ``\u22127`` (the minus sign), which
    render as ``123-45-6789``, ``AB-12`` and ``-7``; and a spreadsheet saved as CSV writes a
    number as displayed, ``1,234`` or ``1 234`` (no-break space), where the next batch's
    Parquet holds ``1234``. Each became a second unit, bounded apart (protected only at twice
    the stated epsilon). Dashes become one, and a number's group separators go; both only
    merge identifiers, which never weakens a bound. A comma as the *decimal* mark is not read
    (``1,234`` is one thousand two hundred and thirty-four here)."""
    if isinstance(value, str):
        value = spelled_text(value)
    return visible_key(value)


def rows_per_unit_buckets(units: npt.NDArray[np.int64]) -> dict[str, int]:
    """How many units have 1, 2-5, 6-20, 21-100 and over 100 rows.

    Exact counts of coarse buckets, shown only in the upload's answer to the owner who holds
    the rows (like ``rows_above_bound``); never stored, logged or shown to analysts.
    """
    counts = np.bincount(units) if units.size else np.zeros(0, dtype=np.int64)
    counts = counts[counts > 0]
    out: dict[str, int] = {}
    for label, low, high in ROWS_PER_UNIT_BUCKETS:
        above = counts >= low
        if high is not None:
            above &= counts <= high
        out[label] = int(np.count_nonzero(above))
    return out


def check_mechanism(name: str, params: Any, continual: bool) -> None:
    """Refuse (422, field ``privacy_unit_column``) a release on a person-level dataset whose
    mechanism or params have no person-level argument. Public facts only; before charging."""
    if continual and name not in PERSON_CONTINUAL:
        raise InvalidInput(
            FIELD,
            f"{name} is a continual release without a person-level argument (a person may "
            "have rows in several batches); this dataset's privacy unit is a person, so it is "
            "refused",
        )
    if continual:
        return
    if name not in PERSON_LEVEL_RULES and name not in PERSON_PARTITIONED and name != AUTO:
        reason = _REFUSALS.get(name, "it has no person-level privacy argument")
        raise InvalidInput(
            FIELD,
            f"this dataset's privacy unit is a person (privacy_unit_column); {name} cannot "
            f"bound a person's contribution: {reason}. Person-level mechanisms: "
            f"{', '.join(sorted({*PERSON_LEVEL_RULES, *PERSON_PARTITIONED}))}",
        )
    if params is None:
        return
    center = getattr(params, "center", "none")
    if name in PERSON_CENTRED or name == AUTO:
        # A private centre and a clip quantile per person (service.privacy_unit_centre).
        return
    if isinstance(center, str) and center != "none":
        raise InvalidInput(
            FIELD,
            "this dataset's privacy unit is a person (privacy_unit_column): a private centre "
            f"(params.center) is per person only for {', '.join(sorted(PERSON_CENTRED))}; "
            f"{name} uses center none or a public centre (a list of numbers)",
        )
    quantile = getattr(params, "clip_quantile", None)
    if quantile not in (None, "none"):
        raise InvalidInput(
            FIELD,
            "this dataset's privacy unit is a person (privacy_unit_column): a clip quantile "
            f"(params.clip_quantile) is per person only for {', '.join(sorted(PERSON_CENTRED))}; "
            "leave it unset",
        )


def check_auto_delta(name: str, delta: Any) -> None:
    """Refuse (422, field ``privacy_unit_column``) ``auto`` at ``delta = 0`` on a person-level
    dataset: its only candidate there is smooth_sensitivity, per row (auto's plan refuses it
    too, for any caller). Public facts only; before charging."""
    if name == AUTO and delta is not None and delta == 0:
        raise InvalidInput(
            FIELD,
            "this dataset's privacy unit is a person: with delta = 0 auto's only candidate is "
            "smooth_sensitivity, whose local sensitivity is per row and cannot bound a person; "
            "give delta > 0 (auto's analyze_gauss and friendly_aggregate are made per person)",
        )


def check_partition(name: str, params: Any, n_units: int) -> None:
    """Refuse (422, field ``t``) a partition of people with more subsets than people (each
    subset must hold a person), and (field ``boost_beta``) histogram boosting, whose groups are
    not groups of people yet. Public facts only (``t``, ``n_units``); before charging."""
    if name not in PERSON_PARTITIONED or params is None:
        return
    t = getattr(params, "t", None)
    if t is None:
        return
    if getattr(params, "boost_beta", None) is not None:
        raise InvalidInput(
            "boost_beta",
            "this dataset's privacy unit is a person: boosting's groups are not yet groups of "
            "people (a group trimmed to its public size could lose whole people); leave "
            "boost_beta and boost_alpha unset",
        )
    if t > n_units:
        raise InvalidInput(
            "t",
            f"this dataset's privacy unit is a person: its subsets partition the {n_units} "
            f"people, so t = {t} subsets need at least {t} people; use t <= {n_units}",
        )


def run_partitioned(
    mechanism: Any,
    data: npt.NDArray[Any],
    units: npt.NDArray[np.int64],
    spec: ReleaseSpec[Any],
    rng: np.random.Generator,
) -> MechanismOutput:
    """Run a sample-and-aggregate mechanism on a partition of people (``units``: the person of
    each row); anything else is a caller's bug (the request gate admits only these)."""
    if not isinstance(mechanism, (FriendlyAggregate, HistogramAggregate)):
        raise TypeError(f"{mechanism.name} does not partition people")
    return mechanism.run(data, spec, rng, units=units)


def partition_bytes(n_rows: int) -> int:
    """Working memory of a partition of people
    (:func:`~service.mechanisms.sample_aggregate.random_partition` with ``groups``) beyond a
    partition of rows: the label sort and its inverse, the row order, the rows' subsets and
    their sort (int64, a few arrays of ``n``), and the mapped unit index itself."""
    return 8 * 8 * n_rows


def extra_bytes(name: str, n_rows: int, n_cols: int, params: Any = None) -> int:
    """What a release on a person-level dataset adds to the mechanism's memory bound (with a
    private centre or a clip quantile, the per-person runs' own, see
    :func:`service.privacy_unit_centre.centred_bytes`)."""
    if name in PERSON_PARTITIONED:
        return partition_bytes(n_rows)
    if name in PERSON_CONTINUAL:
        # continual_batch_rows: the zeroed copy beside the bound's working memory, and what
        # each person used of their bound before and after the batch (at most n people).
        return transform_bytes(n_rows, n_cols) + 8 * n_rows * n_cols + 16 * n_rows
    if name == AUTO:
        # The estimate's bounded copy, then one candidate: per-person analyze_gauss or a
        # partition of people (kept apart: a sum bounds them all).
        return (
            transform_bytes(n_rows, n_cols)
            + centred_bytes(n_rows, n_cols)
            + partition_bytes(n_rows)
        )
    if name in PERSON_CENTRED and params is not None and needs_internals(params):
        return max(centred_bytes(n_rows, n_cols), transform_bytes(n_rows, n_cols))
    return transform_bytes(n_rows, n_cols)


def needs_internals(params: Any) -> bool:
    """Whether a release's params need this module: a private centre or a clip quantile (a
    public centre and no quantile are an input transform, :mod:`service.privacy_unit`)."""
    center = getattr(params, "center", "none")
    quantile = getattr(params, "quantile", None)
    return center == "private" or quantile is not None


def centred_bytes(n_rows: int, n_cols: int) -> int:
    """Working memory of the per-person runs beyond the mechanism's own bound, a function of
    public facts: the person means and their sums (``P <= n`` rows of ``d``), a chunk of Gram
    rows and its two scaled copies, the per-row squares and the per-person factors, two
    ``d x d`` Grams."""
    chunk = min(n_rows, CHUNK_ROWS)
    return 16 * n_rows * n_cols + 24 * chunk * n_cols + 32 * n_rows + 16 * n_cols * n_cols


def transform_bytes(n_rows: int, n_cols: int, chunk_rows: int = CHUNK_ROWS) -> int:
    """Working memory of :func:`bound_contributions` beyond the mapped data, a function of
    public facts: the bounded rows (``n x d`` float64, also the mechanism's input); one
    person's rows gathered (``frobenius``; at most all ``n``); a chunk of normalised rows; the
    unit index, its sort order and the per-unit sums; one person's ``d x d`` Gram."""
    return (
        16 * n_rows * n_cols
        + 16 * min(n_rows, chunk_rows) * n_cols
        + 40 * n_rows
        + 8 * n_cols * n_cols
    )


def bound_contributions(
    data: npt.NDArray[Any],
    units: npt.NDArray[np.int64],
    clip_norm: float,
    rule: BoundRule,
    chunk_rows: int = CHUNK_ROWS,
    center: FloatArray | None = None,
) -> FloatArray:
    """Each row clipped to ``C`` (with a public ``center``: ``clip_C(clip_C(x) - center)``, the
    mechanisms' own public centring), then each person's rows scaled by one factor so that their
    contribution ``G_p`` has ``b_p <= C^2`` (``rule``: trace or Frobenius norm; see the module).

    Parameters
    ----------
    data : (n, d) array
        The rows (possibly a read-only memory map).
    units : (n,) int64 array
        Dense unit index of each row.
    clip_norm : float
        Public ``C``.
    rule : "trace" or "frobenius"
    center : (d,) array, optional
        A public centre, applied before the bound: the bound must hold for the rows the
        mechanism's Gram reads, and a bound made before centring would not survive it (a
        person of ``r`` rows at the origin has trace 0, and ``r ||c||^2`` once centred). The
        mechanism then runs with ``center = "none"`` on these rows: the same Gram.

    Returns
    -------
    (n, d) float64 array: same rows order, each person's ``G_p'`` within the bound, each row of
    norm at most ``C`` (up to a few ulps).

    Sizes are computed on ``z = x / C`` (norm at most 1), so nothing overflows at any finite
    scale: ``b_p / C^2`` is at most the person's row count.
    """
    return _bounded(data, units, clip_norm, rule, chunk_rows, center)[0]


def _bounded(
    data: npt.NDArray[Any],
    units: npt.NDArray[np.int64],
    clip_norm: float,
    rule: BoundRule,
    chunk_rows: int = CHUNK_ROWS,
    center: FloatArray | None = None,
    budgets: FloatArray | None = None,
) -> tuple[FloatArray, FloatArray]:
    """:func:`bound_contributions` with each person's bound ``budgets[p] C^2`` (``budgets`` in
    ``[0, 1]``; ``None``: all 1), and each person's size ``b_p / C^2`` before the scaling."""
    n, d = data.shape
    if units.shape != (n,):
        raise ValueError("one unit index per row is needed")
    out = np.empty((n, d), dtype=np.float64)
    for start in range(0, n, chunk_rows):
        block = data[start : start + chunk_rows]
        # The mechanisms' own per-row map (gram_rows), so a person of one row is unchanged.
        out[start : start + chunk_rows] = (
            clip_rows(block, clip_norm) if center is None else gram_rows(block, clip_norm, center)
        )
    if n == 0:
        return out, np.zeros(0, dtype=np.float64)
    n_units = int(units.max()) + 1
    # Normalised squared norms ||x / C||^2, each in [0, 1] (computed on x / C: no overflow).
    squared = np.empty(n, dtype=np.float64)
    for start in range(0, n, chunk_rows):
        normalised = out[start : start + chunk_rows] / clip_norm
        squared[start : start + chunk_rows] = np.einsum("ij,ij->i", normalised, normalised)
    size: FloatArray = np.asarray(
        np.bincount(units, weights=squared, minlength=n_units), dtype=np.float64
    )
    if rule == "frobenius":
        size = _frobenius_sizes(out, clip_norm, units, size)
    if budgets is None:
        # s_p^2 = min(1, C^2 / b_p) with b_p / C^2 = size.
        factor = np.sqrt(1.0 / np.maximum(size, 1.0))
        # A person of one clipped row is within both bounds already (||x||^2 <= C^2 exactly;
        # the computed size may round a hair above 1): left bit for bit, as at row level.
        factor[np.bincount(units, minlength=n_units) == 1] = 1.0
    else:
        # s_p^2 = min(1, budget_p C^2 / b_p); a person of one row with the whole bound left is
        # left bit for bit, as above.
        budget = np.clip(np.asarray(budgets, dtype=np.float64), 0.0, 1.0)
        with np.errstate(divide="ignore", invalid="ignore"):
            ratio = np.where(size > budget, budget / np.where(size > 0, size, 1.0), 1.0)
        factor = np.sqrt(ratio)
        factor[(np.bincount(units, minlength=n_units) == 1) & (budget >= 1.0)] = 1.0
    out *= factor[units][:, None]
    return out, size


def continual_batch_rows(
    rows: npt.NDArray[Any],
    units: npt.NDArray[np.int64],
    row_offset: int,
    clip_norm: float,
    used: FloatArray | None,
) -> tuple[FloatArray, FloatArray]:
    """A batch's rows for a continual release per person, each person within one bound over
    all the batches: ``(rows, used')``.

    ``units`` is the unit index of every row up to the batch's end, ``rows`` the batch's rows
    (those from ``row_offset``), and ``used[p]`` (private state, kept by the release between
    epochs, never released) how much of person ``p``'s bound their earlier batches took, in
    units of ``C^2``. Each person's rows in the batch are clipped to ``C`` and scaled together
    so that their contribution ``G_p^t`` has ``||G_p^t||_F <= (1 - used[p]) C^2`` (the
    Frobenius rule of :func:`bound_contributions` with what is left of the bound); ``used'``
    adds ``min(||G_p^t||_F / C^2, 1 - used[p])``, what the scaled rows took. A person seen
    for the first time has the whole bound (their rows are then bounded exactly as before);
    a person who used it up earlier adds nothing (their rows are set to zero). Rows are never
    removed: batch sizes stay public and unchanged.

    ``used = None`` is a state kept before this existed (a release running across the
    upgrade): every person seen before the batch is then taken to have used their whole
    bound, the rule those releases ran under (each person in their first batch only).

    Person-level argument (``continual_gauss``'s tree, ``ALGORITHMS.md``): ``used[p]`` and the
    factor depend on person ``p``'s own rows only (their earlier batches and this one), so the
    map is per person, and ``sum_t ||G_p^t||_F <= C^2`` over all leaves. Replacing ``p`` by
    ``p'`` (any rows, any batches) moves a released node ``v`` by ``A_v - B_v``, the two
    people's (PSD) sums over the node's leaves, with ``sum_v ||A_v||_F <= C^2`` over one level
    (triangle inequality) and the same for ``B``. As ``<A_v, B_v> >= 0``, one level moves by
    ``sum_v ||A_v - B_v||_F^2 <= sum_v ||A_v||_F^2 + ||B_v||_F^2 <= (sum_v ||A_v||_F)^2 +
    (sum_v ||B_v||_F)^2 <= 2 C^4``: the row-level ``sqrt(2) C^2`` per level (upper triangles:
    at most the Frobenius norm), ``sqrt(L) sqrt(2) C^2`` in all, so the row-level calibration
    is per person, as it was when each person sat in one leaf.
    """
    batch_units = np.asarray(units[row_offset:], dtype=np.int64)
    n_people = int(np.max(units, initial=-1)) + 1
    prior = np.zeros(n_people, dtype=np.float64)
    if used is None:
        prior[: int(np.max(units[:row_offset], initial=-1)) + 1] = 1.0
    else:
        kept_before = np.asarray(used, dtype=np.float64)
        if kept_before.ndim != 1 or kept_before.shape[0] > n_people:
            raise ValueError("the state's people are not the dataset's")
        prior[: kept_before.shape[0]] = kept_before
    people, local = np.unique(batch_units, return_inverse=True)
    left = np.clip(1.0 - prior[people], 0.0, 1.0)
    bounded, sizes = _bounded(rows, local.astype(np.int64), clip_norm, "frobenius", budgets=left)
    # A person whose bound is used up: zero exactly (their factor is 0 up to rounding).
    bounded[(left <= 0.0)[local]] = 0.0
    after = prior.copy()
    after[people] = np.minimum(prior[people] + np.minimum(sizes, left), 1.0)
    return bounded, after


def first_batch_rows(
    rows: npt.NDArray[Any], units: npt.NDArray[np.int64], row_offset: int, clip_norm: float
) -> FloatArray:
    """Each person in the batch of their first row only: :func:`continual_batch_rows` with no
    usage kept (the rule before it; kept for states from then)."""
    return continual_batch_rows(rows, units, row_offset, clip_norm, None)[0]


def _frobenius_sizes(
    clipped: FloatArray, clip_norm: float, units: npt.NDArray[np.int64], traces: FloatArray
) -> FloatArray:
    """``||Z_p^T Z_p||_F`` per person (``Z_p``: the person's rows divided by ``C``). Equal to the
    trace for one row; computed from the smaller of ``Z_p Z_p^T`` and ``Z_p^T Z_p`` otherwise
    (both have the same non-zero eigenvalues)."""
    sizes = traces.copy()
    counts = np.bincount(units, minlength=traces.shape[0])
    order = np.argsort(units, kind="stable")
    bounds = np.concatenate(([0], np.cumsum(counts)))
    for person in np.flatnonzero(counts > 1):
        rows = clipped[order[bounds[person] : bounds[person + 1]]] / clip_norm
        small = rows @ rows.T if rows.shape[0] <= rows.shape[1] else rows.T @ rows
        sizes[person] = float(np.linalg.norm(small))
    return sizes


def preview_notes(
    dataset: Any, mechanism: str, clip_norm: float | None, public_center: bool = False
) -> list[str]:
    """What the dry run says about the unit the noise protects (public facts only)."""
    if getattr(dataset, "privacy_unit_column", None) is None:
        return [
            "privacy unit: row. The noise above protects one row; a person with r rows is "
            "protected only at up to r times epsilon (group privacy). Name a "
            "privacy_unit_column at upload to protect people."
        ]
    if mechanism in PERSON_PARTITIONED:
        return [
            f"privacy unit: person ({dataset.n_units} people). The subsets partition people, "
            "not rows: all of a person's rows fall in one subset (each subset then trimmed or "
            "padded with its own rows to the public m rows). Replacing a whole person then "
            "changes one subset, as one row did, so the scales above are per person: every "
            "person, whatever their number of rows, is protected at this (epsilon, delta)."
        ]
    if mechanism in PERSON_CONTINUAL:
        return [
            f"privacy unit: person ({dataset.n_units} people). Each person has one bound over "
            "all batches: their rows are clipped to C, and their rows in each batch are scaled "
            "together so that the Frobenius norm of sum x x^T is at most what their earlier "
            "batches left of C^2 (a person who used it all adds nothing later; no row is "
            "removed). Replacing a whole person then moves each level of the tree by at most "
            "what one row moves it, so the noise scales above are per person."
        ]
    rule = PERSON_LEVEL_RULES.get(mechanism, "trace")
    bound = "C^2" if clip_norm is None else f"C^2 = {clip_norm * clip_norm:.6g}"
    size = "sum of squared row norms" if rule == "trace" else "Frobenius norm of sum x x^T"
    return [
        f"privacy unit: person ({dataset.n_units} people). Each person's rows are clipped to "
        + ("C, centred on the public centre and clipped again, " if public_center else "C ")
        + f"and then scaled down together so that their {size} is at most {bound}; no row "
        "is dropped. Replacing a whole person then moves the statistic by at most what one "
        "row moves it, so the noise scales above are per person: every person, whatever "
        "their number of rows, is protected at this (epsilon, delta)."
    ]


def event_details(dataset: Any) -> dict[str, Any]:
    """What an audit event stating a cost or a budget share of a person-level dataset adds
    (release previewed or requested, grant created): the unit it protects (a person) and how
    many people (public, as ``n_rows``); nothing for a row-level dataset, whose events read as
    before."""
    if getattr(dataset, "privacy_unit_column", None) is None:
        return {}
    return {"privacy_unit": PERSON, "n_units": dataset.n_units}


def unit_of(dataset: Any) -> Literal["row", "person"]:
    """The unit a dataset's budget figures protect (the API's ``privacy_unit``)."""
    return "row" if getattr(dataset, "privacy_unit_column", None) is None else "person"


def shown(dataset: Any) -> Mapping[str, Any]:
    """The API's ``privacy_unit`` and ``n_units`` of a dataset row."""
    if getattr(dataset, "privacy_unit_column", None) is None:
        return {"privacy_unit": ROW, "n_units": None}
    return {"privacy_unit": PERSON, "n_units": dataset.n_units}
