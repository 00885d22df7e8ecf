"""The log-in forms (/login/, /admin/login/) share a failure budget per address and user name (studio/ratelimit.py): passwords
cannot be guessed at request speed, and one user's typos do not lock the others out."""
from __future__ import annotations

import threading

import pytest
import requests
from django.contrib.auth import get_user_model
from django.core.cache import cache
from django.test import Client


@pytest.fixture
def budget_of_three(settings):
    settings.STUDIO_RATELIMIT_AUTH_FAILURES = 3
    # Fixed windows start every count again at their end: one that ends mid-test let the last attempt through.
    settings.STUDIO_RATELIMIT_WINDOW_SECONDS = 10**9
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


def test_the_admin_log_in_shares_the_budget_and_answers_429_over_it(users, budget_of_three):
    # /admin/login/ guards superusers: its wrong passwords were never counted, and the right one logged in after any number.
    get_user_model().objects.create_superuser("root", "root@example.com", "pw")
    admin_form = Client()
    for _ in range(2):
        r = admin_form.post("/admin/login/?next=/admin/", {"username": "root", "password": "guess", "next": "/admin/"})
        assert r.status_code == 200 and "_auth_user_id" not in admin_form.session
    assert Client().post("/login/", {"username": "root", "password": "guess"}).status_code == 200
    r = admin_form.post("/admin/login/?next=/admin/", {"username": "root", "password": "pw", "next": "/admin/"})
    assert r.status_code == 429 and "_auth_user_id" not in admin_form.session
    assert "Too many failed log-ins" in r.content.decode() and int(r["Retry-After"]) > 0
    assert Client().post("/login/", {"username": "root", "password": "pw"}).status_code == 429
    # another address is not affected
    r = Client(REMOTE_ADDR="10.0.0.2").post("/admin/login/?next=/admin/", {"username": "root", "password": "pw", "next": "/admin/"})
    assert r.status_code == 302 and r["Location"] == "/admin/"


def test_right_passwords_do_not_use_up_the_budget(users, budget_of_three):
    # Each attempt is counted before its password is checked; a right one gives its count back.
    for _ in range(2):
        Client().post("/login/", {"username": "owner", "password": "guess"})
    for _ in range(3):
        assert Client().post("/login/", {"username": "owner", "password": "pw"}).status_code == 302
    assert Client().post("/login/", {"username": "owner", "password": "guess"}).status_code == 200
    assert Client().post("/login/", {"username": "owner", "password": "pw"}).status_code == 429


def test_a_concurrent_burst_gets_no_more_password_checks_than_the_budget(transactional_db, live_server, settings, budget_of_three):
    # The count was read before the (slow) password check and written after it, so a burst sent at once
    # had every password checked: 29 wrong ones and the right one, which logged in.
    settings.PASSWORD_HASHERS = ["django.contrib.auth.hashers.PBKDF2PasswordHasher"]  # the real cost is the race window
    get_user_model().objects.create_user("burst", "burst@example.com", "right password")
    csrf = requests.get(f"{live_server.url}/login/", timeout=30).cookies["csrftoken"]
    passwords = [f"guess {n}" for n in range(11)] + ["right password"]
    start = threading.Barrier(len(passwords))
    answers: dict[str, int] = {}

    def attempt(password: str) -> None:
        start.wait()
        r = requests.post(f"{live_server.url}/login/", data={"username": "burst", "password": password, "csrfmiddlewaretoken": csrf},
                          cookies={"csrftoken": csrf}, allow_redirects=False, timeout=60)
        answers[password] = r.status_code

    threads = [threading.Thread(target=attempt, args=(p,)) for p in passwords]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    # At most the budget's three wrong passwords were checked (a right one checked among them gives its count back).
    wrong_checked = [p for p, status in answers.items() if p != "right password" and status != 429]
    assert len(answers) == 12 and len(wrong_checked) <= 3 and all(answers[p] == 200 for p in wrong_checked), answers
    assert answers["right password"] in (302, 429), answers  # logged in only when it was counted within the budget
    r = requests.post(f"{live_server.url}/login/", data={"username": "burst", "password": "right password", "csrfmiddlewaretoken": csrf},
                      cookies={"csrftoken": csrf}, allow_redirects=False, timeout=60)
    assert r.status_code == 429 and int(r.headers["Retry-After"]) > 0


def test_a_session_logged_in_before_the_rate_limited_backend_stays_logged_in_after_the_upgrade(users, settings):
    """Sessions made before studio.auth name Django's ModelBackend; Django logs out a session whose backend
    is not in AUTHENTICATION_BACKENDS. studio's migration 0005 renames it (a QA upgrade found every user
    logged out)."""
    import importlib

    from django.apps import apps
    from django.contrib.auth import BACKEND_SESSION_KEY, HASH_SESSION_KEY, SESSION_KEY
    from django.contrib.sessions.backends.db import SessionStore

    migration = importlib.import_module("studio.migrations.0005_sessions_rate_limited_backend")
    owner = users["owner"]
    old = SessionStore()
    old.update({SESSION_KEY: str(owner.pk), BACKEND_SESSION_KEY: "django.contrib.auth.backends.ModelBackend", HASH_SESSION_KEY: owner.get_session_auth_hash(),
                "project": "kept"})
    old.create()
    Session = SessionStore.get_model_class()
    anonymous = SessionStore()
    anonymous.create()
    anonymous_data = Session.objects.get(pk=anonymous.session_key).session_data
    browser = Client()
    browser.cookies[settings.SESSION_COOKIE_NAME] = old.session_key
    assert browser.get("/training/").status_code == 302  # the old backend: logged out

    migration.sessions_name_the_rate_limited_backend(apps, None)

    assert browser.get("/training/").status_code == 200
    assert SessionStore(old.session_key).load()["project"] == "kept"
    assert Session.objects.get(pk=anonymous.session_key).session_data == anonymous_data  # no backend named: untouched
