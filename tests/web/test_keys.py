"""Every key a URL can carry becomes a valid lock name, one per key (issue #25, item 6:
``.`` and ``..`` answered 500): ``ylock.names.name_for`` as a property, then any value
percent-encoded into a URL through both plugins' ``@locked`` and ``@limited`` views on the
local engine, which answer 200 with the lock ``name_for`` gives the key, or a 4xx (a URL
the framework routes nowhere) or a redirect of the router, never a 500."""
from __future__ import annotations

import hashlib
from typing import Any
from urllib.parse import quote, quote_from_bytes

import pytest
from django.test import Client
from flask import Flask, jsonify
from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st

import flask_ylock
from flask_ylock import YLock
from ylock.names import MAX_NAME_LENGTH, check_name, name_for

# Any str, lone surrogates included (a task argument or a callable's result can hold one).
ANY_TEXT = st.text(st.characters(codec=None, exclude_categories=()), max_size=300)
TRICKY = st.sampled_from(["", ".", "..", "...", "%", "%2E", "%2e", "%empty", "%25", "a/b", "/", "//", "./..",
                          "sha256-" + "0" * 64, "sha256%2D", "\x00", "\x7f", "\x85", "\ud800", "{a}", "é",
                          "x" * MAX_NAME_LENGTH, "x" * (MAX_NAME_LENGTH + 1), "💥" * 70])
KEYS = st.one_of(TRICKY, ANY_TEXT, st.builds(lambda a, b: a + b, TRICKY, ANY_TEXT))


def old_name_for(value: object) -> str:
    """name_for as it was before dots and empty values were escaped (the names kept)."""
    name = quote(str(value), safe=" !$&'()*+,;=:@~")
    if len(name) > MAX_NAME_LENGTH:
        name = "sha256-" + hashlib.sha256(name.encode()).hexdigest()
    return name


@given(st.lists(KEYS, unique=True, max_size=40))
@settings(max_examples=400, deadline=None)
def test_name_for_gives_every_value_a_valid_name_of_its_own(values: list[str]) -> None:
    names = [name_for(v) for v in values]
    for name in names:
        assert check_name(name) == name and name not in ("", ".", "..")
    assert len(set(names)) == len(values)          # injective: two keys never share a lock


def test_name_for_tells_apart_what_a_plain_escape_would_confuse() -> None:
    long = "x" * 500
    confusable = ["", ".", "..", "%2E", "%2E%2E", "%empty", "%252E", name_for(long), long, "sha256%2D",
                  "\ud800", "%ED%A0%80", "\udcff", "%ED%B3%BF"]
    assert len({name_for(v) for v in confusable}) == len(confusable)
    assert (name_for(""), name_for("."), name_for("..")) == ("%empty", "%2E", "%2E%2E")
    assert name_for(name_for(long)) == "sha256%2D" + name_for(long)[len("sha256-"):]


@given(ANY_TEXT)
@settings(max_examples=300, deadline=None)
@example("7")
@example("a/b")
@example("user-42")
@example("x" * 250)
def test_ordinary_keys_keep_their_names(value: str) -> None:
    try:
        before = check_name(old_name_for(value))
    except (ValueError, UnicodeEncodeError):
        return                              # the old function refused it: a 500 before, a name now
    if before.startswith("sha256-") and len(quote(value, safe=" !$&'()*+,;=:@~")) <= MAX_NAME_LENGTH:
        return                              # a short value that looked like a hash: escaped now
    assert name_for(value) == before


# -- through the plugins ---------------------------------------------------------------------

# How a key travels in a URL: any bytes percent-encoded (invalid UTF-8 too), or the text with
# "/" and "." left as they are (then the framework may route it elsewhere: a 404 is fine).
URL_KEYS = st.one_of(
    KEYS.map(lambda k: quote(k, safe="", errors="surrogatepass")),
    st.binary(max_size=200).map(lambda b: quote_from_bytes(b, safe="")),
    KEYS.map(lambda k: quote(k, safe="/.", errors="surrogatepass")),
    st.sampled_from(["%2E", "%2E%2E", ".", "..", "%2e%2e", "%00", "%FF", "%ED%A0%80", "%25", "%2F", "%C0%AE"]),
)
PREFIXES = ["s/", "p/", "e/", "a/", "l/"]
LOCKS = {"accounts": {"TIMEOUT": 1}, "profiles": {"TIMEOUT": 1}}


def check_answer(status: int, body: Any) -> None:
    # (A 3xx is the router's: Werkzeug merges "//" in a path and redirects, before any view.)
    assert status == 200 or 300 <= status < 500, (status, body)
    if status == 200:
        # The lock the request held is the one name_for gives the key the view got.
        assert body["name"] == name_for(body["key"]) and body["held"] and body["token"] is not None, body


@pytest.fixture
def django_client(settings: Any) -> Client:
    settings.ROOT_URLCONF = "tests.web.keys_urls"
    settings.YLOCK = {"ENGINES": {"default": {"URL": "local://"}}, "LOCKS": LOCKS}
    return Client()


@given(st.sampled_from(PREFIXES), URL_KEYS)
@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@example("s/", "%2E")
@example("s/", "%2E%2E")
@example("e/", "")
@example("p/", "a/%2E%2E")
def test_django_answers_any_key_with_a_lock_or_a_4xx(django_client: Client, prefix: str, key: str) -> None:
    response = django_client.post("/" + prefix + key)
    check_answer(response.status_code, response.json() if response.status_code == 200 else response.content)


def flask_app(tmp_path: Any) -> Flask:
    app = Flask("keys", instance_path=str(tmp_path))
    app.config.update(SECRET_KEY="keys", TESTING=True, YLOCK_URL="local://", YLOCK_LOCKS=LOCKS)
    ext = YLock(app)

    def holding(key: str) -> Any:
        lock = flask_ylock.current_lock()
        return jsonify(key=key, name=lock.name, token=lock.token, held=lock.held())

    @app.post("/s/<key>")
    @app.post("/p/<path:key>")
    @app.post("/e/", defaults={"key": ""})
    @app.post("/e/<path:key>")
    @ext.locked("accounts", key="key")
    def sync_view(key: str) -> Any:
        return holding(key)

    @app.post("/a/<path:key>")
    @ext.locked("accounts", key="key")
    async def async_view(key: str) -> Any:
        return holding(key)

    @app.post("/l/<path:key>")
    @ext.limited("exports", permits=2, key="key")
    def limited_view(key: str) -> Any:
        return holding(key)
    return app


@pytest.fixture
def flask_client(tmp_path: Any) -> Any:
    return flask_app(tmp_path).test_client()


@given(st.sampled_from(PREFIXES), URL_KEYS)
@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@example("s/", "%2E")
@example("s/", "%2E%2E")
@example("e/", "")
@example("p/", "a/%2E%2E")
def test_flask_answers_any_key_with_a_lock_or_a_4xx(flask_client: Any, prefix: str, key: str) -> None:
    response = flask_client.post("/" + prefix + key)
    check_answer(response.status_code, response.json if response.status_code == 200 else response.data)


@pytest.mark.parametrize("path, name", [("/s/%2E", "%2E"), ("/s/%2E%2E", "%2E%2E"), ("/e/", "%empty"),
                                        ("/s/7", "7"), ("/p/a/b", "a%2Fb"), ("/a/%2E", "%2E"),
                                        ("/l/%2E%2E", "%2E%2E")])
def test_dot_keys_take_their_own_lock_in_both_plugins(django_client: Client, flask_client: Any, path: str,
                                                      name: str) -> None:
    dj = django_client.post(path)
    fl = flask_client.post(path)
    assert (dj.status_code, fl.status_code) == (200, 200)
    assert dj.json()["name"] == fl.json["name"] == name
