"""The demo's registry (starter/scenes/): one module per scene, selected by `--only` in order."""

from __future__ import annotations

import pytest

from procbus.errors import InvalidRequest
from procbus.starter.scenes import DEMO_STEPS, SCENES, STACK_CHECK, load_scene, selected_scenes


def test_every_scene_is_the_module_of_its_name_and_needs_only_scenes_before_it() -> None:
    for position, name in enumerate(SCENES):
        scene = load_scene(name)
        assert scene.name == name and scene.title
        assert all(SCENES.index(need) < position for need in scene.needs), name


def test_the_stack_check_runs_first_then_the_scenes_named_with_what_they_need() -> None:
    assert [scene.name for scene in selected_scenes(None)] == list(SCENES)
    assert [scene.name for scene in selected_scenes(["bus", "topics,,"])] == [
        STACK_CHECK,
        "create-table",
        "topics",
        "bus",
    ]
    assert [scene.name for scene in selected_scenes(["own-procedure"])] == [
        STACK_CHECK,
        "own-procedure",
    ]


def test_an_unknown_scene_is_refused_naming_the_known_ones() -> None:
    with pytest.raises(InvalidRequest) as refused:
        selected_scenes(["topics,nonsense", "stack-check"])
    assert str(refused.value) == (
        f"no demo step 'nonsense', 'stack-check': choose from {', '.join(DEMO_STEPS)}"
    )
