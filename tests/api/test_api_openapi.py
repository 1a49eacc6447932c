"""/openapi.json and /docs: served, and every field and parameter described."""

from __future__ import annotations

import httpx

from pgqueue_api import ApiSettings, create_app


def _spec(**settings) -> dict:
    return create_app(ApiSettings(database_url="postgresql://", **settings)).openapi()


def test_every_field_and_parameter_is_described():
    spec = _spec(tokens=frozenset({"t"}))
    missing = []
    for name, schema in spec["components"]["schemas"].items():
        if not schema.get("description"):
            missing.append(name)
        for field, definition in schema.get("properties", {}).items():
            if not definition.get("description"):
                missing.append(f"{name}.{field}")
    for path, methods in spec["paths"].items():
        for method, operation in methods.items():
            if not operation.get("description"):
                missing.append(f"{method.upper()} {path}")
            for parameter in operation.get("parameters", []):
                if not parameter.get("description"):
                    missing.append(f"{method.upper()} {path} {parameter['name']}")
    assert missing == []


def test_protected_operations_document_401_and_the_bearer_scheme_only_with_tokens():
    secured, open_api = _spec(tokens=frozenset({"t"})), _spec()
    for path, methods in secured["paths"].items():
        for method, operation in methods.items():
            protected = path != "/healthz"
            assert ("401" in operation["responses"]) == protected, (method, path)
            assert bool(operation.get("security")) == protected, (method, path)
    assert all(
        "401" not in operation["responses"]
        for methods in open_api["paths"].values()
        for operation in methods.values()
    )
    public_metrics = _spec(tokens=frozenset({"t"}), public_metrics=True)
    assert "401" not in public_metrics["paths"]["/metrics"]["get"]["responses"]


def test_docs_and_openapi_are_served(api: httpx.Client):
    assert api.get("/openapi.json").json()["info"]["title"] == "pgqueue API"
    docs = api.get("/docs")
    assert docs.status_code == 200 and "swagger" in docs.text.lower()
