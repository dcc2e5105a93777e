"""What users of the reference engine switch over with, against a real server (issue 31): the ``openai`` SDK's
``models.list()`` and ``models.retrieve()`` (api spec §7, OpenAI's shape beside the entry), spinf-client 0.3.1's
``models()`` unchanged, and a trusted front end's per-call ``limits`` as the reference reads them (§4.11: unknown
keys ignored, here with an ``ignored_field`` warning of §5.6; strings of digits read as integers).

``spinf-serve serve spinf/tiny-gemma4 --device cpu`` runs as a child process, one for the module, with an access
token and a trusted token.
"""

from __future__ import annotations

import time

import httpx
import openai
import pytest
from spinf_client import SpinfClient, billed_tokens, text

from contrib.loadtest.harness import ServerProcess, tiny_cache

TOKEN, TRUSTED = "tok", "boss"
CONTENT = "My parcel never arrived and nobody answers the phone. I want my money back."
QUERY = {"id": "refund", "template": "\n\nDoes the writer want a refund? Answer:{?}", "options": [" yes", " no"]}


@pytest.fixture(scope="module")
def server(tmp_path_factory):
    folder = tmp_path_factory.mktemp("dropin")
    started = int(time.time())
    process = ServerProcess(folder, "--token", TOKEN, "--trusted-token", TRUSTED, hf_home=tiny_cache(folder / "hf"))
    process.started = started
    yield process
    assert process.stop() == 0, process.output()


def sdk(server, token: str = TOKEN) -> openai.OpenAI:
    return openai.OpenAI(api_key=token, base_url=f"{server.url}/v1", max_retries=0, timeout=60)


# The openai SDK's models calls


def test_the_sdk_lists_the_served_model(server):
    listed = list(sdk(server).models.list())
    assert [(m.id, m.object, m.owned_by) for m in listed] == [("spinf/tiny-gemma4", "model", "spinf")]
    assert server.started - 1 <= listed[0].created <= time.time()  # the server's start, in Unix seconds
    assert [m.created for m in sdk(server).models.list()] == [listed[0].created]  # the same on every call


@pytest.mark.parametrize("name", ["spinf/tiny-gemma4", "SPINF/tiny-gemma4", "tiny", "Tiny"])
def test_the_sdk_retrieves_the_served_model_by_its_id_or_alias_in_any_case(server, name):
    """The SDK sends the id's / as %2F; an alias answers with the served id, as the list names it."""
    found = sdk(server).models.retrieve(name)
    assert found == next(iter(sdk(server).models.list()))
    assert found.id == "spinf/tiny-gemma4" and found.object == "model"


@pytest.mark.parametrize("name", ["gpt-4o", "spinf/gemma-4-12b-fp8", "spinf-12b", "tiny-gemma4", "spinf/tiny"])
def test_the_sdk_gets_not_found_for_another_name(server, name):
    with pytest.raises(openai.NotFoundError) as info:
        sdk(server).models.retrieve(name)
    error = info.value.body
    assert info.value.status_code == 404 and error["code"] == "model_not_served" and error["param"] == "id"
    assert error["type"] == "not_found" and name in error["message"]


def test_the_models_routes_need_the_access_token(server):
    for call in (lambda c: c.models.list(), lambda c: c.models.retrieve("tiny")):
        with pytest.raises(openai.AuthenticationError):
            call(sdk(server, token="wrong"))
    assert sdk(server, token=TRUSTED).models.retrieve("tiny").id == "spinf/tiny-gemma4"  # either token


# spinf-client 0.3.1


def test_spinf_client_reads_models_as_before(server):
    client = SpinfClient(api_key=TOKEN, base_url=server.url, model="tiny")
    body = client.models()
    (entry,) = body["models"]
    assert entry["id"] == "spinf/tiny-gemma4" and entry["aliases"] == ["tiny"] and entry["status"] == "available"
    assert body["data"] == [sdk(server).models.retrieve("tiny").model_dump(exclude_unset=True)]
    assert client.score(content=[text(CONTENT)], queries=[QUERY])["results"][0]["queries"][0]["id"] == "refund"


def test_spinf_client_billed_tokens_reads_the_hosted_price_list_not_models(server):
    """spinf-client's ``billed_tokens`` takes a model's entry of the hosted ``pricing()`` (per-detail prices under
    ``media``), which §7's entry is not: its ``media`` is the list of kinds and it has no prices, so the estimator
    fails on it (docs/scoring-api.md says so). What a call would bill is in its answer, ``usage.billed_tokens``."""
    client = SpinfClient(api_key=TOKEN, base_url=server.url, model="tiny")
    (entry,) = client.models()["models"]
    assert entry["media"] == ["image", "audio", "video"] and not any("price" in key for key in entry)
    with pytest.raises(AttributeError, match=r"^'list' object has no attribute 'get'$"):
        billed_tokens(entry, text_tokens=10)
    usage = client.score(content=[text(CONTENT)], queries=[QUERY])["usage"]
    assert usage["billed_tokens"] == max(usage["prompt_tokens"], 1000)
    assert billed_tokens({"min_billed_tokens_per_call": 1000}, usage["prompt_tokens"]) == usage["billed_tokens"]


# A trusted front end's per-call limits and features (§4.11)


def score(server, token: str, **overrides) -> httpx.Response:
    body = {"messages": [{"content": CONTENT}], "scoring": {"queries": [QUERY]}, **overrides}
    return httpx.post(f"{server.url}/v1/score", json=body, headers={"Authorization": f"Bearer {token}"}, timeout=60)


def ignored(answer: httpx.Response) -> list[str]:
    return [w["param"] for w in answer.json()["warnings"] if w["code"] == "ignored_field"]


def test_unknown_limits_and_features_keys_are_ignored_with_a_warning(server):
    answer = score(server, TRUSTED, limits={"max_tokens": 256, "max_options": 10}, features={"packs": True})
    assert answer.status_code == 200, answer.text
    assert ignored(answer) == ["limits.max_tokens", "features.packs"]
    plain = score(server, TRUSTED)
    assert answer.json()["results"] == plain.json()["results"] and ignored(plain) == []


def test_a_limit_sent_as_a_string_of_digits_is_read_as_its_integer(server):
    answer = score(server, TRUSTED, limits={"max_content_tokens": "8192"})  # capped by the server's 4096
    assert answer.status_code == 200 and ignored(answer) == []
    tight = score(server, TRUSTED, limits={"max_content_tokens": "3"})  # read as 3: the content is longer
    assert tight.status_code == 400 and tight.json()["error"]["code"] == "content_too_long"
    assert "the limit is 3" in tight.json()["error"]["message"]


@pytest.mark.parametrize("value", ["abc", "8192.0", "-1", "0", 8192.5, True])
def test_a_limit_that_is_no_whole_number_is_still_refused(server, value):
    answer = score(server, TRUSTED, limits={"max_content_tokens": value})
    error = answer.json()["error"]
    assert answer.status_code == 400 and (error["code"], error["param"]) == (
        "invalid_field",
        "limits.max_content_tokens",
    )
    assert answer.json()["rejected"]["param"] == "limits.max_content_tokens"  # a trusted caller's 400


def test_an_untrusted_callers_limits_are_not_read_at_all(server):
    answer = score(server, TOKEN, limits={"max_tokens": 1, "max_content_tokens": "abc"}, features={"packs": 1})
    assert answer.status_code == 200 and ignored(answer) == []
