"""`g906 up` end to end with images: a recipe serving the tiny multimodal GGUF (+ its mmproj
found beside it), the openai client sending images as data URLs; the recipe's limits (count,
width, height) and bad images answered with 400."""

from __future__ import annotations

import pytest

from tests.multimodal.conftest import data_url, png_bytes
from tests.server.conftest import openai_client, serving

RECIPE = """
[model]
source = "{model}"
name = "tiny-vl"

[multimodal]
image = {{ count = 2, width = 400, height = 300 }}

[limits]
max_model_len = 1024
max_num_seqs = 4
max_num_batched_tokens = 64

[server]
api_key_env = "G906_TEST_API_KEY"
"""


@pytest.fixture(scope="module")
def vl_server(vl_gguf_dir, tmp_path_factory):
    yield from serving(tmp_path_factory.mktemp("g906-up-vl"), RECIPE.format(model=vl_gguf_dir / "tiny-vl-F32.gguf"))


@pytest.fixture(scope="module")
def vl_client(vl_server):
    return openai_client(vl_server)


def _msg(*images: str, text: str = "What is in the picture?") -> list[dict]:
    parts = [{"type": "image_url", "image_url": {"url": u}} for u in images]
    return [{"role": "user", "content": parts + [{"type": "text", "text": text}]}]


def test_image_chat(vl_client):
    r = vl_client.chat.completions.create(model="tiny-vl", messages=_msg(data_url(png_bytes(150, 100))),
                                          max_tokens=8, temperature=0)
    assert r.choices[0].finish_reason in ("length", "stop")
    assert r.usage.completion_tokens >= 1
    text_only = vl_client.chat.completions.create(
        model="tiny-vl", messages=[{"role": "user", "content": "What is in the picture?"}], max_tokens=1)
    # 150x100 is resized to 320x224 (min_pixels 65536): 10 x 7 merged tokens replace one placeholder,
    # plus vision_start/end
    assert r.usage.prompt_tokens == text_only.usage.prompt_tokens + 70 + 2


def test_two_images_stream(vl_client):
    urls = [data_url(png_bytes(64, 64, seed=1)), data_url(png_bytes(300, 200, seed=2))]
    chunks = list(vl_client.chat.completions.create(model="tiny-vl", messages=_msg(*urls), max_tokens=5,
                                                    temperature=0, stream=True))
    assert chunks[-1].choices[0].finish_reason in ("length", "stop")


def test_same_answer_twice(vl_client):
    kw = dict(model="tiny-vl", messages=_msg(data_url(png_bytes(90, 120, seed=4))), max_tokens=6, temperature=0)
    a = vl_client.chat.completions.create(**kw).choices[0].message.content
    b = vl_client.chat.completions.create(**kw).choices[0].message.content
    assert a == b


@pytest.mark.parametrize("images,msg", [
    ([png_bytes(32, 32)] * 3, "at most 2 per request"),
    ([png_bytes(401, 100)], "beyond this server's limit of 400x300"),
    ([png_bytes(100, 301)], "height 301 > 300"),
    ([b"not an image at all"], "not an image"),
])
def test_limits_and_bad_images(vl_client, images, msg):
    import openai

    with pytest.raises(openai.BadRequestError) as exc:
        vl_client.chat.completions.create(model="tiny-vl", messages=_msg(*[data_url(b) for b in images]),
                                          max_tokens=2)
    assert msg in str(exc.value)


def test_bad_parts(vl_client):
    import openai

    for part, msg in [
        ({"type": "image_url", "image_url": {"url": "data:image/png;base64,@@@"}}, "not valid base64"),
        ({"type": "image_url", "image_url": {}}, "needs a URL"),
        ({"type": "image_url", "image_url": {"url": "/etc/passwd"}}, "local image paths are not allowed"),
        # remote fetching is off unless the recipe lists hosts (multimodal.image_fetch)
        ({"type": "image_url", "image_url": {"url": "http://169.254.169.254/latest/meta-data"}}, "turned off"),
        ({"type": "image_url", "image_url": {"url": "http://127.0.0.1:1/x.png"}}, "turned off"),
        ({"type": "input_audio", "input_audio": {}}, "input_audio"),
    ]:
        with pytest.raises(openai.BadRequestError) as exc:
            vl_client.chat.completions.create(model="tiny-vl", max_tokens=2,
                                              messages=[{"role": "user", "content": [part]}])
        assert msg in str(exc.value)
