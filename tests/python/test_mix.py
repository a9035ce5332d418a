"""stoker.mix: proportions, determinism, the stopping rules, exact resume (also across a source
running out), batch-structure checks, and two real stoker packs mixed, with to_device on top."""

import json
from collections import Counter

import numpy as np
import pytest
import torch
from conftest import make_image_folder

import stoker
from stoker.load.mix import RESTART_EPOCH_STRIDE, keyed_uniform

pytestmark = pytest.mark.sanitize  # drives the C++ engine: make test-asan-python runs it

RULES = ["first_exhausted", "all_exhausted", "all_exhausted_without_replacement", "never"]


class Counting:
    """A stateful source shaped like a stoker loader: batch k of a pass at epoch e is
    (tag, e, k); len, set_epoch (the same epoch keeps a loaded position), a finished pass
    advances the epoch, state_dict/load_state_dict, close."""

    def __init__(self, tag: str, n: int):
        self.tag, self.n = tag, n
        self.epoch, self._pos, self._start = 0, 0, 0
        self.passes: list[tuple[int, int]] = []  # (epoch, start) of every pass begun
        self.closed = False

    def __len__(self):
        return self.n

    def set_epoch(self, epoch):
        if epoch != self.epoch:
            self.epoch, self._start = epoch, 0

    def __iter__(self):
        start, self._start = self._start, 0
        epoch, self._pos = self.epoch, start
        self.passes.append((epoch, start))
        return self._pass(epoch, start)

    def _pass(self, epoch, start):
        for k in range(start, self.n):
            self._pos = k + 1
            yield (self.tag, epoch, k)
        if self.epoch == epoch:
            self.epoch, self._pos = epoch + 1, 0

    def state_dict(self):
        return {"epoch": self.epoch, "pos": self._pos}

    def load_state_dict(self, state):
        self.epoch, self._start = state["epoch"], state["pos"]

    def close(self):
        self.closed = True


def counting(*sizes):
    return [Counting("abcdefgh"[i], n) for i, n in enumerate(sizes)]


def epochs(m, first, last):
    out = []
    for e in range(first, last):
        m.set_epoch(e)
        out += list(m)
    return out


# --- proportions and determinism -----------------------------------------------------------------


def test_keyed_uniform_is_a_pure_function_in_zero_one():
    values = [keyed_uniform(3, 1, s) for s in range(1000)]
    assert values == [keyed_uniform(3, 1, s) for s in range(1000)]
    assert all(0.0 <= v < 1.0 for v in values)
    assert keyed_uniform(3, 1, 0) != keyed_uniform(3, 2, 0) != keyed_uniform(4, 1, 0)
    assert abs(sum(values) / len(values) - 0.5) < 0.03


def test_proportions_follow_the_weights_and_are_exact_for_a_seed():
    sources = counting(10**6, 10**6, 10**6)
    m = stoker.mix(sources, weights=[5, 3, 2], seed=7, length=20_000)
    counts = Counter(tag for tag, _, _ in m)
    n = sum(counts.values())
    assert n == 20_000 == len(m)
    # Within 4 standard deviations of the normalised weights (sd <= 0.0036 here).
    for tag, p in zip("abc", (0.5, 0.3, 0.2)):
        assert abs(counts[tag] / n - p) < 0.015
    # The draws are a pure function of (seed, epoch, step): these counts are fixed.
    assert [counts[t] for t in "abc"] == [9933, 6078, 3989]
    stats = m.stats()
    assert stats["batches"] == [9933, 6078, 3989]
    assert stats["proportions"] == pytest.approx([c / n for c in stats["batches"]])
    assert stats["weights"] == pytest.approx([0.5, 0.3, 0.2])
    assert stats["epoch"] == 0 and stats["step"] == 20_000  # the pass just finished
    assert m.epoch == 1  # the next


def test_same_seed_and_epoch_give_the_same_sequence_and_others_differ():
    def sequence(seed, epoch):
        m = stoker.mix(counting(500, 500), [0.7, 0.3], seed=seed, length=300)
        m.set_epoch(epoch)
        return [tag for tag, _, _ in m]

    assert sequence(0, 4) == sequence(0, 4)
    assert sequence(0, 4) != sequence(0, 5)
    assert sequence(0, 4) != sequence(1, 4)
    # The sources are told the epoch too.
    sources = counting(3, 3)
    m = stoker.mix(sources, [1, 1])
    m.set_epoch(6)
    assert [s.epoch for s in sources] == [6, 6]
    assert {e for _, e, _ in m} == {6}


def test_a_pass_abandoned_with_break_restarts_its_epoch():
    m = stoker.mix(counting(8, 8), [0.5, 0.5], seed=2)
    full = list(m)
    m.set_epoch(0)
    for k, _ in enumerate(m):
        if k == 3:
            break
    assert list(m) == full
    assert m.epoch == 1


def test_weight_zero_leaves_a_source_out_and_needs_no_len():
    a, b = counting(20, 20)
    m = stoker.mix([a, iter(()), b], [1, 0, 1], length=10)
    batches = list(m)
    assert len(batches) == 10 == len(m)
    assert m.stats()["batches"][1] == 0 and m.stats()["passes"][1] == 0


# --- the stopping rules ---------------------------------------------------------------------


def test_first_exhausted_ends_the_epoch_at_the_first_draw_of_a_spent_source():
    sources = counting(6, 40)
    m = stoker.mix(sources, [0.5, 0.5], seed=1)
    batches = list(m)
    counts = Counter(tag for tag, _, _ in batches)
    assert counts["a"] == 6 and counts["b"] < 40
    assert len(set(batches)) == len(batches)  # nothing repeated
    assert len(batches) == len(stoker.mix(counting(6, 40), [0.5, 0.5], seed=1))


def test_all_exhausted_restarts_spent_sources_until_every_one_ran_out():
    sources = counting(3, 30)
    m = stoker.mix(sources, [0.5, 0.5], seed=4, stop="all_exhausted")
    m.set_epoch(2)
    batches = list(m)
    b = [k for tag, _, k in batches if tag == "b"]
    assert b == list(range(30))  # the epoch ends when the last source runs out
    a = [(e, k) for tag, e, k in batches if tag == "a"]
    assert len(a) > 3  # oversampled
    # Each restart is a new pass at a source epoch of its own.
    passes = sorted({e for e, _ in a})
    assert passes[:3] == [2 + p * RESTART_EPOCH_STRIDE for p in range(3)]
    assert len(passes) == m.stats()["passes"][0] and m.stats()["passes"][1] == 1
    assert all(m.stats()["exhausted"])


def test_without_replacement_gives_every_batch_exactly_once():
    m = stoker.mix(
        counting(5, 17, 9), [0.2, 0.5, 0.3], seed=3, stop="all_exhausted_without_replacement"
    )
    m.set_epoch(1)
    batches = list(m)
    expected = [(t, 1, k) for t, n in zip("abc", (5, 17, 9)) for k in range(n)]
    assert sorted(batches) == sorted(expected)
    assert m.stats()["exhausted"] == [True, True, True]
    assert len(m) == 31


def test_never_cycles_and_length_sets_the_epoch():
    m = stoker.mix(counting(2, 3), [0.5, 0.5], stop="never", length=50)
    assert len(m) == 50
    batches = list(m)
    assert len(batches) == 50
    assert Counter(t for t, _, _ in batches).keys() == {"a", "b"}
    endless = stoker.mix(counting(2, 3), [0.5, 0.5], stop="never")
    with pytest.raises(TypeError, match="never ends"):
        len(endless)
    it = iter(endless)
    assert len([next(it) for _ in range(100)]) == 100


@pytest.mark.parametrize("stop", RULES[:3])
@pytest.mark.parametrize("seed", [0, 1, 2])
def test_len_is_what_an_epoch_yields(stop, seed):
    for length in (None, 7):
        m = stoker.mix(counting(4, 11, 6), [0.3, 0.3, 0.4], seed=seed, stop=stop, length=length)
        for epoch in range(3):
            expected = len(m)
            assert len(list(m)) == expected, (epoch, length)
            if length is not None:
                assert expected <= length


def test_a_source_that_gives_nothing_cannot_be_cycled():
    m = stoker.mix(counting(0, 5), [0.5, 0.5], stop="all_exhausted")
    with pytest.raises(stoker.InvalidArgumentError, match="source 0 gave no batch"):
        list(m)
    with pytest.raises(stoker.InvalidArgumentError, match="source 0 gave no batch"):
        len(m)


# --- resume ---------------------------------------------------------------------------------


def interrupted(make, cut, last_epoch):
    """cut batches of a run, its state (through JSON, as a checkpoint keeps it), then a fresh
    mix over fresh sources that loads it and runs on to the end of last_epoch."""
    out, state = [], None
    m = make()
    for e in range(last_epoch):
        m.set_epoch(e)
        for batch in m:
            out.append(batch)
            if len(out) == cut:
                state = json.loads(json.dumps(m.state_dict()))
                break
        if state is not None:
            break
    resumed = make()
    resumed.load_state_dict(state)
    for e in range(state["epoch"], last_epoch):
        resumed.set_epoch(e)  # the usual loop: the epoch loaded keeps its position
        out += [tuple(b) for b in resumed]
    return [tuple(b) for b in out], resumed


@pytest.mark.parametrize("stop", RULES)
def test_resume_at_every_step_equals_an_uninterrupted_run(stop):
    def make():
        return stoker.mix(
            counting(3, 7, 5),
            [0.5, 0.3, 0.2],
            seed=5,
            stop=stop,
            length=25 if stop == "never" else None,
        )

    reference = [tuple(b) for b in epochs(make(), 0, 2)]
    assert len(reference) > 10
    for cut in range(1, len(reference)):
        out, resumed = interrupted(make, cut, 2)
        assert out == reference, cut
        assert sum(resumed.stats()["total_batches"]) == len(reference)


@pytest.mark.parametrize("stop", RULES[:3])
def test_resume_between_epochs_starts_the_next_one_afresh(stop):
    def make():
        return stoker.mix(counting(3, 7, 5), [0.5, 0.3, 0.2], seed=8, stop=stop)

    reference = epochs(make(), 0, 3)
    m = make()
    out = epochs(m, 0, 1)
    state = json.loads(json.dumps(m.state_dict()))
    assert (state["epoch"], state["step"]) == (1, 0)
    resumed = make()
    resumed.load_state_dict(state)
    out += list(resumed)  # no set_epoch: the state's epoch
    out += epochs(resumed, 2, 3)
    assert out == reference


def test_resume_crosses_a_source_running_out_and_restarting():
    def make():
        return stoker.mix(counting(2, 9), [0.6, 0.4], seed=0, stop="all_exhausted")

    reference = epochs(make(), 0, 1)
    a_positions = [k for k, (tag, _, _) in enumerate(reference) if tag == "a"]
    # Cut right after source a's last batch of a pass and right after its restart.
    for cut in (a_positions[1] + 1, a_positions[2] + 1):
        out, resumed = interrupted(make, cut, 1)
        assert out == reference
        assert resumed.stats()["passes"][0] >= 2


def test_state_is_refused_by_a_different_mix():
    m = stoker.mix(counting(4, 4), [0.5, 0.5], seed=1)
    next(iter(m))
    state = m.state_dict()
    for other in (
        stoker.mix(counting(4, 4), [0.5, 0.5], seed=2),
        stoker.mix(counting(4, 4), [0.4, 0.6], seed=1),
        stoker.mix(counting(4, 4), [0.5, 0.5], seed=1, stop="all_exhausted"),
        stoker.mix(counting(4, 4, 4), [0.5, 0.5, 0], seed=1),
    ):
        with pytest.raises(stoker.InvalidArgumentError, match="cannot resume"):
            other.load_state_dict(state)
    # The same weights written differently are the same mix.
    stoker.mix(counting(4, 4), [1, 1], seed=1).load_state_dict(state)


def test_a_loaded_state_is_used_once():
    def make():
        return stoker.mix(
            counting(5, 5), [0.5, 0.5], seed=3, stop="all_exhausted_without_replacement"
        )

    m = make()
    it = iter(m)
    next(it), next(it)
    state = m.state_dict()
    resumed = make()
    resumed.load_state_dict(state)
    assert len(list(resumed)) == 8
    assert len(list(resumed)) == 10  # the next epoch is whole (no stale resume)
    resumed.load_state_dict(state)
    resumed.set_epoch(1)  # another epoch than the state's: starts at its beginning
    assert len(list(resumed)) == 10


def test_sources_without_state_dict_say_so():
    loader = torch.utils.data.DataLoader(torch.arange(12), batch_size=4)
    m = stoker.mix([loader, counting(3)[0]], [0.5, 0.5], check_structure=False)
    assert not hasattr(m, "state_dict")  # so stoker.to_device sees a mix without state
    with pytest.raises(AttributeError, match=r"source 0 \(DataLoader\) has no state_dict"):
        m.state_dict()
    assert len(list(m)) >= 3


# --- arguments and structure -----------------------------------------------------------------


@pytest.mark.parametrize(
    "loaders, weights, kwargs, message",
    [
        ([], [], {}, "at least one"),
        ("ab", [1, 1], {}, "list of loaders"),
        ([[1], 5], [1, 1], {}, r"loaders\[1\] \(int\) is not iterable"),
        ([[1], [2]], [1], {}, "2 loaders but 1 weights"),
        ([[1], [2]], [1, -1], {}, r"weights\[1\] must be >= 0"),
        ([[1], [2]], [1, float("nan")], {}, "finite number"),
        ([[1], [2]], [True, 1], {}, "finite number"),
        ([[1], [2]], [0, 0.0], {}, "sum to 0"),
        ([[1], [2]], 0.5, {}, "list of numbers"),
        ([[1], [2]], [1, 1], {"stop": "longest"}, "CYCLE_FOREVER"),
        ([[1], [2]], [1, 1], {"length": 0}, "length must be a positive int"),
        ([[1], [2]], [1, 1], {"seed": -1}, "seed must be"),
    ],
)
def test_bad_arguments(loaders, weights, kwargs, message):
    with pytest.raises(stoker.InvalidArgumentError, match=message):
        stoker.mix(loaders, weights, **kwargs)


def test_the_same_loader_twice_is_refused_and_set_epoch_checks():
    source = counting(3)[0]
    with pytest.raises(stoker.InvalidArgumentError, match=r"loaders\[1\] is loaders\[0\]"):
        stoker.mix([source, source], [1, 1])
    with pytest.raises(stoker.InvalidArgumentError, match="epoch must be"):
        stoker.mix([source], [1]).set_epoch(-1)


def test_batches_that_cannot_be_mixed_are_named():
    images = torch.zeros(4, 3, 8, 8, dtype=torch.uint8)
    labels = torch.zeros(4, dtype=torch.int64)
    as_tuples = [(images, labels)] * 20
    as_dicts = [{"image": images, "label": labels}] * 20
    as_float = [(images.float(), labels)] * 20
    smaller = [(torch.zeros(2, 3, 4, 4, dtype=torch.uint8), labels[:2])] * 20
    as_lists = [[images, labels]] * 20
    with pytest.raises(stoker.InvalidArgumentError, match=r"source \d \(list\).*a tuple of 2"):
        list(stoker.mix([as_tuples, as_dicts], [0.5, 0.5]))
    with pytest.raises(stoker.InvalidArgumentError, match=r"batch\[0\] is a torch.uint8 Tensor"):
        list(stoker.mix([as_tuples, as_float], [0.5, 0.5]))
    assert len(list(stoker.mix([as_tuples, as_float], [0.5, 0.5], check_structure=False))) > 20
    # Sizes may differ (multi-resolution), and torch's collate makes lists where stoker has tuples.
    assert len(list(stoker.mix([as_tuples, smaller, as_lists], [1, 1, 1]))) >= 20


def test_close_closes_the_sources():
    sources = counting(3, 3)
    with stoker.mix(sources, [1, 1]) as m:
        next(iter(m))
    assert all(s.closed for s in sources)
    with pytest.raises(stoker.InvalidArgumentError, match="closed"):
        iter(m)


# --- two real stoker packs --------------------------------------------------------------------


@pytest.fixture(scope="module")
def two_packs(tmp_path_factory):
    root = tmp_path_factory.mktemp("mix")
    packs = []
    for name, classes, per_class, seed in (("a", ("x", "y"), 4, 1), ("b", ("u", "v", "w"), 6, 2)):
        folder = make_image_folder(
            root / f"{name}-src", classes=classes, per_class=per_class, seed=seed
        )
        out = root / name
        stoker.pack(folder, out, shard_size="64KB", progress=False)
        packs.append(out)
    return packs  # 8 and 18 samples


def make_real(packs, stop="all_exhausted", **kwargs):
    loaders = [
        stoker.ImageLoader(p, batch_size=4, size=24, threads=1, seed=9, return_index=True, **kwargs)
        for p in packs
    ]
    return stoker.mix(loaders, [0.6, 0.4], seed=11, stop=stop)


def flatten(batches):
    return [tuple(t.clone() for t in batch) for batch in batches]


def same(a, b):
    return len(a) == len(b) and all(
        torch.equal(x, y) for pa, pb in zip(a, b, strict=True) for x, y in zip(pa, pb, strict=True)
    )


def test_two_packs_mix_and_resume_exactly_across_a_restart(two_packs):
    m = make_real(two_packs)
    reference, lengths = [], []
    for e in range(2):
        m.set_epoch(e)
        lengths.append(len(m))
        reference += flatten(m)
        assert len(reference) == sum(lengths)  # len() is each epoch's
    stats = m.stats()
    assert stats["passes"][0] >= 2  # pack a (2 batches) was restarted in epoch 1
    sources = [x.shape[0] for _, _, x in reference]
    assert min(sources) >= 2  # batches of 4, the last of pack b's pass 2

    for cut in (1, 3, 7):
        out, state = [], None
        first = make_real(two_packs)
        for e in range(2):
            first.set_epoch(e)
            for batch in first:
                out += flatten([batch])
                if len(out) == cut:
                    state = first.state_dict()
                    break
            if state is not None:
                break
        first.close()
        resumed = make_real(two_packs)
        resumed.load_state_dict(state)
        for e in range(state["epoch"], 2):
            resumed.set_epoch(e)
            out += flatten(resumed)
        resumed.close()
        assert same(out, reference), cut
    m.close()


def test_a_loader_and_an_image_loader_cannot_be_mixed(two_packs):
    a = stoker.ImageLoader(two_packs[0], batch_size=4, size=24, threads=1)
    b = stoker.Loader(
        two_packs[1],
        batch_size=4,
        threads=1,
        fields={"image": stoker.Image(size=24), "label": stoker.Label()},
    )
    with stoker.mix([a, b], [0.5, 0.5], stop="all_exhausted_without_replacement") as m:
        with pytest.raises(
            stoker.InvalidArgumentError,
            match=r"\(ImageLoader\).*\(Loader\)|\(Loader\).*\(ImageLoader\)",
        ):
            list(m)


def test_to_device_on_a_mix_resumes_exactly(two_packs):
    reference = flatten(make_real(two_packs, stop="first_exhausted"))
    feed = stoker.to_device(make_real(two_packs, stop="first_exhausted"), "cpu")
    assert len(feed) == len(reference)
    out = []
    for batch in feed:
        out += flatten([batch])
        if len(out) == 2:
            state = feed.state_dict()  # as of the last batch handed out, not those in flight
            break
    feed.close()
    resumed = stoker.to_device(make_real(two_packs, stop="first_exhausted"), "cpu")
    resumed.load_state_dict(state)
    out += flatten(resumed)
    assert same(out, reference)


# --- weights on a schedule (issue 26, item 3) ------------------------------------------------


RAMP = [(0, [1.0, 0.0]), (400, [0.0, 1.0])]  # source a to source b, linearly over 400 steps


def test_the_realised_proportions_follow_the_schedule():
    m = stoker.mix(counting(10_000, 10_000), RAMP, seed=3, stop="never", length=600)
    batches = list(m)
    from_b = np.array([b[0] == "b" for b in batches], dtype=float)
    for start in range(0, 600, 100):  # windows of 100 steps: the mean weight of b there
        expected = np.mean([min(s / 400, 1.0) for s in range(start, start + 100)])
        got = from_b[start : start + 100].mean()
        assert abs(got - expected) < 0.12, (start, got, expected)
    assert from_b[:5].sum() == 0 and from_b[-100:].sum() == 100  # the ends held
    assert m.weights == (0.0, 1.0)


def test_the_schedule_s_step_runs_on_across_epochs_and_resumes_exactly():
    """The schedule's step counts the mix's batches over all its epochs; a resume at any step
    continues with exactly the batches of an uninterrupted run, across the weight changes."""

    def make():
        def weights(step):
            return [1, step % 7 + 1, 100 if step > 50 else 0]

        return stoker.mix(counting(40, 40, 40), weights, seed=9, stop="all_exhausted")

    reference = [tuple(b) for b in epochs(make(), 0, 3)]
    third = [b for b in reference if b[0] == "c"]
    assert third and reference.index(third[0]) > 50  # c only once the schedule allows it
    for cut in (1, 37, 51, 52, len(reference) // 2, len(reference) - 3):
        out, _ = interrupted(make, cut, 3)
        assert out == reference, cut


def test_len_replays_the_schedule():
    m = stoker.mix(counting(30, 30), RAMP, seed=1, stop="first_exhausted")
    for epoch in range(3):
        m.set_epoch(epoch)
        n = len(m)
        assert n == len(list(m))


def test_a_schedule_is_checked_where_it_is_given_and_where_it_is_drawn():
    with pytest.raises(stoker.InvalidArgumentError, match="steps must increase"):
        stoker.mix(counting(3, 3), [(10, [1, 0]), (5, [0, 1])])
    with pytest.raises(stoker.InvalidArgumentError, match="at step 4"):
        stoker.mix(counting(3, 3), [(0, [1, 0]), (4, [0, 0])])
    m = stoker.mix(counting(9, 9), lambda step: [1, -1 if step == 2 else 1], seed=0)
    with pytest.raises(stoker.InvalidArgumentError, match=r"weights\[1\] at step 2 must be >= 0"):
        list(m)
