"""Name resolution as a pure function over plain lists of names: no model, no hooks."""

from __future__ import annotations

import re

import pytest

from hookgraph.core.resolve import compile_pattern, match_names, resolve_names

# A resnet-like slice of named_modules(), root first, as PyTorch lists it.
NAMES = [
    "",
    "conv",
    "conv1",
    "bn1",
    "layer1",
    "layer1.0",
    "layer1.0.conv1",
    "layer1.0.conv2",
    "layer1.0.downsample",
    "layer1.0.downsample.0",
    "layer2",
    "layer2.0",
    "layer2.0.conv1",
    "features",
    "features.0",
    "features.1",
    "features.10",
    "fc",
    "fc1",
    "fc2",
    "fcb",
]


def matches(pattern: str, names=NAMES) -> list[str]:
    return match_names([pattern], names)


def resolve(targets, names=NAMES, **kw):
    return resolve_names(key="hooks.s", targets=list(targets), names=names, **kw)


# -- globs ---------------------------------------------------------------------


def test_star_stays_inside_one_segment():
    assert matches("*") == [n for n in NAMES if n and "." not in n]
    assert matches("layer1.*") == ["layer1.0"]
    assert matches("layer1.*.conv*") == ["layer1.0.conv1", "layer1.0.conv2"]


def test_star_does_not_cross_a_dot():
    assert matches("layer*conv1") == []
    assert matches("conv*") == ["conv", "conv1"]


def test_double_star_crosses_segments_and_matches_zero_segments():
    assert matches("**.conv*") == ["conv", "conv1", "layer1.0.conv1", "layer1.0.conv2", "layer2.0.conv1"]


def test_double_star_in_the_middle_and_at_the_end():
    assert matches("layer1.**.conv1") == ["layer1.0.conv1"]
    assert matches("layer1.**") == [
        "layer1",
        "layer1.0",
        "layer1.0.conv1",
        "layer1.0.conv2",
        "layer1.0.downsample",
        "layer1.0.downsample.0",
    ]


def test_double_star_alone_matches_every_name_but_the_root():
    assert matches("**") == NAMES[1:]


def test_question_mark_is_one_character_of_one_segment():
    assert matches("fc?") == ["fc1", "fc2", "fcb"]
    assert matches("layer?") == ["layer1", "layer2"]
    assert match_names(["a?b"], ["a.b", "axb", "ab"]) == ["axb"]


def test_character_class():
    assert matches("fc[12]") == ["fc1", "fc2"]
    assert matches("fc[ab]") == ["fcb"]
    assert matches("layer[1-2].0") == ["layer1.0", "layer2.0"]


def test_negated_character_class():
    assert matches("fc[!1]") == ["fc2", "fcb"]


def test_negated_character_class_stays_inside_one_segment():
    assert match_names(["a[!x]b"], ["a.b", "acb", "axb"]) == ["acb"]


def test_dotted_literal_name_matches_only_itself():
    assert matches("features.0") == ["features.0"]
    assert matches("features.1") == ["features.1"]  # not features.10


def test_regex_metacharacters_in_a_glob_are_literal():
    assert match_names(["fc+"], ["fc+", "fcc", "fc"]) == ["fc+"]
    assert match_names(["a(b)"], ["a(b)", "ab"]) == ["a(b)"]


def test_several_patterns_keep_names_order_without_duplicates():
    assert match_names(["fc1", "conv", "**.conv1", "conv"], NAMES) == [
        "conv",
        "conv1",
        "layer1.0.conv1",
        "layer2.0.conv1",
        "fc1",
    ]


# -- regular expressions -------------------------------------------------------


def test_regex_is_a_full_match():
    assert matches(r"re:layer\d") == ["layer1", "layer2"]
    assert matches(r"re:layer\d\.0\.conv\d") == ["layer1.0.conv1", "layer1.0.conv2", "layer2.0.conv1"]
    assert matches("re:conv") == ["conv"]  # not conv1, not layer1.0.conv1


def test_regex_can_cross_segments():
    assert matches(r"re:.*downsample.*") == ["layer1.0.downsample", "layer1.0.downsample.0"]


def test_invalid_regex_raises_re_error_from_compile_pattern():
    # compile_pattern's docstring says ValueError, but re.error is not a ValueError
    # (Python 3.11); resolve_names catches re.error, which is what it raises.
    with pytest.raises(re.error):
        compile_pattern("re:(")


def test_invalid_regex_is_a_problem_under_the_field_key():
    matched, problems = resolve(["re:(unclosed"])
    assert matched == []
    assert len(problems) == 1
    assert problems[0].key == "hooks.s.target"
    assert "invalid regular expression 're:(unclosed'" in problems[0].message


def test_invalid_regex_in_exclude_names_the_exclude_key():
    _, problems = resolve(["**"], excludes=["re:[z"])
    assert [p.key for p in problems] == ["hooks.s.exclude"]
    assert "invalid regular expression" in problems[0].message


# -- the root module -------------------------------------------------------------


def test_root_is_matched_only_by_the_empty_pattern():
    assert matches("") == [""]
    for pattern in ("*", "**", "?*", "re:.*", "re:"):
        assert "" not in matches(pattern), pattern


# -- exclude -------------------------------------------------------------------------


def test_exclude_drops_matches():
    matched, problems = resolve(["**.conv*"], excludes=["layer2.**"])
    assert problems == []
    assert matched == ["conv", "conv1", "layer1.0.conv1", "layer1.0.conv2"]


def test_exclude_everything_is_a_problem_of_the_exclude():
    # Not "'fc*' matched nothing; nearest names: fc1" (issue 37): the target matched, the exclude dropped it all.
    matched, problems = resolve(["fc*"], excludes=["fc*"])
    assert matched == []
    assert [p.key for p in problems] == ["hooks.s.exclude"]
    assert "all dropped by exclude 'fc*'" in problems[0].message and "matched nothing" not in problems[0].message


# -- types ---------------------------------------------------------------------------

KINDS = {
    "": ("Net", "pkg.Net"),
    "conv": ("Conv2d", "torch.nn.modules.conv.Conv2d", "_ConvNd", "torch.nn.modules.conv._ConvNd"),
    "conv1": (
        "MyConv",
        "pkg.MyConv",
        "Conv2d",
        "torch.nn.modules.conv.Conv2d",
        "_ConvNd",
        "torch.nn.modules.conv._ConvNd",
    ),
    "bn1": ("BatchNorm2d", "torch.nn.modules.batchnorm.BatchNorm2d"),
    "fc": ("Linear", "torch.nn.modules.linear.Linear"),
}
KIND_NAMES = list(KINDS)


def test_types_keep_names_whose_class_or_base_matches():
    matched, problems = resolve(["**"], names=KIND_NAMES, types=["Conv2d"], kinds=KINDS)
    assert problems == []
    assert matched == ["conv", "conv1"]  # the MyConv subclass matches through its MRO


def test_types_match_the_subclass_name_only_on_the_subclass():
    matched, _ = resolve(["**"], names=KIND_NAMES, types=["MyConv"], kinds=KINDS)
    assert matched == ["conv1"]


def test_types_accept_dotted_names_and_several_types():
    matched, problems = resolve(
        ["**"], names=KIND_NAMES, types=["torch.nn.modules.linear.Linear", "BatchNorm2d"], kinds=KINDS
    )
    assert problems == []
    assert matched == ["bn1", "fc"]


def test_unknown_type_suggests_a_near_class_name():
    matched, problems = resolve(["**"], names=KIND_NAMES, types=["Conv2"], kinds=KINDS)
    assert matched == []
    type_problems = [p for p in problems if p.key == "hooks.s.types"]
    assert len(type_problems) == 1
    assert "no module of type 'Conv2'" in type_problems[0].message
    assert "did you mean 'Conv2d'" in type_problems[0].message


def test_an_unknown_type_is_the_one_problem_when_the_target_did_match():
    # Before, a second problem said "'**' matched nothing; nearest names: ..." of a target
    # that matched: the unknown type had dropped every name. A misspelled target is still named.
    _, problems = resolve(["conv1"], names=KIND_NAMES, types=["Conv2"], kinds=KINDS)
    assert [p.key for p in problems] == ["hooks.s.types"]
    _, problems = resolve(["cnv1"], names=KIND_NAMES, types=["Conv2"], kinds=KINDS)
    assert [p.key for p in problems] == ["hooks.s.types", "hooks.s.target"]


def test_far_unknown_type_lists_the_types_in_the_model():
    _, problems = resolve(["**"], names=KIND_NAMES, types=["Zzzzzzzz"], kinds=KINDS)
    msg = next(p.message for p in problems if p.key == "hooks.s.types")
    assert "types in this model:" in msg
    assert "BatchNorm2d" in msg and "Linear" in msg


# -- expect --------------------------------------------------------------------------


def test_no_match_is_an_error_by_default():
    matched, problems = resolve(["nothing_like_this"])
    assert matched == []
    assert len(problems) == 1
    assert problems[0].key == "hooks.s.target"
    assert "'nothing_like_this' matched nothing" in problems[0].message
    assert "set expect.min=0" in problems[0].message
    assert "hookgraph.list_targets(model)" in problems[0].message


def test_expect_min_zero_allows_no_match():
    matched, problems = resolve(["nothing_like_this"], expect_min=0)
    assert (matched, problems) == ([], [])


def test_expect_min_above_count():
    matched, problems = resolve(["fc?"], expect_min=4)
    assert matched == ["fc1", "fc2", "fcb"]
    assert len(problems) == 1
    assert problems[0].key == "hooks.s.expect"
    assert problems[0].message == "'fc?' matched 3 names, expected at least 4: fc1, fc2, fcb"


def test_expect_max_below_count():
    _, problems = resolve(["fc?", "conv"], expect_max=2)
    assert [p.key for p in problems] == ["hooks.s.expect"]
    assert (
        problems[0].message == "'fc?', 'conv' matched 4 names, expected at least 1 and at most 2: conv, fc1, fc2, fcb"
    )


def test_expect_bounds_inclusive():
    for lo, hi in ((3, 3), (1, 3), (3, None), (0, 3)):
        matched, problems = resolve(["fc?"], expect_min=lo, expect_max=hi)
        assert len(matched) == 3 and problems == [], (lo, hi)


def test_expect_message_shortens_long_match_lists():
    names = [f"m{i}" for i in range(20)]
    _, problems = resolve(["m*"], names=names, expect_max=5)
    assert problems[0].message.endswith("m0, m1, m2, m3, m4, m5, m6, m7, ...")


# -- suggestions ----------------------------------------------------------------------


def test_near_miss_suggests_the_nearest_names():
    _, problems = resolve(["cnv"])
    msg = problems[0].message
    assert "nearest names: conv" in msg


def test_glob_near_miss_suggests_from_its_literal_part():
    _, problems = resolve(["**.batchnorm*"], names=["", "bn1", "layer.batchnrm"])
    assert "nearest names:" in problems[0].message
    assert "layer.batchnrm" in problems[0].message


def test_far_miss_lists_real_names_without_the_root():
    names = ["", "encoder", "decoder", "head"]
    _, problems = resolve(["zzzzzzzzzz"], names=names)
    msg = problems[0].message
    assert "names here: encoder, decoder, head" in msg
    assert "(root)" not in msg and ", ," not in msg


def test_far_miss_list_is_cut_at_ten_names():
    names = [""] + [f"block{i:02d}" for i in range(30)]
    _, problems = resolve(["qqqqqqqqqqqqqqqqqqqq"], names=names)
    assert "block09, ..." in problems[0].message
    assert "block10" not in problems[0].message


def test_custom_list_hint_appears_in_the_message():
    _, problems = resolve(["nope"], names=["", "a"], list_hint="parameters: hookgraph.list_targets(model, params=True)")
    assert "list_targets(model, params=True)" in problems[0].message


def test_resolution_is_pure_and_repeatable():
    names = list(NAMES)
    first = resolve(["**.conv*"], names=names, excludes=["conv"])
    second = resolve(["**.conv*"], names=names, excludes=["conv"])
    assert first == second
    assert names == NAMES  # the input list is not modified


def test_types_filter_that_removes_every_match_says_so():
    names = ["", "fc1", "act1", "head"]
    kinds = {"": ("MLP",), "fc1": ("Linear",), "act1": ("ReLU",), "head": ("Linear",)}
    matched, problems = resolve_names(
        key="hooks.r", targets=["**"], names=names, types=["Conv2d"], kinds=kinds, known_types={"Conv2d"}
    )
    assert matched == []
    assert [p.key for p in problems] == ["hooks.r.types"]
    assert "'**' matched 3 names, none of type 'Conv2d'; types among them: Linear, ReLU" in problems[0].message
