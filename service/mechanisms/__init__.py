"""Pure numerical mechanisms. Nothing in this package imports FastAPI or SQLAlchemy.

Each mechanism is one module holding a :class:`~service.mechanisms.base.Mechanism` subclass and
its params schema; :mod:`service.mechanisms.registry` lists them.
"""
