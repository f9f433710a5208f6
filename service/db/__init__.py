"""Database: engine and sessions, ORM models."""
