"""/api/openapi.json against what the API really answers: every operation documents the error body
(the contract's {detail, errors: [{field, message}]}), with the statuses the contract names on the
run endpoints, and real responses validate against the schemas the document gives them."""
from __future__ import annotations

import json
import re

import jsonschema
import pytest
from referencing import Registry, Resource
from referencing.jsonschema import DRAFT202012

from studio.services import set_plan
from tests.conftest import sft_body
from training.models import Status, TrainingRun


@pytest.fixture
def spec(api) -> dict:
    return api.client.get("/api/openapi.json").json()


def assert_documented(spec: dict, path: str, method: str, response) -> None:
    """`response` validates against the schema /api/openapi.json gives its status (or its range)."""
    responses = spec["paths"][path][method]["responses"]
    status = str(response.status_code)
    declared = responses.get(status) or responses.get(f"{status[0]}XX")
    assert declared is not None, (method, path, status, sorted(responses))
    schema = declared["content"]["application/json"]["schema"]
    registry = Registry().with_resource("urn:openapi", Resource(contents=spec, specification=DRAFT202012))
    schema = json.loads(json.dumps(schema).replace('"#/components/', '"urn:openapi#/components/'))
    errors = [e.message for e in jsonschema.Draft202012Validator(schema, registry=registry).iter_errors(response.json())]
    assert not errors, (method, path, status, errors, response.content[:300])


def test_every_operation_documents_the_error_body(spec):
    error = spec["components"]["schemas"]["ErrorOut"]
    assert set(error["required"]) == {"detail", "errors"}
    assert set(spec["components"]["schemas"]["FindingOut"]["required"]) == {"field", "message"}
    for path, operations in spec["paths"].items():
        for method, operation in operations.items():
            four = operation["responses"].get("4XX")
            assert four is not None, (method, path)
            assert four["content"]["application/json"]["schema"] == {"$ref": "#/components/schemas/ErrorOut"}, (method, path)


@pytest.mark.parametrize(("path", "method", "statuses"), [
    ("/api/training-runs", "post", {"201", "402"}),
    ("/api/training-runs/{run_id}", "patch", {"200", "409"}),
    ("/api/training-runs/{run_id}/start", "post", {"202", "402", "409", "422"}),
    ("/api/training-runs/{run_id}/stop", "post", {"200", "409"}),
    # A full disk while files come into the Data Hub (tests/datahub/test_disk_full.py).
    ("/api/hub/repos/{name}/uploads", "post", {"201", "507"}),
    ("/api/hub/uploads/{upload_id}/files/{index}", "put", {"200", "507"}),
    ("/api/hub/uploads/{upload_id}/commit", "post", {"200", "507"}),
])
def test_run_endpoints_name_the_statuses_of_the_contract(spec, path, method, statuses):
    assert statuses <= set(spec["paths"][path][method]["responses"]), sorted(spec["paths"][path][method]["responses"])


def test_real_errors_match_the_documented_error_body(spec, api, api_as, project, free_plan):
    runs = "/api/training-runs"
    one = f"{runs}/{{run_id}}"
    assert_documented(spec, runs, "post", api.post(runs, sft_body(method="ppo")))  # 400
    run_id = api.post(runs, sft_body(base_model=None)).json()["id"]
    assert_documented(spec, one, "get", api_as(None).get(f"{runs}/{run_id}"))  # 401
    assert_documented(spec, one, "get", api_as("outsider").get(f"{runs}/{run_id}"))  # 404
    assert_documented(spec, one, "patch", api_as("viewer").patch(f"{runs}/{run_id}", {"name": "x"}))  # 403
    assert_documented(spec, one + "/start", "post", api.post(f"{runs}/{run_id}/start"))  # 422
    assert_documented(spec, one + "/stop", "post", api.post(f"{runs}/{run_id}/stop"))  # 409
    TrainingRun.objects.filter(pk=run_id).update(status=Status.COMPLETED)
    assert_documented(spec, one, "patch", api.patch(f"{runs}/{run_id}", {"name": "x"}))  # 409
    set_plan(project, free_plan)
    r = api.post(runs, sft_body())
    assert r.status_code == 402
    assert_documented(spec, runs, "post", r)


def test_every_json_success_response_has_a_schema(spec):
    for path, operations in spec["paths"].items():
        for method, operation in operations.items():
            for status, response in operation["responses"].items():
                binary = set(response.get("content", {})) - {"application/json"}  # a .tar, documented as such
                if status.startswith("2") and status != "204" and path != "/api/hub/repos/{name}/download" and not binary:
                    assert "schema" in response.get("content", {}).get("application/json", {}), (method, path, status)


def test_environment_responses_match_their_documented_schemas(spec, api, settings, tmp_path):
    settings.DATAHUB_ROOT = tmp_path / "hub"
    envs = "/api/environments"
    assert_documented(spec, envs + "/catalogue", "get", api.get(envs + "/catalogue"))
    fork = api.post(envs + "/fork", {"catalogue": "gsm-maths", "name": "maths"})
    assert fork.status_code == 201, fork.content
    assert spec["paths"][envs + "/fork"]["post"]["responses"]["201"]["content"]["application/json"]["schema"] == {"$ref": "#/components/schemas/ForkOut"}
    assert_documented(spec, envs + "/fork", "post", fork)
    assert_documented(spec, envs, "get", api.get(envs))
    assert_documented(spec, envs + "/{name}/config", "get", api.get(envs + "/maths/config"))
    assert_documented(spec, envs + "/{name}/check", "get", api.get(envs + "/maths/check"))
    config = api.get(envs + "/maths/config").json()["config"]
    assert_documented(spec, envs + "/{name}/config", "put", api.put(envs + "/maths/config", {"config": config}))


def test_the_document_says_operations_need_a_bearer_token(spec):
    assert spec["components"]["securitySchemes"]["StudioAuth"]["scheme"] == "bearer"
    for path, operations in spec["paths"].items():
        for method, operation in operations.items():
            # the ingest API takes the attempt's own token, checked by the endpoint, not a user's;
            # a load balancer's readiness probe has none
            expected = None if path.startswith("/api/ingest/") or path == "/api/health" else [{"StudioAuth": []}]
            assert operation.get("security") == expected, (method, path)


def test_the_create_body_lists_ppo_among_the_methods_and_create_refuses_it_by_name(spec, api):
    # Seed 001: PPO exists in the API schema but is refused at create with "PPO not yet supported".
    body = spec["paths"]["/api/training-runs"]["post"]["requestBody"]["content"]["application/json"]["schema"]["properties"]["method"]
    assert body["enum"] == ["sft", "dpo", "grpo", "distill", "ppo"]
    r = api.post("/api/training-runs", sft_body(method="ppo"))
    assert r.status_code == 400 and "PPO not yet supported" in r.json()["detail"]


def refs_in(node, at: str = "#"):
    """Every ($ref, where it is) in a JSON document."""
    if isinstance(node, dict):
        for key, value in node.items():
            if key == "$ref" and isinstance(value, str):
                yield value, at
            else:
                yield from refs_in(value, f"{at}/{key}")
    elif isinstance(node, list):
        for index, value in enumerate(node):
            yield from refs_in(value, f"{at}/{index}")


def resolve_pointer(document: dict, ref: str):
    """What a local $ref ("#/a/b~1c") points at in `document`; KeyError or IndexError when nothing."""
    assert ref.startswith("#/"), f"{ref} is not a reference inside the document"
    node = document
    for part in ref[2:].split("/"):
        part = part.replace("~1", "/").replace("~0", "~")
        node = node[int(part)] if isinstance(node, list) else node[part]
    return node


def test_every_ref_in_the_document_resolves(api):
    # Bodies documented with body_schema() pointed at #/components/schemas/UploadFileIn, IngestMetric…
    # that the document did not have (they sat in the body's own $defs): /api/docs could not show the
    # upload and ingest bodies. Fetched twice: the first fetch must not use up what the second needs.
    for _ in range(2):
        spec = api.client.get("/api/openapi.json").json()
        refs = list(refs_in(spec))
        assert len(refs) > 50
        unresolved = []
        for ref, at in refs:
            try:
                resolve_pointer(spec, ref)
            except (KeyError, IndexError, ValueError):
                unresolved.append((ref, at))
        assert not unresolved, unresolved
        assert "$defs" not in json.dumps(spec)


def test_the_upload_and_ingest_bodies_are_documented_with_their_nested_models(spec):
    upload = spec["paths"]["/api/hub/repos/{name}/uploads"]["post"]["requestBody"]["content"]["application/json"]["schema"]
    files = upload["properties"]["files"]
    assert resolve_pointer(spec, files["items"]["$ref"])["title"] == "UploadFileIn"
    for model in ("IngestMetric", "IngestRollout", "IngestCheckpoint", "IngestError"):
        assert spec["components"]["schemas"][model]["type"] == "object", model


def test_no_two_api_schemas_share_a_name(spec):
    """The document names each schema by its class name only: a second class of the same name (in
    another app) silently replaced the first one's schema in it, and every operation using the first
    was documented with the other's fields (the health endpoint's CheckOut did so to environments')."""
    from pydantic import BaseModel

    apps = {"studio", "training", "datahub", "experiments", "environments"}
    modules: dict[str, set[str]] = {}
    pending = [BaseModel]
    while pending:
        for cls in pending.pop().__subclasses__():
            pending.append(cls)
            if cls.__module__.split(".")[0] in apps:
                modules.setdefault(cls.__name__, set()).add(f"{cls.__module__}.{cls.__qualname__}")
    # The schemas a $ref points at: a query's model (a pagination's Input) is flattened into parameters,
    # and its left-over component is used by nothing.
    documented = set(re.findall(r'"#/components/schemas/([^"]+)"', json.dumps(spec)))
    shared = {name: sorted(where) for name, where in modules.items() if len(where) > 1 and name in documented}
    assert not shared, f"rename one of each: {shared}"
    assert {"HealthCheckOut", "CheckOut", "RunOut"} <= set(modules) & documented
