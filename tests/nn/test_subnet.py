"""Subnets: the slice a sub-model task trains and how its delta lands (nn/subnet.py)."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from nn.params import Params
from nn.spec import ModelSpec
from nn.subnet import Subnet, covered_mean, sub_widths


@st.composite
def subnets(draw: st.DrawFn) -> tuple[Subnet, np.random.Generator]:
    widths = draw(st.lists(st.integers(1, 9), min_size=3, max_size=5))
    spec = ModelSpec(widths=tuple(widths))
    keep = []
    for n in widths[1:-1]:
        k = draw(st.integers(1, n))
        keep.append(np.sort(draw(st.permutations(range(n)))[:k]))
    rescale = draw(st.sampled_from([0.0, 0.5, 1.0]))
    seed = draw(st.integers(0, 2**32 - 1))
    return Subnet(spec, tuple(np.asarray(a) for a in keep), rescale), np.random.default_rng(seed)


def naive_positions(s: Subnet) -> list[tuple[int, str, int, int, int, int]]:
    """(layer, part, sub row, sub col, full row, full col) of every subnet parameter."""
    out = []
    L = s.spec.num_layers
    for li in range(L):
        rows = list(s.keep[li]) if li < L - 1 else list(range(s.spec.widths[li + 1]))
        cols = list(s.keep[li - 1]) if li > 0 else list(range(s.spec.widths[0]))
        for r, fr in enumerate(rows):
            for c, fc in enumerate(cols):
                out.append((li, "W", r, c, fr, fc))
            out.append((li, "b", r, 0, fr, 0))
    return out


def col_scale(s: Subnet, layer: int) -> float:
    if layer == 0:
        return 1.0
    return (s.spec.widths[layer] / s.keep[layer - 1].size) ** s.rescale


@settings(max_examples=60, deadline=None)
@given(subnets())
def test_slice_and_expand_touch_exactly_the_kept_neurons(case: tuple) -> None:
    s, rng = case
    full = Params.from_flat(s.spec, rng.standard_normal(s.spec.num_params).astype(np.float32))
    part = s.slice(full)
    assert part.spec.widths == (s.spec.widths[0], *(a.size for a in s.keep), s.spec.widths[-1])
    upd = Params.from_flat(s.sub, rng.standard_normal(s.sub.num_params).astype(np.float32))
    placed = Params.from_flat(s.spec, s.expand(upd.data))
    for li, part_name, r, c, fr, fc in naive_positions(s):
        scale = col_scale(s, li)
        if part_name == "W":
            assert part.W[li][r, c] == np.float32(full.W[li][fr, fc] * np.float32(scale))
            assert placed.W[li][fr, fc] == upd.W[li][r, c] / np.float32(scale)
        else:
            assert part.b[li][r] == full.b[li][fr]
            assert placed.b[li][fr] == upd.b[li][r]
    # and nothing else: the count of non-zeros is at most the subnet's parameters
    assert np.count_nonzero(placed.data) <= s.sub.num_params
    cover = np.zeros(s.spec.num_params, dtype=np.float32)
    s.cover(cover, 2.0)
    assert set(np.unique(cover)) <= {0.0, 2.0}
    assert int((cover == 2.0).sum()) == s.sub.num_params


@settings(max_examples=40, deadline=None)
@given(subnets())
def test_wire_and_state_round_trip(case: tuple) -> None:
    s, _ = case
    again = Subnet.from_wire(s.spec, s.sub, s.to_wire(), rescale=s.rescale)
    assert all(np.array_equal(a, b) for a, b in zip(again.keep, s.keep, strict=True))
    back = Subnet.from_state(s.spec, s.to_state())
    assert all(np.array_equal(a, b) for a, b in zip(back.keep, s.keep, strict=True))
    assert back.rescale == s.rescale and back.sub == s.sub


def test_rescaling_keeps_the_next_layer_input_scale() -> None:
    """Inverted dropout in the weights: with all neurons equal, the subnet's output
    equals the whole network's (half the neurons, twice the outgoing weights)."""
    spec = ModelSpec(widths=(3, 4, 2))
    p = Params(spec)
    p.W[0][...] = 1.0
    p.W[1][...] = 0.5
    s = Subnet(spec, (np.array([1, 3]),))
    x = np.ones((1, 3), dtype=np.float32)
    part = s.slice(p)
    h = np.maximum(x @ part.W[0].T + part.b[0], 0)
    out = h @ part.W[1].T + part.b[1]
    h_full = np.maximum(x @ p.W[0].T + p.b[0], 0)
    out_full = h_full @ p.W[1].T + p.b[1]
    np.testing.assert_allclose(out, out_full)
    unscaled = Subnet(spec, (np.array([1, 3]),), rescale=0.0).slice(p)
    assert not np.allclose(np.maximum(x @ unscaled.W[0].T, 0) @ unscaled.W[1].T, out_full)


def test_covered_mean_counts_each_coordinate_over_those_holding_it() -> None:
    spec = ModelSpec(widths=(2, 4, 1))
    a = Subnet(spec, (np.array([0, 1]),), rescale=0.0)
    b = Subnet(spec, (np.array([1, 2]),), rescale=0.0)
    ua = a.expand(np.ones(a.sub.num_params, dtype=np.float32))
    ub = b.expand(np.full(b.sub.num_params, 3.0, dtype=np.float32))
    got = Params.from_flat(spec, covered_mean([ua, ub], [1.0, 1.0], [a, b]))
    np.testing.assert_array_equal(got.b[0], [1.0, 2.0, 3.0, 0.0])  # 1 alone, shared, 3 alone, none
    np.testing.assert_array_equal(got.b[1], [2.0])  # the output bias: both
    # weights: a mean by sample weights where both hold it
    got_w = Params.from_flat(spec, covered_mean([ua, ub], [3.0, 1.0], [a, b]))
    assert got_w.b[0][1] == pytest.approx((3 * 1 + 1 * 3) / 4)
    # a whole-model update counts everywhere
    whole = np.full(spec.num_params, 5.0, dtype=np.float32)
    mixed = Params.from_flat(spec, covered_mean([ua, whole], [1.0, 1.0], [a, None]))
    np.testing.assert_array_equal(mixed.b[0], [3.0, 3.0, 5.0, 5.0])


def test_bad_subnets_are_refused() -> None:
    spec = ModelSpec(widths=(2, 4, 3, 1))
    with pytest.raises(ValueError, match="2 hidden layers"):
        Subnet(spec, (np.array([0]),))
    with pytest.raises(ValueError, match="out of range"):
        Subnet(spec, (np.array([4]), np.array([0])))
    with pytest.raises(ValueError, match="sorted and distinct"):
        Subnet(spec, (np.array([1, 1]), np.array([0])))
    with pytest.raises(ValueError, match="keeps no neuron"):
        Subnet(spec, (np.array([], dtype=np.int64), np.array([0])))
    s = Subnet(spec, (np.array([0, 1]), np.array([2])))
    with pytest.raises(ValueError, match="indices for hidden widths"):
        Subnet.from_wire(spec, s.sub, np.array([0, 1], dtype=np.uint32), rescale=1.0)
    with pytest.raises(ValueError, match="another spec"):
        s.slice(Params(ModelSpec(widths=(2, 5, 3, 1))))


def test_sub_widths_keep_at_least_one_neuron() -> None:
    spec = ModelSpec(widths=(64, 128, 3, 10))
    assert sub_widths(spec, 0.25) == (32, 1)
    assert sub_widths(spec, 1.0) == (128, 3)


@settings(max_examples=40, deadline=None)
@given(subnets())
def test_in_place_merge_equals_the_placed_delta(case: tuple) -> None:
    s, rng = case
    base = rng.standard_normal(s.spec.num_params).astype(np.float32)
    upd = rng.standard_normal(s.sub.num_params).astype(np.float32)
    dense = base + np.float32(0.3) * s.expand(upd)
    p = Params.from_flat(s.spec, base)
    s.add_to(p, upd, 0.3)
    np.testing.assert_allclose(p.data, dense, rtol=1e-6, atol=1e-6)


@settings(max_examples=40, deadline=None)
@given(subnets(), st.integers(0, 2**32 - 1))
def test_a_merge_on_some_rows_lands_there_exactly_as_the_whole_merge_does(
    case: tuple, mask_seed: int
) -> None:
    """``add_to(rows=...)`` (a replay onto groups of different versions): rows in
    the mask get the bits the whole merge gives them, the others stay as they were."""
    s, rng = case
    base = rng.standard_normal(s.spec.num_params).astype(np.float32)
    upd = rng.standard_normal(s.sub.num_params).astype(np.float32)
    whole = Params.from_flat(s.spec, base.copy())
    s.add_to(whole, upd, 0.3)
    pick = np.random.default_rng(mask_seed)
    rows = [pick.random(out) < 0.5 for out, _ in s.spec.layer_shapes]
    part = Params.from_flat(s.spec, base.copy())
    s.add_to(part, upd, 0.3, rows=rows)
    orig = Params.from_flat(s.spec, base)
    for li, mask in enumerate(rows):
        np.testing.assert_array_equal(part.W[li][mask], whole.W[li][mask])
        np.testing.assert_array_equal(part.b[li][mask], whole.b[li][mask])
        np.testing.assert_array_equal(part.W[li][~mask], orig.W[li][~mask])
        np.testing.assert_array_equal(part.b[li][~mask], orig.b[li][~mask])
