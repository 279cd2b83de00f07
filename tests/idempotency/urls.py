"""ROOT_URLCONF of tests/idempotency (tests/idempotency/views.py)."""
from tests.idempotency.views import _django

urlpatterns = _django()
