"""A field with a finding says so to assistive technology: aria-invalid on the control, and
aria-describedby pointing at the sentence that says what is wrong (the log-in form, {% field %})."""
from __future__ import annotations

import re

import pytest
from django.core.cache import cache
from django.template import Context, Template
from django.test import Client

pytestmark = pytest.mark.django_db


def control(html: str, element_id: str) -> str:
    found = re.search(rf'<(?:input|select|textarea)[^>]*\bid="{element_id}"[^>]*>', html)
    assert found, html[:3000]
    return found.group(0)


def test_a_refused_log_in_marks_both_fields_and_points_them_at_the_refusal(users):
    html = Client().post("/login/", {"username": "owner", "password": "guess"}).content.decode()
    assert re.search(r'<ul class="field-errors" id="login-errors" role="alert">', html)
    for element_id in ("id_username", "id_password"):
        assert 'aria-invalid="true"' in control(html, element_id) and 'aria-describedby="login-errors"' in control(html, element_id)


def test_a_log_in_over_its_budget_marks_both_fields(users, settings):
    settings.STUDIO_RATELIMIT_AUTH_FAILURES = 1
    settings.STUDIO_RATELIMIT_WINDOW_SECONDS = 10**9
    cache.clear()
    browser = Client()
    browser.post("/login/", {"username": "owner", "password": "guess"})
    response = browser.post("/login/", {"username": "owner", "password": "pw"})
    cache.clear()
    assert response.status_code == 429
    html = response.content.decode()
    # beside the form (not the bare 429 page), the name kept
    assert 'id="login-errors"' in html and 'value="owner"' in control(html, "id_username")
    for element_id in ("id_username", "id_password"):
        assert 'aria-invalid="true"' in control(html, element_id) and 'aria-describedby="login-errors"' in control(html, element_id)


def test_the_log_in_page_before_any_attempt_marks_nothing(users):
    html = Client().get("/login/").content.decode()
    assert "aria-invalid" not in html and "login-errors" not in html


def test_a_checkbox_with_a_finding_is_marked_invalid():
    template = Template('{% load studio_ui %}{% field form "compute.spot" "Use spot instances" "checkbox" %}')
    html = template.render(Context({"form": {"values": {}, "errors": {"compute.spot": ["spot needs the dstack backend"]}}}))
    box = control(html, "f-compute-spot")
    assert 'aria-invalid="true"' in box and 'aria-describedby="f-compute-spot-errors' in box
    assert "aria-invalid" not in Template('{% load studio_ui %}{% field form "compute.spot" "Use spot instances" "checkbox" %}').render(Context({"form": {"values": {}, "errors": {}}}))
