"""Batched greedy continuations: the same tokens as decoding each prompt alone, the same stopping
rules; the GRAFT walk and the replay that take one fall back to decoding where the check says no."""

from __future__ import annotations

import pytest
from conftest import noisy_copy, tiny_model
from test_lossless import EOS, prompts

from collectors.collect import replay
from collectors.collect.batch_greedy import check_greedy, greedy_batch
from collectors.collect.replay import Replayer
from collectors.evaluation.priced_eval import MemoReplayer, TargetMemo
from collectors.graft.budget import walk_choice_prompt
from decoder.core.config import DecodeConfig
from decoder.core.policies import schedule_bits
from decoder.generate import generate
from decoder.graft.proposers import CausalLMProposer
from decoder.models.pair import make_pair

M, K = 4, 4


@pytest.fixture(scope="module")
def pair():
    target = tiny_model("llama", seed=41)
    return make_pair(target, noisy_copy(target, noise=0.3, seed=42), eos_token_ids=(EOS,))


def alone(pair, prompt: list[int], n: int, eos: tuple[int, ...]) -> list[int]:
    """Autoregressive decoding of one prompt (the baseline every speedup divides by)."""
    solo = make_pair(pair.target, pair.mid, eos_token_ids=eos)
    return generate(solo, prompt, "ar", DecodeConfig(max_new_tokens=n), timing=False).new_tokens


def test_a_batch_of_prompts_of_different_lengths_decodes_each_as_it_decodes_alone(pair) -> None:
    """Left padding, per-row positions and the mask leave every row's tokens those of its own
    decode, whatever the batch size (one prompt of a single token included)."""
    batch = [[7], *prompts(pair.vocab_size, 6, seed=3)]
    assert len({len(p) for p in batch}) >= 5, "the prompts must differ in length to test the padding"
    want = [alone(pair, p, 24, ()) for p in batch]
    for size in (1, 3, 16):
        assert greedy_batch(pair.target, batch, 24, pair.vocab_size, (), batch_size=size) == want, size


def test_a_row_stops_after_its_first_eos_and_the_others_go_on(pair) -> None:
    batch = prompts(pair.vocab_size, 4, seed=9)
    free = [alone(pair, p, 20, ()) for p in batch]
    eos = free[0][4]  # the fifth token of the first row's free continuation ends that row there
    got = greedy_batch(pair.target, batch, 20, pair.vocab_size, (eos,))
    assert got == [alone(pair, p, 20, (eos,)) for p in batch]
    assert got[0] == free[0][: free[0].index(eos) + 1] and len(got[0]) <= 5
    assert any(len(g) == 20 for g in got), "every row stopped early: the others going on is untested"


def test_bad_input_is_refused(pair) -> None:
    with pytest.raises(ValueError, match="empty prompt"):
        greedy_batch(pair.target, [[3, 4], []], 5, pair.vocab_size)
    with pytest.raises(ValueError, match="max_new_tokens"):
        greedy_batch(pair.target, [[3, 4]], 0, pair.vocab_size)
    with pytest.raises(ValueError, match="batch_size"):
        greedy_batch(pair.target, [[3, 4]], 5, pair.vocab_size, batch_size=0)
    assert greedy_batch(pair.target, [], 5, pair.vocab_size) == []


def test_check_greedy_names_the_first_token_that_is_not_the_greedy_one(pair) -> None:
    prompt = prompts(pair.vocab_size, 1, seed=5)[0]
    out = alone(pair, prompt, 16, ())
    right = check_greedy(pair.target, prompt, out, pair.vocab_size)
    assert right.wrong is None and right.n_wrong == 0 and right.greedy == out and right.hidden is None
    bad = list(out)
    bad[6] = (bad[6] + 1) % pair.vocab_size
    bad[9] = (bad[9] + 1) % pair.vocab_size
    check = check_greedy(pair.target, prompt, bad, pair.vocab_size, hidden_states=True)
    assert check.wrong == 6 and check.greedy[6] == out[6] and check.n_wrong >= 2
    assert check.hidden is not None and check.hidden[-1].shape[1] == len(prompt) + len(bad) - 1


def test_the_walk_takes_a_checked_continuation_and_decodes_where_the_gate_rejects_it(pair) -> None:
    """Given the right continuation, the walks are those of the decoded prompt and nothing is decoded;
    given a wrong one, the prompt is decoded and the walks follow the decode."""
    prompt = prompts(pair.vocab_size, 1, seed=13)[0]

    def walk(output):
        return walk_choice_prompt(pair, CausalLMProposer(pair.mid, pair.vocab_size, K), None, prompt,  # type: ignore[arg-type]
                                  20, 20, M, 30, output)  # fmt: skip

    decoded = walk(None)
    assert decoded.run is not None and decoded.output == decoded.run.tokens
    batched = greedy_batch(pair.target, [prompt], 30, pair.vocab_size, pair.eos_token_ids)[0]
    taken = walk(batched)
    assert taken.run is None and taken.output == decoded.output
    assert taken.plain.every_budget().rounds == decoded.plain.every_budget().rounds
    wrong = list(batched)
    wrong[3] = (wrong[3] + 1) % pair.vocab_size
    fallen = walk(wrong)
    assert fallen.run is not None and fallen.output == decoded.output
    assert fallen.plain.every_budget().rounds == decoded.plain.every_budget().rounds


def _replayer(pair, memo=None):
    config = DecodeConfig(max_new_tokens=20)
    schedules = [schedule_bits(s, 5) for s in range(32)]
    if memo is None:
        return Replayer(pair, config, schedules, round_table_stride=0)
    return MemoReplayer(pair, config, schedules, memo)


def test_a_warmed_replay_is_the_replay_and_decodes_nothing_more(pair, monkeypatch) -> None:
    batch = prompts(pair.vocab_size, 4, seed=21)
    plain = _replayer(pair)
    want = [plain.replay_prompt(p) for p in batch]
    warmed = _replayer(pair)
    warmed.warm(batch)

    def no_decode(*args, **kwargs):
        raise AssertionError("a warmed prompt's continuation was decoded again")

    monkeypatch.setattr(replay, "generate", no_decode)
    for p, w in zip(batch, want, strict=True):
        got = warmed.replay_prompt(p)
        assert got.rounds == w.rounds and got.n_tokens == w.n_tokens


def test_warming_checks_each_continuation_with_the_forwards_that_give_its_rows(pair) -> None:
    """warm runs two unbatched target forwards per prompt (the prefill and the rest of the text), the
    ones its rows come from; the replay then runs the target no more, and its rows are the unwarmed
    replay's."""
    batch = prompts(pair.vocab_size, 4, seed=24)
    sizes: list[int] = []

    def count(module, args, kwargs, out) -> None:
        sizes.append(kwargs["input_ids"].shape[0])

    hook = pair.target.get_decoder().register_forward_hook(count, with_kwargs=True)  # every target forward
    try:
        warmed = _replayer(pair)
        warmed.warm(batch)
        assert sizes.count(1) == 2 * len(batch) and set(sizes) == {1, len(batch)}
        sizes.clear()
        inputs = [warmed.inputs(p) for p in batch]
        rows = [warmed.ngram_with_rows(p, i.text) for p, i in zip(batch, inputs, strict=True)]
        assert sizes == []
    finally:
        hook.remove()
    fresh = _replayer(pair)
    for p, i, r in zip(batch, inputs, rows, strict=True):
        computed = fresh.ngram_with_rows(p, i.text).cache
        assert r.cache.entries == computed.entries and r.cache.floors == computed.floors


def test_a_continuation_the_check_rejects_is_decoded_alone(pair, monkeypatch, caplog) -> None:
    batch = prompts(pair.vocab_size, 2, seed=22)
    want = [_replayer(pair).continuation(p) for p in batch]

    def off_by_one(model, prompts_, n, vocab):
        rows = greedy_batch(model, prompts_, n, vocab)
        rows[1][4] = (rows[1][4] + 1) % vocab
        return rows

    monkeypatch.setattr(replay, "greedy_batch", off_by_one)
    warmed = _replayer(pair)
    with caplog.at_level("WARNING"):
        warmed.warm(batch)
    assert "token 4 is not the target's greedy one" in caplog.text
    assert tuple(batch[0]) in warmed._warm and tuple(batch[1]) not in warmed._warm
    assert [warmed.continuation(p) for p in batch] == want


def test_a_memo_replayer_warms_only_what_its_memo_lacks(pair, monkeypatch) -> None:
    batch = prompts(pair.vocab_size, 3, seed=23)
    memo = TargetMemo()
    first = _replayer(pair, memo)
    first.warm(batch[:2])
    for p in batch[:2]:
        first.continuation(p)
    asked: list[list[list[int]]] = []

    def spy(model, prompts_, n, vocab):
        asked.append([list(p) for p in prompts_])
        return greedy_batch(model, prompts_, n, vocab)

    monkeypatch.setattr(replay, "greedy_batch", spy)
    _replayer(pair, memo).warm(batch)
    assert asked == [[batch[2]]]
