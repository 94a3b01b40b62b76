"""Pure core: rules, due times, ids, aggregates and events, codec. No SQLAlchemy, no Celery."""
