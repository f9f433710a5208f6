"""Keyed identifiers, so a person keeps one unit index across appended batches (issue 34).

A person may reappear in a later batch. For every bound of :mod:`service.privacy_unit` to hold
over the whole dataset, the rows of one person must carry one unit index whichever batch they
came in. The identifiers themselves are never stored; beside the unit index the store keeps:

- ``units/<file>.key``: a per-dataset secret (32 bytes from the OS CSPRNG after a byte naming
  the identifier rule), ``0600``, never released, logged or returned;
- ``units/<file>.ids``: ``HMAC-SHA256(secret, identifier)`` of each person, in unit-index order
  (``(P, 32)`` bytes, ``.npy``).

An appended batch's identifiers are hashed with the dataset's secret while the file is parsed
(:class:`KeyedIndexer` with no people known: per row digests, kept in ``incoming/`` beside the
batch), and mapped to indices under the dataset's lock (:func:`extend`): a known digest gets the
person's index, a new one the next index. Equal identifiers are one person exactly as at upload,
by :func:`service.privacy_unit.spelled_key` (spellings of one identifier, text or number, are one
person, invisible characters in text are dropped, dashes and the minus sign are one, a number's
digit-group separators are dropped, and beyond ``2^53`` a number is its float64 rounding, as a
float file holds it); a dataset uploaded before that rule keeps its own,
:func:`~service.privacy_unit.visible_key`, :func:`~service.privacy_unit.rounded_key`,
:func:`~service.privacy_unit.person_key` or the first
:func:`~service.privacy_unit.canonical_key` (text as text, numbers as numbers), which its
secret says (:func:`rule_of`).

What the digests allow: with the secret (the store's disk), an identifier can be tested for
membership; without it nothing. The store holds the rows themselves already, so this adds no
new exposure to whoever can read it; nothing of it leaves the store.
"""

from __future__ import annotations

import hashlib
import hmac
import secrets
from collections.abc import Iterable
from typing import Any, Literal

import numpy as np
import numpy.typing as npt

from service.errors import InvalidInput
from service.privacy_unit import (
    FIELD,
    FLOAT64_EXACT,
    canonical_key,
    person_key,
    rounded_key,
    spelled_key,
    visible_key,
)

#: Digest size (HMAC-SHA256).
DIGEST_BYTES = 32
#: Secret size.
SECRET_BYTES = 32

Digests = npt.NDArray[np.uint8]


#: The first byte of a secret made with :func:`~service.privacy_unit.person_key`'s rule. A
#: secret of exactly :data:`SECRET_BYTES` bytes is a dataset's from before it: its digests
#: (and so its appends) keep :func:`~service.privacy_unit.canonical_key`, the rule its stored
#: people's digests were made with (changing it would split every returning person).
PERSON_RULE = 2
#: The first byte of a secret made with :func:`~service.privacy_unit.rounded_key`'s rule:
#: numbers beyond ``2^53`` are their float64 rounding, so a person whose identifier a float
#: file holds only rounded stays one person. Datasets with a :data:`PERSON_RULE` secret keep
#: that rule for their appends, for the same reason as above.
ROUNDED_RULE = 3
#: The first byte of a secret made with :func:`~service.privacy_unit.visible_key`'s rule:
#: :data:`ROUNDED_RULE`'s, with the invisible characters of text dropped first,
#: so ``"7\u200b"`` is ``"7"``. Datasets with an older secret keep their rule for their
#: appends, for the same reason as above.
VISIBLE_RULE = 4
#: The first byte of a secret made with :func:`~service.privacy_unit.spelled_key`'s rule (the
#: current one): :data:`VISIBLE_RULE`'s, with every dash and the minus sign one hyphen-minus
#: and a number's digit-group separators dropped, so ``"\u22127"`` is ``-7`` and ``"1,234"``
#: is ``1234``. Datasets with an older secret keep their rule for their appends.
SPELLED_RULE = 5

Rule = Literal["first", "person", "rounded", "visible", "spelled"]

_RULES: dict[int, Rule] = {
    PERSON_RULE: "person",
    ROUNDED_RULE: "rounded",
    VISIBLE_RULE: "visible",
    SPELLED_RULE: "spelled",
}
_KEYS = {
    "first": canonical_key,
    "person": person_key,
    "rounded": rounded_key,
    "visible": visible_key,
    "spelled": spelled_key,
}


def new_secret() -> bytes:
    """A fresh per-dataset secret from the OS CSPRNG, marked with the current rule."""
    return bytes([SPELLED_RULE]) + secrets.token_bytes(SECRET_BYTES)


def rule_of(secret: bytes) -> Rule:
    """Which identifier rule a dataset's secret was made with; ``ValueError`` if none."""
    if len(secret) == SECRET_BYTES:
        return "first"
    if len(secret) == SECRET_BYTES + 1 and secret[0] in _RULES:
        return _RULES[secret[0]]
    raise ValueError("not a unit secret of the store")


def _canonical_bytes(value: Any, rule: Rule) -> bytes:
    kind, key = _KEYS[rule](value)
    if rule == "person" and isinstance(key, int) and abs(key) > FLOAT64_EXACT:
        # The person rule keeps integers beyond 2^53 exact, while a float file holds them
        # rounded: one person could become two units. Its datasets' identifiers there are
        # refused (no value named) rather than split; new datasets round them (rounded_key).
        raise InvalidInput(
            FIELD,
            "this dataset (uploaded before identifiers beyond 2^53 were made one person in "
            "every file format) cannot take a numeric identifier beyond 2^53 in magnitude; "
            "write such identifiers as non-numeric text, or upload a new dataset",
        )
    if kind == "s":
        return b"s\x00" + str(key).encode("utf-8", "surrogatepass")
    if isinstance(key, int):
        return b"n\x00" + str(key).encode("ascii")
    return b"f\x00" + float(key).hex().encode("ascii")


def digest(secret: bytes, value: Any) -> bytes:
    """``HMAC-SHA256(key, canonical identifier)`` under the secret's rule (:func:`rule_of`;
    the key is the secret's last :data:`SECRET_BYTES` bytes)."""
    rule = rule_of(secret)
    key = secret[-SECRET_BYTES:]
    return hmac.new(key, _canonical_bytes(value, rule), hashlib.sha256).digest()


def row_digests(secret: bytes, identifiers: Iterable[Any]) -> Digests:
    """One digest per identifier, ``(n, 32)`` uint8."""
    rule = rule_of(secret)
    key = secret[-SECRET_BYTES:]
    joined = b"".join(
        hmac.new(key, _canonical_bytes(value, rule), hashlib.sha256).digest()
        for value in identifiers
    )
    return np.frombuffer(joined, dtype=np.uint8).reshape(-1, DIGEST_BYTES).copy()


class KeyedIndexer:
    """Dense unit indices by keyed digest, continuing the ``known`` people's order."""

    def __init__(self, known: Digests | None = None) -> None:
        self._index: dict[bytes, int] = {}
        self._order: list[bytes] = []
        if known is not None:
            for row in np.asarray(known, dtype=np.uint8).reshape(-1, DIGEST_BYTES):
                self._add(row.tobytes())

    def _add(self, key: bytes) -> int:
        found = self._index.get(key)
        if found is None:
            found = len(self._order)
            self._index[key] = found
            self._order.append(key)
        return found

    def add_digests(self, digests: Digests) -> npt.NDArray[np.int64]:
        """The unit index of each row of ``digests`` (new people get the next indices)."""
        rows = np.asarray(digests, dtype=np.uint8).reshape(-1, DIGEST_BYTES)
        return np.asarray([self._add(row.tobytes()) for row in rows], dtype=np.int64)

    @property
    def n_units(self) -> int:
        return len(self._order)

    @property
    def digests(self) -> Digests:
        """Every person's digest in unit-index order, ``(P, 32)``."""
        joined = b"".join(self._order)
        return np.frombuffer(joined, dtype=np.uint8).reshape(-1, DIGEST_BYTES).copy()


def extend(known: Digests, batch: Digests) -> tuple[npt.NDArray[np.int64], Digests]:
    """The batch rows' unit indices after the ``known`` people, and every person's digest."""
    indexer = KeyedIndexer(known)
    units = indexer.add_digests(batch)
    return units, indexer.digests
