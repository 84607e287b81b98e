"""A small Celery project whose periodic tasks run from every worker, with no beat."""
