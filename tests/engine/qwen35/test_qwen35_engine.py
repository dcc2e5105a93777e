"""The Qwen3.5 stack through the engine (`Engine` on a checkpoint folder, api spec §9.6 case 2): the chosen bodies of
tests/engine/test_oracle.py scored in-process equal an independent transformers forward of every prompt alone
(`tests.engine.oracle.Oracle`) to 1e-4; the model's refusals (extraction, media, settings of the Gemma stack) come
with the spec's codes."""

from __future__ import annotations

import json
import math

import pytest
import torch
from safetensors.torch import load_file
from transformers import AutoModelForCausalLM

from spinf import Engine
from spinf.engine.folder import read_tensors
from spinf.engine.layout import build_pass
from spinf.engine.qwen35.int4 import int4_linears
from spinf.engine.qwen35.int4_write import write_gptq_checkpoint
from spinf.engine.qwen35.model import load_qwen35
from spinf.engine.qwen35.outliers import read_outliers
from spinf.engine.qwen35.tiny import write_tiny_decider, write_tiny_qwen35
from spinf.engine.scorer import one_cpu_thread
from spinf.engine.trie import Job, add_prompt
from spinf.errors import ApiError, ConfigError, ModelError
from tests.engine.qwen35.hf_checkpoint import check_scores, oracle_of
from tests.engine.test_oracle import CHOSEN, text_input


@pytest.fixture(scope="module")
def folder(tmp_path_factory):
    return write_tiny_qwen35(tmp_path_factory.mktemp("tiny-qwen35"))


@pytest.fixture(scope="module")
def engine(folder):
    return Engine(str(folder), device="cpu")


@pytest.fixture(scope="module")
def oracle(folder):
    return oracle_of(folder)  # the tiny twin carries the tiny Gemma's tokenizer, read as it is


@pytest.mark.parametrize("name", sorted(CHOSEN))
def test_scores_equal_transformers_on_every_chosen_body(engine, oracle, name):
    body = CHOSEN[name]
    check_scores(engine.score(body), body, oracle)


def test_the_engine_reports_the_qwen_stack(engine):
    assert engine.family == "qwen35" and engine.quant == "fp32"
    assert engine.info()["lm_head"] == "lm_head fp32" and engine.info()["layers"] == 6
    assert not engine.batch_invariant  # a folder outside the catalog carries no guarantee (api spec §9.6)


def refusal(engine, body: dict) -> ApiError:
    with pytest.raises(ApiError) as caught:
        engine.score(body)
    return caught.value


def test_extraction_runs_on_the_cpu(engine):
    """Extraction on this stack decodes on the CPU (tests/engine/qwen35/test_qwen35_extraction.py checks it against
    transformers); on a GPU it is refused, saying so, until the GPU recurrence keeps a prefix's state."""
    assert engine.features.extraction and engine.features.generation and not engine.features.extraction_note
    body = {
        "inputs": [text_input("in0", "Order 123 was late.")],
        "scoring": {"queries": [{"id": "n", "template": "\n\nThe order number is{n}"}]},
    }
    assert engine.score(body)["results"][0]["queries"][0]["kind"] == "number"


def test_images_are_not_read_on_this_stack(engine):
    pixel = (
        "data:image/png;base64,iVBORw0KGgoAAAANSUhEUgAAAAEAAAABCAYAAAAfFcSJAAAADUlEQVR42mNk+M9QDwADhgGAWjR9awAAAABJRU5E"
        "rkJggg=="
    )
    content = [{"type": "text", "text": "A photo:"}, {"type": "image_url", "image_url": {"url": pixel}}]
    body = {
        "messages": [{"role": "user", "content": content}],
        "scoring": {"queries": [{"id": "q", "template": "\n\nA cat?{?}", "options": [" yes", " no"]}]},
    }
    error = refusal(engine, body)
    assert (error.status, error.code) == (400, "media_not_supported")


def test_the_gemma_stacks_fp8_schemes_are_refused_not_ignored(folder):
    with pytest.raises(ModelError, match="the Gemma 4 stack only"):
        Engine(str(folder), device="cpu", quant="fp8")


@pytest.fixture(scope="module")
def decider_folder(tmp_path_factory):
    return write_tiny_decider(tmp_path_factory.mktemp("tiny-decider"))


@pytest.fixture(scope="module")
def decider(decider_folder):
    return Engine(str(decider_folder), device="cpu")


def readout_logprobs(folder, decider_folder, prompt: list[int]) -> torch.Tensor:
    """An independent reading of A.15: transformers' decoder (the tiny checkpoint's, whose decoder weights the tiny
    decider shares) gives the final-normed hidden row, and the readout's codes get a softmax of their own."""
    model = AutoModelForCausalLM.from_pretrained(folder, dtype=torch.float32, attn_implementation="eager").eval()
    with torch.no_grad():
        out = model(torch.tensor([prompt]))
        last = model.model(torch.tensor([prompt])).last_hidden_state[0, -1]
        assert torch.allclose(model.lm_head(last), out.logits[0, -1], atol=1e-5)  # last_hidden_state is normed
    config = json.loads((decider_folder / "decision_config.json").read_text())
    matrix = load_file(str(decider_folder / "readout.safetensors"))["weight"].double()
    codes = torch.log_softmax((matrix @ last.double()) / config["temperature"], dim=-1)
    row = torch.full((8192,), -math.inf, dtype=torch.float64)
    row[torch.tensor(config["token_ids"])] = codes
    return row


def test_the_decider_scores_with_its_readout(folder, decider_folder, decider):
    body = {
        "messages": [{"role": "user", "content": "I was charged twice for one order."}],
        "scoring": {
            "queries": [{"id": "refund", "template": "\n\nRefund? Answer:{?}", "options": [" yes", " no"]}],
            "case_insensitive": False,
            "empty_floor": False,
        },
    }
    got = decider.score(body)["results"][0]["queries"][0]["combinations"][0]
    tk = decider.tokenizer
    prompt = [*tk.bos, *tk.tok("I was charged twice for one order."), *tk.tok("\n\nRefund? Answer:")]
    row = readout_logprobs(folder, decider_folder, prompt)
    expected = [float(row[tk.tok(option)[0]]) for option in (" yes", " no")]
    total = sum(math.exp(x) for x in expected)
    for option, lp in zip(got["options"], expected, strict=True):
        assert abs(option["logprob"] - lp) <= 1e-4
        assert abs(option["p"] - math.exp(lp) / total) <= 1e-4  # the decider's own masked softmax, renormalised
    assert decider.info()["lm_head"] == "readout fp32"


def test_the_decider_refuses_options_that_are_not_its_codes(decider):
    body = {
        "messages": [{"role": "user", "content": "I was charged twice."}],
        "scoring": {"queries": [{"id": "q", "template": "\n\nRefund? Answer:{?}", "options": [" yes", " maybe"]}]},
    }
    error = refusal(decider, body)
    assert (error.status, error.code, error.param) == (400, "invalid_field", "scoring.queries.0.options.1")
    assert "answer codes" in error.message


def test_the_decider_refuses_extraction_as_a_decision_model(decider):
    body = {
        "inputs": [text_input("in0", "Order 123 was late.")],
        "scoring": {"queries": [{"id": "n", "template": "\n\nThe order number is{n}"}]},
    }
    error = refusal(decider, body)
    assert error.code == "extraction_disabled" and "decision model scores options only" in error.message
    assert decider.limits.max_extractions_per_input == 0  # api spec §9.4: the decider forces 0


@pytest.fixture(scope="module")
def int4_folder(folder, tmp_path_factory):
    return write_gptq_checkpoint(folder, tmp_path_factory.mktemp("tiny-int4"), outlier_channels=4)


@pytest.mark.parametrize(("quant", "scheme"), [("", "int4-i8"), ("f16", "int4-f16"), ("int4-bf16", "int4-bf16")])
def test_an_int4_folder_runs_its_modes_as_the_model_does(int4_folder, quant, scheme):
    """The engine on a GPTQ folder (automatic: i8) gives, bit for bit, what the int4 model gives on the same pass
    (tests/engine/qwen35/test_int4.py compares those with the float model), and reports ``int4-<mode>``."""
    engine = Engine(str(int4_folder), device="cpu", quant=quant)
    assert engine.quant == scheme and engine.info()["quant"] == scheme
    mode = scheme.removeprefix("int4-")
    model = load_qwen35(
        int4_folder, linear=int4_linears(read_tensors(int4_folder, ""), mode, read_outliers(int4_folder))
    )
    body = {
        "messages": [{"role": "user", "content": "I was charged twice for one order."}],
        "scoring": {
            "queries": [{"id": "q", "template": "\n\nRefund? Answer:{?}", "options": [" yes", " no"]}],
            "case_insensitive": False,
            "empty_floor": False,
        },
    }
    got = engine.score(body)["results"][0]["queries"][0]["combinations"][0]["options"]
    tk = engine.tokenizer
    job = Job(tuple(tk.bos) + tk.tok("I was charged twice for one order."))
    read = add_prompt(job, tk.tok("\n\nRefund? Answer:"), [tk.tok(" yes"), tk.tok(" no")])[0][0]
    layout = build_pass([job])
    with one_cpu_thread(torch.device("cpu")), torch.inference_mode():
        row = model.pass_logprobs(layout)[layout.read_index[(0, *read)][0]]
    for option, text in zip(got, (" yes", " no"), strict=True):
        assert option["logprob"] == round(float(row[tk.tok(text)[0]]), 6)


def test_an_int4_folder_refuses_the_float_schemes(int4_folder):
    with pytest.raises(ConfigError, match="^quant 'fp32' cannot run .* on cpu: allowed are i8, f16, fp8, bf16$"):
        Engine(str(int4_folder), device="cpu", quant="fp32")


@pytest.mark.parametrize(("name", "repo", "revision"), [
    ("qwen3.8-27b-s", "spinf/qwen3.8-27b-int4", "22de4859c04ccdb4136d89b66e56e717db752c7c"),
    ("spinf/pplx-decider-v1-27b-int4", "spinf/pplx-decider-v1-27b-int4", "5579a6ec32478b65920cb2a1d9fd23349fb51699"),
])  # fmt: skip
def test_the_catalog_finds_its_qwen_checkpoints_in_a_hub_cache(tmp_path, monkeypatch, name, repo, revision):
    """Locally made checkpoints in the published layout (GPTQ int4 v1, the decider's readout beside it) at the
    manifests' pinned revisions under a Hub cache root: the catalog names resolve to them on a GPU, int4-i8 by
    default, with nothing downloaded. (Serving them needs a CUDA GPU: on the CPU the catalog refuses them.)"""
    from spinf.catalog import resolve_model
    from spinf.engine import opening
    from spinf.engine.hardware import GIB, DeviceFacts

    source = write_tiny_decider(tmp_path / "float") if "decider" in repo else write_tiny_qwen35(tmp_path / "float")
    snapshot = tmp_path / "hub" / ("models--" + repo.replace("/", "--")) / "snapshots" / revision
    write_gptq_checkpoint(source, snapshot, outlier_channels=4)
    facts = DeviceFacts(device="cuda:0", name="fake GPU", capability=(9, 0), free_bytes=80 * GIB)
    monkeypatch.setattr(opening, "device_facts", lambda device: facts)
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    resolved, checkpoint, scheme = opening.open_checkpoint(
        resolve_model(name), device="cuda:0", cache_dirs=[str(tmp_path / "hub")]
    )
    assert (resolved.served_name, checkpoint.folder, checkpoint.revision) == (repo, snapshot, revision)
    assert (checkpoint.family, checkpoint.weight_format, scheme) == ("qwen35", "gptq-int4-g32", "int4-i8")


def test_bf16_on_the_cpu_runs_the_recurrence_in_fp32(folder, engine):
    """``--quant bf16`` on a float folder emulates bf16 activations; the recurrent state stays fp32 (engine spec
    B.14.1) and the rotary tables take the activations' dtype, so the pass runs and lands near the fp32 scores."""
    bf16 = Engine(str(folder), device="cpu", quant="bf16")
    body = {
        "inputs": [text_input("in0", "I was charged twice for one order.")],
        "scoring": {"queries": [{"id": "q", "template": "\n\nRefund? Answer:{?}", "options": [" yes", " no"]}]},
    }
    got = bf16.score(body)["results"][0]["queries"][0]["combinations"][0]["options"]
    expected = engine.score(body)["results"][0]["queries"][0]["combinations"][0]["options"]
    assert bf16.quant == "bf16"
    assert all(abs(a["p"] - b["p"]) < 0.2 for a, b in zip(got, expected, strict=True))


def test_a_qwen_checkpoint_quantized_another_way_is_refused(folder, tmp_path):
    """An fp8 (or any non-GPTQ) quantization config would load as float weights without their scales."""
    import shutil

    other = tmp_path / "fp8"
    shutil.copytree(folder, other)
    config = json.loads((other / "config.json").read_text())
    config["quantization_config"] = {"quant_method": "fp8", "weight_block_size": [128, 128]}
    (other / "config.json").write_text(json.dumps(config))
    with pytest.raises(ModelError, match="quantized with 'fp8' is not read by this build"):
        Engine(str(other), device="cpu")


def test_the_deciders_warm_up_asks_with_its_own_codes(decider):
    from spinf.engine import warm

    options = warm.answer_options(decider)
    assert options is not None and len(options) == 2
    assert all(decider.tokenizer.tok(o)[0] in decider.shape.answer_codes for o in options)
    for step in warm.steps(decider, "short"):
        step()


@pytest.mark.parametrize("mode", ["float", "i8"])
def test_the_mlp_in_row_chunks_changes_no_bit(folder, int4_folder, mode, monkeypatch):
    """`MLP_ROWS` bounds the MLP's intermediate; its rows are independent, so chunking a pass changes no bit."""
    from spinf.engine.qwen35 import model as qwen_model

    if mode == "float":
        model = load_qwen35(folder)
    else:
        model = load_qwen35(
            int4_folder, linear=int4_linears(read_tensors(int4_folder, ""), mode, read_outliers(int4_folder))
        )
    tk = Engine(str(folder), device="cpu").tokenizer
    jobs = []
    for k, text in enumerate(["I was charged twice for one order. " * 12, "The parcel came late and broken. " * 9]):
        job = Job(tuple(tk.bos) + tk.tok(text))
        for question in ("\n\nRefund? Answer:", "\n\nAngry? Answer:", f"\n\nCase {k}? Answer:"):
            add_prompt(job, tk.tok(question), [tk.tok(" yes"), tk.tok(" no")])
        jobs.append(job)
    layout = build_pass(jobs)
    assert len(layout.token_ids) > 2 * 128
    with one_cpu_thread(torch.device("cpu")), torch.inference_mode():
        whole = model.pass_logprobs(layout)
        monkeypatch.setattr(qwen_model, "MLP_ROWS", 128)  # the CPU's row block: chunks of the same blocks
        chunked = model.pass_logprobs(layout)
    assert torch.equal(whole, chunked)
