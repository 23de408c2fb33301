import types

from cudashim.registry import PatchRegistry


class Base:
    def method(self):
        return "base"


class Child(Base):
    pass


def test_revert_restores_the_identical_object_and_removes_inherited_overrides():
    module = types.ModuleType("m")
    module.f = original = lambda: 1
    registry = PatchRegistry()
    assert registry.set_attr(module, "f", lambda: 2) is original
    registry.set_attr(Child, "method", lambda self: "patched")
    assert Child().method() == "patched" and module.f() == 2
    registry.revert_all()
    assert module.f is original
    assert "method" not in vars(Child) and Child().method() == "base"


def test_items_are_restored_or_removed():
    mapping = {"a": 1}
    registry = PatchRegistry()
    registry.set_item(mapping, "a", 2)
    registry.set_item(mapping, "b", 3)
    registry.revert_all()
    assert mapping == {"a": 1}


def test_first_original_wins_and_someone_elses_replacement_is_left_alone():
    module = types.ModuleType("m")
    module.f = original = object()
    registry = PatchRegistry()
    registry.set_attr(module, "f", object())
    registry.set_attr(module, "f", object())
    assert registry.original(module, "f") is original
    theirs = object()
    module.f = theirs
    skipped = registry.revert_all()
    assert module.f is theirs and len(skipped) == 2
