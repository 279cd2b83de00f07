"""A Django app of one fenced model, for the fencing tests (migrations: the table made
without the fence, then the fence added as ``makemigrations`` writes it)."""
