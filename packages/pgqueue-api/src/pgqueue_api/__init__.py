"""pgqueue HTTP API: a FastAPI app built by :func:`create_app` from :class:`ApiSettings`."""

from pgqueue_api.app import create_app, create_app_from_env
from pgqueue_api.settings import ApiSettings

__all__ = ["ApiSettings", "create_app", "create_app_from_env"]
