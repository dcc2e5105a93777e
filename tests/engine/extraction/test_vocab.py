"""The per-tokenizer tables (A.12.2, A.12.3): on the tiny model's real byte-level tokenizer and on a hand-made
WordLevel tokenizer whose tokens are chosen to hit each rule."""

import pytest
import torch
from tokenizers import AddedToken, Tokenizer
from tokenizers.models import WordLevel

from spinf.engine.extraction.grammar import NUMBER_ALPHABET, START, Phase, State, complete, feed
from spinf.engine.extraction.vocab import Vocabulary, vocabulary
from spinf.engine.gemma4.tiny import ensure_tiny_snapshot


@pytest.fixture(scope="module")
def tiny(tiny_cache):
    """The tiny model's real tokenizer, from its snapshot in the session's cache (generated there if missing)."""
    return Tokenizer.from_file(str(ensure_tiny_snapshot(tiny_cache) / "tokenizer.json"))


@pytest.fixture(scope="module")
def tiny_vocab(tiny):
    return vocabulary(tiny, [1])


WORDS = ["<unk>", "5", " 5", "1,2", " million", "million", "5 million", " thousand", "$", "€", "(", ")", "abc",
         '"', "”", '".', ' "', "'", "’s", "x\ny", "a<b|c>", "−", "", "12%", "<b>"]  # fmt: skip
# "---" is special text in the number alphabet: special tokens are never number candidates either.
SPECIAL = ["<eos>", "<bos>", "<end_of_turn>", "<turn|>", "<|im_end|>", "<|tool>", "---"]


@pytest.fixture(scope="module")
def words():
    tokenizer = Tokenizer(WordLevel({w: i for i, w in enumerate(WORDS)}, unk_token="<unk>"))
    tokenizer.add_special_tokens([AddedToken(s, special=True, normalized=False) for s in SPECIAL])
    tokenizer.add_tokens([AddedToken("<|plain|>", special=False, normalized=False)])
    return tokenizer


def ids_of(mask):
    return set(mask.nonzero().flatten().tolist())


def test_a_token_text_is_the_id_decoded_alone(tiny, tiny_vocab):
    assert len(tiny_vocab.texts) == tiny.get_vocab_size() == tiny_vocab.num_logits
    space_t, newline = tiny.token_to_id("Ġt"), tiny.token_to_id("Ċ")
    assert tiny_vocab.texts[space_t] == " t" and tiny_vocab.texts[newline] == "\n"  # not the pieces Ġt, Ċ
    assert tiny_vocab.texts[tiny.token_to_id("£")] == "\ufffd"  # one byte of a two-byte character
    for i in (0, 2, 5, 300, 4000, 8191):
        assert tiny_vocab.texts[i] == tiny.decode([i], skip_special_tokens=False)


def test_number_candidates_on_the_real_tokenizer(tiny, tiny_vocab):
    table = tiny_vocab.number_table
    chosen = set(table.candidates.tolist())
    for i, text in enumerate(tiny_vocab.texts):
        expected = text != "" and set(text) <= set(NUMBER_ALPHABET) and i not in ids_of(tiny_vocab.special)
        assert (i in chosen) == expected, (i, text)
    assert {tiny.token_to_id("Ġ1"), tiny.token_to_id("$"), tiny.token_to_id("),")} <= chosen
    assert tiny.token_to_id("£") not in chosen


def test_the_table_is_the_grammar_on_every_state_and_candidate(tiny_vocab):
    table = tiny_vocab.number_table
    texts = [tiny_vocab.texts[i] for i in table.candidates.tolist()]
    index = {state: i for i, state in enumerate(table.states)}
    assert len(index) == len(table.states) == table.next_state.shape[0] == table.complete.shape[0]
    assert table.next_state.dtype == torch.int64 and table.next_state.shape[1] == len(texts)
    for q, (currency_slot, state) in enumerate(table.states):
        assert bool(table.complete[q]) == complete(state)
        assert currency_slot or not state.currency
        for c, text in enumerate(texts):
            after = feed(state, text, currency_slot)
            assert table.next_state[q, c] == (-1 if after is None else index[(currency_slot, after)])
    assert table.states[table.start(False)] == (False, START) and table.states[table.start(True)] == (True, START)
    reached = {table.start(False), table.start(True)} | set(table.next_state[table.next_state >= 0].tolist())
    assert reached == set(range(len(table.states)))  # every state is reachable, none is left over


def test_a_decoder_advances_beams_with_gathers(tiny, tiny_vocab):
    table = tiny_vocab.number_table
    column = {token: c for c, token in enumerate(table.candidates.tolist())}
    numbers = ["(1,496.5)", " $12.", "-3,000", "(168", "1, 2"]
    encoded = [tiny.encode(n, add_special_tokens=False).ids for n in numbers]
    state = torch.tensor([table.start(True)] * len(numbers))  # [beams]
    for t in range(max(map(len, encoded))):
        cols = torch.tensor([column[ids[t]] if t < len(ids) else 0 for ids in encoded])
        moved = table.next_state[state.clamp(min=0), cols]
        running = torch.tensor([t < len(ids) for ids in encoded]) & (state >= 0)
        state = torch.where(running, moved, state)
    ended = table.complete[state.clamp(min=0)] & (state >= 0)
    assert ended.tolist() == [True, True, True, False, False]
    assert [bool(s >= 0) for s in state] == [True, True, True, True, False]


def test_the_stop_set_of_a_quoted_slot(tiny, tiny_vocab):
    stop = tiny_vocab.stop_mask('"')
    expected = {i for i, text in enumerate(tiny_vocab.texts) if text[:1] in '"”' or "\n" in text} | {1, 5}
    assert ids_of(stop) == expected
    assert tiny.token_to_id('".') in expected and tiny.token_to_id('Ġ"') not in expected
    assert ids_of(tiny_vocab.stop_mask("")) == {i for i, t in enumerate(tiny_vocab.texts) if "\n" in t} | {1, 5}
    assert tiny_vocab.stop_mask('" said') is stop  # cached per first character
    forbidden = tiny_vocab.forbidden_mask('"')
    assert ids_of(forbidden) == expected | set(range(12))  # the tiny tokenizer's 12 special tokens


def test_rules_on_chosen_tokens(words):
    vocab = Vocabulary.build(words, eos_ids=[WORDS.index("5")], num_logits=len(WORDS) + len(SPECIAL) + 3)
    wid = {w: words.token_to_id(w) for w in [*WORDS[1:], *SPECIAL, "<|plain|>"] if w}
    extra = set(range(words.get_vocab_size(), vocab.num_logits))
    assert ids_of(vocab.eos) == {wid["5"], wid["<end_of_turn>"], wid["<turn|>"], wid["<|im_end|>"]}
    assert ids_of(vocab.special) == {wid[s] for s in SPECIAL} | extra
    assert ids_of(vocab.angle_pipe) == {wid["<turn|>"], wid["<|im_end|>"], wid["<|tool>"], wid["<|plain|>"]}
    assert ids_of(vocab.newline) == {wid["x\ny"]}
    eos = ids_of(vocab.eos)
    assert ids_of(vocab.stop_mask('"')) == {wid['"'], wid["”"], wid['".'], wid["x\ny"]} | eos
    assert ids_of(vocab.stop_mask("”")) == ids_of(vocab.stop_mask('"'))
    assert ids_of(vocab.stop_mask("'")) == {wid["'"], wid["’s"], wid["x\ny"]} | eos
    assert ids_of(vocab.stop_mask("a")) == {wid["abc"], wid["a<b|c>"], wid["x\ny"]} | eos
    forbidden = ids_of(vocab.forbidden_mask("a"))
    assert forbidden == ids_of(vocab.stop_mask("a")) | ids_of(vocab.special) | ids_of(vocab.angle_pipe)
    assert wid["<b>"] not in forbidden and wid["<|plain|>"] in forbidden and extra <= forbidden
    assert not (extra & ids_of(vocab.stop_mask("a")))  # unknown ids are never an end


def test_number_candidates_on_chosen_tokens(words):
    table = Vocabulary.build(words, eos_ids=[]).number_table
    texts = [words.decode([i], skip_special_tokens=False) for i in table.candidates.tolist()]
    assert sorted(texts) == sorted(["5", " 5", "1,2", " million", " thousand", "$", "€", "(", ")", "−", "12%"])
    col = {text: c for c, text in enumerate(texts)}
    index = {state: i for i, state in enumerate(table.states)}

    def go(currency_slot, *pieces):
        q = table.start(currency_slot)
        for piece in pieces:
            q = int(table.next_state[q, col[piece]])
            if q < 0:
                return None
        return table.states[q][1]

    assert go(False, "5", " million") == State(phase=Phase.POST)
    assert go(False, "(", "5", " thousand", ")") == State(phase=Phase.CLOSED, negative=True)
    assert go(False, "€") is None and go(True, "€", " 5") == State(phase=Phase.INT, currency=True)
    assert go(True, "−", "$", "1,2") == State(phase=Phase.INT, negative=True, currency=True)
    assert go(False, " million") is None and go(False, "12%", ")") is None
    assert all(not state.currency for currency_slot, state in index if not currency_slot)


def test_built_once_per_tokenizer(words):
    assert vocabulary(words, [1, 2]) is vocabulary(words, [2, 1, 2])
    assert vocabulary(words, [1]) is not vocabulary(words, [1, 2])
    assert vocabulary(words, [1]).number_table is vocabulary(words, [1]).number_table


def test_a_model_narrower_than_its_tokenizer_is_refused(words):
    with pytest.raises(ValueError, match=r"^the model has 3 logits, fewer than the tokenizer's \d+ tokens$"):
        Vocabulary.build(words, eos_ids=[], num_logits=3)
