"""The action URLs of the plain (non-htmx) forms: a GET of one (the address bar, a bookmark, a link
copied from a page once drawn there) goes back to the form's page."""
from __future__ import annotations

import pytest
from django.test import Client

pytestmark = pytest.mark.django_db


@pytest.mark.parametrize(("action", "form_page"), [
    ("/hub/new", "/hub/"),
    ("/hub/acme/my-data/delete", "/hub/acme/my-data"),
    ("/environments/fork", "/environments/"),
    ("/settings/secrets/set", "/settings/secrets/"),
    ("/settings/api-tokens/new", "/settings/api-tokens/"),
    # Actions whose form is sent by htmx too: a GET of one is no 405 with an empty body either.
    ("/settings/secrets/delete", "/settings/secrets/"),
    ("/settings/api-tokens/1/revoke", "/settings/api-tokens/"),
    ("/settings/webhooks/new", "/settings/webhooks/"),
    ("/settings/webhooks/1/test", "/settings/webhooks/"),
    ("/settings/webhooks/1/active", "/settings/webhooks/"),
    ("/settings/webhooks/1/delete", "/settings/webhooks/"),
    ("/experiments/create", "/experiments/"),
    ("/environments/maze/config", "/environments/maze/"),
    ("/hub/acme/my-data/upload", "/hub/acme/my-data"),
    ("/hub/acme/my-data/branches/dev/delete", "/hub/acme/my-data"),
    ("/hub/acme/my-data/delete/main/data/train.jsonl", "/hub/acme/my-data"),
])
def test_a_get_of_a_plain_forms_action_url_goes_to_the_forms_page(project, users, action, form_page):
    client = Client()
    client.force_login(users["owner"])
    response = client.get(action)
    assert response.status_code == 302 and response["Location"] == form_page
    assert client.put(action).status_code == 405  # still nothing but a POST acts
