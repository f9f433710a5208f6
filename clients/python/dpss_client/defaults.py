"""Constants of the client that its command line needs before anything heavy is imported."""

from __future__ import annotations

from typing import Final

#: Where the client and the remote commands look for the service unless told otherwise.
DEFAULT_URL: Final = "http://127.0.0.1:8000"
#: The mechanism ``dpss releases create`` asks for when given none: ``auto``, what the API's
#: ``mechanism`` field advises when unsure (the service chooses, and says what and why).
DEFAULT_MECHANISM: Final = "auto"
