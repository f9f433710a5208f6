"""``python -m service`` is ``dpss``."""

from service.cli import main

main()
