"""rerankq worker: Celery tasks that score windows through a provider chain. Imports torch lazily."""
