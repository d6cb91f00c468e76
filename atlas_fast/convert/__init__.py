"""``atlas-fast convert``: datasets brought in from other formats (see docs/convert.md)."""
