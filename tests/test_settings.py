import pytest

from cudashim import _settings
from cudashim.backends import check_name
from cudashim.errors import UnknownBackendError


def test_keywords_beat_environment_which_beats_defaults():
    env = {"CUDASHIM_BACKEND": "cpu", "CUDASHIM_DEVICE_COUNT": "3"}
    assert _settings.load(env).backend == "cpu"
    assert _settings.load(env).device_count == 3
    assert _settings.load(env, device_count=2).device_count == 2
    assert _settings.load({}).backend == "auto"
    assert _settings.load({}).device_count is None


@pytest.mark.parametrize("env, message", [
    ({"CUDASHIM_DEVICE_COUNT": "two"}, "whole number"),
    ({"CUDASHIM_DEVICE_COUNT": "-1"}, "negative"),
    ({"CUDASHIM_REPORT": "maybe"}, "expected one of"),
    ({"CUDASHIM_HONEST": "is_available,teapot"}, "teapot"),
    ({"CUDASHIM_UNSUPPORTED": "ignore"}, "raise, warn"),
])
def test_bad_environment_values_fail_with_one_clear_line(env, message):
    with pytest.raises(ValueError, match=message) as info:
        _settings.load(env)
    assert "\n" not in str(info.value)


def test_unknown_setting_keyword_is_a_type_error():
    with pytest.raises(TypeError, match="unknown cudashim setting"):
        _settings.load({}, colour="blue")


def test_unknown_backend_lists_the_valid_ones():
    with pytest.raises(UnknownBackendError, match="valid: auto, accelerator, cpu, cuda, hpu, mps, npu, xpu"):
        check_name("tpu")


def test_settings_round_trip_through_the_environment():
    s = _settings.load({}, backend="cpu", device_count=2, report=True, honest="is_cuda",
                       unsupported="raise")
    assert _settings.load(s.to_environ()) == s


def test_the_collective_setting_is_read_carried_to_children_and_checked():
    load = _settings.load
    settings = load({"CUDASHIM_COLLECTIVE": " HCCL "})
    assert settings.collective == "hccl"
    assert load(settings.to_environ()).collective == "hccl"
    assert load({}).collective is None
    with pytest.raises(ValueError, match="CUDASHIM_COLLECTIVE='nccl': name the library NCCL becomes"):
        load({"CUDASHIM_COLLECTIVE": "nccl"})
