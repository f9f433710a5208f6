"""service/keyformat.py: text that could be an API key "is never logged or echoed". Errors that
name what the client sent (an unknown or repeated field, a form part, a query parameter, a
dashboard view) echoed it whole when it was short enough: a key pasted into a JSON body as a
field name came back in the 422 ("<key>: unknown field; valid fields: ..."), and so did one
given as a dashboard view (404 "no dashboard view '<key>'"), where a client, a proxy or an
error log keeps it. Each such name is now withheld when it looks like a key."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pytest
from fastapi.testclient import TestClient

from tests.conftest import bearer

KEY = "dpss_Zx9QwErTyUiOpAsDfGhJkLzXcVbNm1234567890ab"
#: Without the prefix, as a key's secret part pasted alone.
BARE = KEY[len("dpss_") :]
RELEASES = "/v1/datasets/00000000-0000-0000-0000-000000000000/releases"


def _calls(secret: str) -> list[tuple[str, str, dict[str, Any]]]:
    return [
        ("POST", RELEASES, {"json": {secret: 1}}),
        ("POST", RELEASES, {"json": {"params": {secret: 1}, "mechanism": "analyze_gauss"}}),
        ("POST", RELEASES, {"content": f'{{"{secret}": 1, "{secret}": 2}}'}),
        ("GET", "/v1/releases", {"params": {secret[:30]: "1"}}),
        ("POST", "/v1/priors", {"files": {secret: ("p.npy", b"x", "application/octet-stream")}}),
        ("GET", "/dashboard/" + secret, {}),
        ("GET", "/dashboard/" + secret[:30], {}),
    ]


@pytest.mark.parametrize("secret", [KEY, BARE], ids=["prefixed", "bare"])
def test_a_key_sent_as_a_name_is_not_in_the_error(
    client: TestClient, make_key: Callable[..., str], secret: str
) -> None:
    analyst = make_key("analyst")
    for method, path, options in _calls(secret):
        headers = {**bearer(analyst), "content-type": "application/json"}
        if "files" in options or method == "GET":
            headers.pop("content-type")
        answer = client.request(method, path, headers=headers, **options)
        assert 400 <= answer.status_code < 500, (path, answer.text)
        shown = answer.text
        pieces = {secret[i : i + 16] for i in range(0, len(secret) - 15)}
        assert not any(piece in shown for piece in pieces), (method, path, options, shown)
