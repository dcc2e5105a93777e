"""The packing policy and the trie/pass layout: pure Python, no model."""

from __future__ import annotations

from hypothesis import given
from hypothesis import strategies as st

from spinf.engine.layout import build_pass
from spinf.engine.packing import pack
from spinf.engine.trie import PREFIX_END, Job, TokenTrie, add_prompt


@given(st.lists(st.integers(1, 600), max_size=60), st.sampled_from([128, 256, 1024]))
def test_every_job_lands_in_exactly_one_pass_within_the_budget(sizes, budget):
    passes = pack(sizes, budget)
    assert sorted(i for p in passes for i in p) == list(range(len(sizes)))
    for p in passes:
        total = sum(sizes[i] for i in p)
        assert total <= budget or len(p) == 1


def test_long_jobs_run_alone_and_small_ones_fill_first_fit_decreasing():
    assert pack([100, 900, 60, 50, 40], budget=150) == [[1], [0, 3], [2, 4]]


def test_packing_is_deterministic_on_ties():
    assert pack([10, 10, 10], budget=20) == [[0, 1], [2]]


def test_trie_shares_common_prefixes_and_lays_out_subtrees_contiguously():
    trie = TokenTrie()
    a = trie.insert([5, 6, 7])
    b = trie.insert([5, 6, 8])
    c = trie.insert([9])
    assert a[:2] == b[:2] and a[2] != b[2]
    assert len(trie) == 5
    assert trie.depth == [0, 1, 2, 2, 0]
    order = trie.preorder()
    assert order == [a[0], a[1], a[2], b[2], c[0]]


def test_reads_follow_the_chain_rule_and_share_lead_ins():
    job = Job(prefix=(2, 40, 41))
    reads = add_prompt(job, (50, 51), [(60,), (61, 62), (61, 63)])
    end = job.trie.insert((50, 51))[-1]
    lead = job.trie.insert((50, 51, 61))[-1]
    assert reads == [[(end, 60)], [(end, 61), (lead, 62)], [(end, 61), (lead, 63)]]
    assert len(job.trie) == 3  # the lead-in " 61" is stored once for both spellings


def test_a_prompt_without_tokens_reads_at_the_prefix_end():
    job = Job(prefix=(2, 40))
    assert add_prompt(job, (), [(7,)]) == [[(PREFIX_END, 7)]]


def test_pass_layout_positions_paths_and_reads():
    first, second = Job(prefix=(2, 10, 11)), Job(prefix=(2,))
    add_prompt(first, (20, 21), [(30,)])
    add_prompt(first, (20, 22), [(31, 32)])
    add_prompt(second, (), [(33,)])
    layout = build_pass([first, second])
    assert layout.token_ids == [2, 10, 11, 20, 21, 22, 31, 2]
    assert layout.positions == [0, 1, 2, 3, 4, 4, 5, 0]
    assert layout.spans == [(0, 3, 4), (7, 1, 0)]
    assert layout.paths == [[3], [3, 4], [3, 5], [3, 5, 6]]
    # the read of token 32 happens at the lead-in row 6; token 33 at the second job's prefix end (row 7)
    rows = {key: layout.read_rows[r] for key, (r, _) in layout.read_index.items()}
    assert rows[(1, PREFIX_END, 33)] == 7
    assert sorted(rows.values()) == [4, 5, 6, 7]
