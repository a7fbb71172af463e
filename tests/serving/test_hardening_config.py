"""The recipe's hardening settings reach what enforces them: multimodal.image_fetch -> the
engine's FetchPolicy (None, remote images off, by default); [server] header/body timeouts and
the connection cap -> the app's state and uvicorn's config; the Responses store's size -> the state."""

from __future__ import annotations

import pytest

from g906.recipe.errors import RecipeError
from g906.serving import build_app, load_and_resolve
from g906.serving.serve import DrainingServer, bind
from g906.serving.vision import fetch_policy

BASE = '[model]\nsource = "builtin:tiny-qwen35"\n'


def _plan(tmp_path, text):
    p = tmp_path / "r.toml"
    p.write_text(text)
    return load_and_resolve(p)


def test_remote_images_off_by_default(tmp_path):
    assert fetch_policy(_plan(tmp_path, BASE)) is None


def test_image_fetch_settings(tmp_path):
    plan = _plan(tmp_path, BASE + '[multimodal.image_fetch]\nallowed_hosts = ["images.example.com", "*.cdn.example"]\n'
                 'timeout_s = 3\nmax_bytes = 65536\nmax_concurrent = 2\n')
    pol = fetch_policy(plan)
    assert pol.allowed_hosts == ("images.example.com", "*.cdn.example") and pol.schemes == ("https",)
    assert (pol.timeout_s, pol.max_bytes, pol.max_concurrent, pol.allow_private_networks) == (3, 65536, 2, False)


@pytest.mark.parametrize("bad", ['allowed_hosts = ["http://x.com/a"]', 'schemes = ["ftp"]', "timeout_s = 0"])
def test_bad_image_fetch_settings_are_recipe_errors(tmp_path, bad):
    with pytest.raises(RecipeError) as e:
        _plan(tmp_path, BASE + "[multimodal.image_fetch]\n" + bad + "\n")
    assert e.value.issues[0].line == 4


def test_server_limits(tmp_path):
    plan = _plan(tmp_path, BASE + "[server]\nheader_timeout_s = 2.5\nbody_timeout_s = 7\nmax_connections = 99\n")
    _, state = build_app(plan)
    assert state.body_timeout_s == 7
    sock = bind("127.0.0.1", 0)
    try:
        srv = DrainingServer(None, sock, header_timeout_s=plan.recipe.server.header_timeout_s,
                             max_connections=plan.recipe.server.max_connections)
        assert srv.server.config.limit_concurrency == 99
        assert srv.server.config.http.__name__ == "HeaderDeadlineProtocol"
    finally:
        sock.close()
    defaults = _plan(tmp_path, BASE).recipe.server
    assert (defaults.header_timeout_s, defaults.body_timeout_s, defaults.max_connections) == (10.0, 60.0, 2048)


def test_responses_store_size(tmp_path):
    _, state = build_app(_plan(tmp_path, BASE + "[server]\nmax_stored_responses = 5\n"))
    assert state.responses.max_count == 5
    _, state = build_app(_plan(tmp_path, BASE))
    assert state.responses.max_count == 1000
    with pytest.raises(RecipeError):
        _plan(tmp_path, BASE + "[server]\nmax_stored_responses = 0\n")
