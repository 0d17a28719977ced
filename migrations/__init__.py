"""Alembic migrations of the vjob state store (a package so that it installs with vjob)."""
