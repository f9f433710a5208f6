"""The dashboard's templates (Jinja2) and static files (one script, one stylesheet), served by
:mod:`service.api.dashboard`. Package data, so an installed service serves them offline."""
