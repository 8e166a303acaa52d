"""The gauntlet's MobileNetV2 floor for the tensorrt target (symmetric INT8 activations, sequential
AdaRound): see test_gauntlet_mobilenet.py. A module of its own so that pytest-xdist's per-module
distribution runs it beside the onnxruntime one."""

from __future__ import annotations

import pytest
from test_gauntlet_mobilenet import check_defaults_hold_a_floor, make_mobilenet

pytestmark = [pytest.mark.slow, pytest.mark.long]


@pytest.fixture(scope="module")
def mobilenet(tmp_path_factory: pytest.TempPathFactory):
    return make_mobilenet(tmp_path_factory)


def test_trained_mobilenet_v2_int8_tensorrt_defaults_hold_a_floor_and_flag_their_loss(mobilenet, tmp_path):
    check_defaults_hold_a_floor(mobilenet, tmp_path, "tensorrt")
