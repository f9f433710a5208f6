"""The service's messages in each client surface's own spelling.

The API names what it refuses by its JSON fields (``epsilon: required ... e.g. "epsilon":
0.5``, ``k: must be <= ...``, ``params.clip_quantile: unknown field``, `` `dry_run=true` ``):
right for an HTTP caller, and a puzzle for someone who typed ``--epsilon`` or
``PrivatePCA(n_components=...)``. A :class:`Spelling` maps those field names to one surface's
options and rewrites a message's references to them, in one place, for every message:

- a location at the start of the message or of a ``; ``-separated part (``k: ...``);
- a JSON example, ``"epsilon": 0.5`` or ``"params": {"center": "private"}``, and a quoted
  field name (``"mu"``);
- a mechanism parameter's path, ``params.NAME``;
- a query parameter in backticks, `` `dry_run=true` ``.

Bare words are left alone: "the dataset's delta" is a quantity, not an option. The service
quotes a field (``"mu"``) where it means the field.

Imports only :mod:`re`, so that ``dpss --help`` stays fast (bench/bench_cli_startup.py).
"""

from __future__ import annotations

import re
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field

#: A JSON value as the service writes one in an example: a string, a number, true/false/null,
#: or a flat list.
_VALUE = r'"[^"]*"|\[[^\]]*\]|[-+\w.]+'
_PARAMS_EXAMPLE = re.compile(r'"params":\s*\{\s*"(\w+)":\s*(' + _VALUE + r")\s*\}")
_FIELD_EXAMPLE = re.compile(r'"(\w+)":\s*(' + _VALUE + ")")
_QUOTED_FIELD = re.compile(r'"(\w+)"(?!\s*:)')
_PARAM_PATH = re.compile(r"\bparams\.(\w+)")
_LOCATION = re.compile(r"(^|; )(\w+)(?=: )")
_QUERY = re.compile(r"`(\w+)=(\w+)`")


def _cli_value(value: str) -> str:
    # The CLI reads a value that is not JSON as a string (dpss_client.cli_releases.parse_params):
    # "private" is typed private.
    return value[1:-1] if value.startswith('"') and value.endswith('"') else value


@dataclass(frozen=True)
class Spelling:
    """How one surface spells the API's fields.

    ``options``: a top-level JSON field to the surface's name for it (``"k"`` to ``"--k"`` or
    ``"n_components"``); a field not in it is left as the service wrote it. ``assign`` writes a
    field's name and a value (``--epsilon 0.5``, ``epsilon=0.5``); ``param`` a mechanism
    parameter's name and ``param_assign`` one with a value; ``queries``: a query parameter's
    example (``dry_run=true``) to the surface's way of doing the same.
    """

    options: Mapping[str, str]
    assign: Callable[[str, str], str]
    param: Callable[[str], str]
    param_assign: Callable[[str, str], str]
    queries: Mapping[str, str] = field(default_factory=dict)

    def respell(self, detail: str) -> str:
        """``detail`` with every reference to a mapped field in this surface's spelling."""
        options = self.options
        detail = _PARAMS_EXAMPLE.sub(lambda m: self.param_assign(m[1], m[2]), detail)
        detail = _FIELD_EXAMPLE.sub(
            lambda m: self.assign(options[m[1]], m[2]) if m[1] in options else m[0], detail
        )
        detail = _QUOTED_FIELD.sub(lambda m: options.get(m[1], m[0]), detail)
        detail = _PARAM_PATH.sub(lambda m: self.param(m[1]), detail)
        detail = _LOCATION.sub(lambda m: m[1] + options.get(m[2], m[2]), detail)
        return _QUERY.sub(lambda m: self.queries.get(f"{m[1]}={m[2]}", m[0]), detail)


def _flag(name: str) -> str:
    return "--" + name.replace("_", "-")


#: ``dpss releases create`` (and ``dpss-remote``): ``--epsilon 0.5``, ``--param center=private``.
CLI_RELEASE = Spelling(
    options={name: _flag(name) for name in ("mechanism", "k", "epsilon", "delta", "mu", "rho")}
    | {"params": "--param"},
    assign=lambda option, value: f"{option} {_cli_value(value)}",
    param=lambda name: f"--param {name}",
    param_assign=lambda name, value: f"--param {name}={_cli_value(value)}",
    queries={"dry_run=true": "`--dry-run`"},
)

#: ``dpss datasets upload`` and ``register``: the form fields are their options.
CLI_UPLOAD = Spelling(
    options={
        name: _flag(name)
        for name in (
            "name",
            "epsilon_budget",
            "delta_budget",
            "row_norm_bound",
            "accounting",
            "mu_budget",
            "rho_budget",
            "delta_conversion",
            "privacy_unit_column",
            "allow_large_delta",
            "planned_mechanisms",
            "columns",
        )
    },
    assign=lambda option, value: f"{option} {_cli_value(value)}",
    param=lambda name: f"--param {name}",
    param_assign=lambda name, value: f"--param {name}={_cli_value(value)}",
    queries={"allow_large_delta=true": "`--allow-large-delta`"},
)

#: ``dpss grants create``: the grant's fields are its options (``--analyst-key-id``).
CLI_GRANT = Spelling(
    options={name: _flag(name) for name in ("epsilon", "delta", "mu", "rho", "analyst_key_id")},
    assign=lambda option, value: f"{option} {_cli_value(value)}",
    param=lambda name: f"--param {name}",
    param_assign=lambda name, value: f"--param {name}={_cli_value(value)}",
)

#: :class:`dpss_client.PrivatePCA`: keyword arguments, ``k`` is ``n_components`` and a
#: mechanism parameter is a keyword of its own (``center="private"``).
PRIVATE_PCA = Spelling(
    options={"k": "n_components"}
    | {name: name for name in ("mechanism", "epsilon", "delta", "mu", "rho")},
    assign=lambda option, value: f"{option}={value}",
    param=lambda name: name,
    param_assign=lambda name, value: f"{name}={value}",
    queries={"dry_run=true": "`client.preview_release(...)`"},
)


#: The ids a command of ``dpss`` takes as arguments, by the API's location of them
#: (``path.release_id``: a name no command shows), and ``releases list --dataset``'s filter.
CLI_IDS: Mapping[str, str] = {
    "path.dataset_id": "the dataset id (argument DATASET_ID)",
    "path.release_id": "the release id (argument RELEASE_ID)",
    "path.grant_id": "the grant id (argument GRANT_ID)",
    "path.key_id": "the key id (argument KEY_ID)",
    "path.prior_id": "the prior id (argument PRIOR_ID)",
    "query.dataset_id": "--dataset",
}
_ID_LOCATION = re.compile(r"(^|; )((?:path|query)\.\w+)(?=: )")


def respell_ids(detail: str) -> str:
    """``detail`` with each location of a path parameter (``path.release_id: ...``) named as
    the command line's argument (:data:`CLI_IDS`); other text is left as it is."""
    return _ID_LOCATION.sub(lambda m: m[1] + CLI_IDS.get(m[2], m[2]), detail)
