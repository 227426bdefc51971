"""The PostgreSQL store (docs/design.md §11)."""
