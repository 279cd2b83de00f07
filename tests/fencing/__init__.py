"""Fenced writes and single-flight caching on real servers and real processes: a holder
SIGSTOPped past its lease and resumed after a newer holder wrote (fenced writes refuse it;
plain saves lose the newer update), with the Django ORM and SQLAlchemy on SQLite and
PostgreSQL; cold cache keys hit by many processes at once (one computation)."""
