"""The one plan format (``ConversionPlan.merge``) and the operator-kind registry (issue 23)."""

import copy

import pytest
import torch
from test_convert import _assert_unchanged, _snapshot
from torch import nn

import subnetact
from subnetact.errors import ConfigError, UnsupportedModelError
from subnetact.extend import (
    ChannelGroup,
    ConversionPlan,
    Entry,
    OperatorEntry,
    StagePlan,
    WeightSliceLinear,
    active_size,
    register_model_adapter,
    register_operator_kind,
    registered_kinds,
    width_sizes,
)


def test_active_size_is_the_one_width_rounding():
    # ceil(w * units) whole units, at least one; 0.3 * 10 == 3.0000000000000004 must stay 3
    assert [active_size(w, 10) for w in (0.01, 0.3, 0.5, 1.0)] == [1, 3, 5, 10]
    assert [active_size(w, 96, 32) for w in (0.25, 0.5, 0.75, 1.0)] == [32, 64, 96, 96]
    assert width_sizes(12, (0.25, 1.0), 4) == ((0.25, 4), (1.0, 12))
    assert subnetact.hf.active_heads(0.3, 10) == active_size(0.3, 10)


def test_merge_renumbers_the_second_plans_groups_and_entries():
    w = (0.5, 1.0)
    rules = ConversionPlan(
        [StagePlan("a")],
        {"depth": [Entry("a", (1, 2))], "width": [Entry("a.0", w)]},
        [ChannelGroup("width", 0, 8, width_sizes(8, w))],
        slices={"a.0.fc1": (0, None)},
        norms={"a.0.bn": 0},
    )
    traced = ConversionPlan(
        [StagePlan("b", start=1, end=3)],
        {"depth": [Entry("b[1:3]", (1, 2))], "width": [Entry("c", w), Entry("d", w)]},
        [ChannelGroup("width", 0, 6, width_sizes(6, w)), ChannelGroup("width", 1, 4, width_sizes(4, w))],
        slices={"c.fc": (0, None), "d.fc": (None, 1)},
        norms={"a.0.bn": None, "c.bn": 0},
        operators={"d.attn": OperatorEntry("attention", (1,))},
        blocked=["why not"],
    )
    merged = rules.merge(traced)
    assert [s.path for s in merged.stages] == ["a", "b"]
    assert [e.name for e in merged.dims["depth"]] == ["a", "b[1:3]"]
    assert [e.name for e in merged.dims["width"]] == ["a.0", "c", "d"]
    # group i of the traced plan is group i + 1; its width entries follow the rules' one
    assert [(g.index, g.full) for g in merged.groups] == [(0, 8), (1, 6), (2, 4)]
    assert merged.slices == {"a.0.fc1": (0, None), "c.fc": (1, None), "d.fc": (None, 2)}
    assert merged.norms == {"a.0.bn": 0, "c.bn": 1}  # the rule's entry wins over the trace's unsliced one
    assert merged.operators == {"d.attn": OperatorEntry("attention", (2,))}
    assert merged.blocked == ["why not"]
    # the operands are not changed
    assert traced.slices == {"c.fc": (0, None), "d.fc": (None, 1)} and len(rules.groups) == 1


def test_merge_refuses_what_it_cannot_renumber():
    plan = ConversionPlan([], {"width": [Entry("x", (1.0,))]}, [ChannelGroup("width", 0, 4, ((1.0, 4),))])
    other = ConversionPlan([], {}, [], custom={"y": lambda m: m})
    with pytest.raises(ConfigError, match=r"custom factories \(\['y'\]\) cannot be renumbered"):
        plan.merge(other)
    with pytest.raises(ConfigError, match="second plan has a prepare step"):
        plan.merge(ConversionPlan([], {}, [], prepare=lambda m: None))


class _Halves(nn.Module):
    """Two Linear layers whose hidden width an adapter below makes elastic through a user operator kind."""

    def __init__(self) -> None:
        super().__init__()
        self.fc1, self.fc2 = nn.Linear(6, 8), nn.Linear(8, 3)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.fc2(torch.relu(self.fc1(x)))


class _CountedSlice(WeightSliceLinear):
    """A user operator kind: a WeightSliceLinear (counts how often its handler ran)."""

    built = 0


@register_operator_kind("test_counted_slice")
def _counted_slice(layer: nn.Module, entry: OperatorEntry) -> nn.Module:
    _CountedSlice.built += 1
    return _CountedSlice.from_module(layer, *entry.groups)


def _halves_plan(kind: str, *, offset: float = 0.0) -> ConversionPlan:
    w = (0.5, 1.0)
    plan = ConversionPlan(
        [], {"width": [Entry("fc1", w)]}, [ChannelGroup("width", 0, 8, width_sizes(8, w))], slices={"fc2": (None, 0)}
    )
    plan.operators["fc1"] = OperatorEntry(kind, (0, None))
    if offset:  # a wrong operator: the largest subnet no longer equals the original
        plan.custom["fc2"] = lambda m: _Shifted(m, offset)
        del plan.slices["fc2"]
    return plan


class _Shifted(subnetact.extend.Operator, nn.Module):
    def __init__(self, inner: nn.Module, offset: float) -> None:
        nn.Module.__init__(self)
        self.inner, self.offset = inner, offset

    def plan_entry(self, cfg, sizes, stats):
        return None

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.inner(x) + self.offset


class _UserKindNet(_Halves):
    pass


class _WrongNet(_Halves):
    pass


class _UnknownKindNet(_Halves):
    pass


register_model_adapter(_UserKindNet)(lambda model, config, filter_fn: _halves_plan("test_counted_slice"))
register_model_adapter(_WrongNet)(lambda model, config, filter_fn: _halves_plan("slice", offset=1.0))
register_model_adapter(_UnknownKindNet)(lambda model, config, filter_fn: _halves_plan("no_such_kind"))


def test_a_registered_operator_kind_is_built_by_convert_and_matches_the_export():
    assert "test_counted_slice" in registered_kinds()
    torch.manual_seed(0)
    model = _UserKindNet().eval()
    reference = copy.deepcopy(model)
    before = _CountedSlice.built
    x = torch.randn(4, 6)
    subnetact.convert(model, example_inputs=x)
    assert _CountedSlice.built == before + 1 and type(model.fc1) is _CountedSlice
    with torch.no_grad():
        assert torch.equal(model(x), reference(x))  # largest subnet: the original, bit for bit
        model.actuate(width=0.5)
        # independent reference: the first 4 hidden units by hand
        h = torch.relu(x @ reference.fc1.weight[:4].T + reference.fc1.bias[:4])
        expected = h @ reference.fc2.weight[:, :4].T + reference.fc2.bias
        torch.testing.assert_close(model(x), expected, rtol=1e-6, atol=1e-6)
        torch.testing.assert_close(model.export()(x), expected, rtol=1e-6, atol=1e-6)


def test_an_adapter_plan_is_verified_when_an_example_input_exists():
    model = _WrongNet().eval()
    snap = _snapshot(model)
    with pytest.raises(UnsupportedModelError, match="largest subnet does not reproduce the original"):
        subnetact.convert(model, example_inputs=torch.randn(2, 6))
    _assert_unchanged(model, snap)
    # without an example input the adapter is trusted, as before
    subnetact.convert(_WrongNet().eval())


def test_an_unknown_operator_kind_is_refused_before_the_model_changes():
    model = _UnknownKindNet().eval()
    snap = _snapshot(model)
    with pytest.raises(ConfigError, match=r"entry 'fc1' names operator kind 'no_such_kind'; registered kinds: \["):
        subnetact.convert(model)
    _assert_unchanged(model, snap)


def test_register_operator_kind_refuses_a_bad_name_or_handler():
    with pytest.raises(ConfigError, match=r"kind='' must be a non-empty string"):
        register_operator_kind("")
    with pytest.raises(ConfigError, match=r"handler of kind 'x' must be callable, got 3"):
        register_operator_kind("x")(3)
    assert "x" not in registered_kinds()
