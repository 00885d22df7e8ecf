"""The login form has a failure budget per address and user name (studio/ratelimit.py): passwords
cannot be guessed at request speed, and one user's typos do not lock the others out."""
from __future__ import annotations

import pytest
from django.core.cache import cache
from django.test import Client


@pytest.fixture
def budget_of_three(settings):
    settings.STUDIO_RATELIMIT_AUTH_FAILURES = 3
    cache.clear()
    yield
    cache.clear()


def test_wrong_passwords_use_up_the_budget_then_even_the_right_one_is_429(users, budget_of_three):
    browser = Client()
    for _ in range(3):
        r = browser.post("/login/", {"username": "owner", "password": "guess"})
        assert r.status_code == 200 and "_auth_user_id" not in browser.session
    r = browser.post("/login/", {"username": "owner", "password": "pw"})
    assert r.status_code == 429 and "_auth_user_id" not in browser.session
    assert "Too many failed log-ins" in r.content.decode() and int(r["Retry-After"]) > 0
    # another address is not affected
    other = Client(REMOTE_ADDR="10.0.0.2")
    assert other.post("/login/", {"username": "owner", "password": "pw"}).status_code == 302


def test_one_users_wrong_passwords_do_not_lock_another_user_on_the_same_address_out(users, budget_of_three):
    # Behind a proxy every user has the proxy's address: 20 typos of anyone locked everyone out.
    browser = Client()
    for _ in range(3):
        browser.post("/login/", {"username": "owner", "password": "guess"})
    assert browser.post("/login/", {"username": "Owner ", "password": "pw"}).status_code == 429
    assert Client().post("/login/", {"username": "member", "password": "pw"}).status_code == 302
    # and the login form's failures are not the tokens': a valid token was always taken, a bad one is still counted alone
    assert Client().get("/api/training-runs", HTTP_AUTHORIZATION="Bearer stu_bad").status_code == 401


def test_a_right_password_within_the_budget_logs_in(users, budget_of_three):
    browser = Client()
    browser.post("/login/", {"username": "owner", "password": "guess"})
    r = browser.post("/login/", {"username": "owner", "password": "pw"})
    assert r.status_code == 302 and browser.session["_auth_user_id"] == str(users["owner"].pk)


def test_logout_needs_a_post(users):
    browser = Client()
    browser.force_login(users["owner"])
    assert browser.get("/logout/").status_code == 405
    assert "_auth_user_id" in browser.session
    assert browser.post("/logout/").status_code == 302 and "_auth_user_id" not in browser.session
