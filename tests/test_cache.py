"""TensorRT calibration cache codec, dynamic-range text and JSON ranges files."""

from __future__ import annotations

import json
import struct
from pathlib import Path

import numpy as np
import pytest

from trtrepo import cache as C
from trtrepo.calibrate import Ranges
from trtrepo.errors import OptionError, UsageError


def test_hex_encoding_matches_hand_computed_values() -> None:
    # 1/127 as float32 = 0x3C010204 (sign 0, exponent 120, mantissa 0x010204): amax 1.0.
    assert C.encode_scale(1 / 127) == "3c010204"
    assert C.encode_scale(1.0) == "3f800000"  # amax 127
    assert C.encode_scale(0.5) == "3f000000"  # amax 63.5
    assert C.encode_scale(2.0) == "40000000"  # amax 254
    assert C.decode_scale("3c010204") == pytest.approx(1 / 127, rel=1e-7)
    assert C.decode_scale("3C010204") == C.decode_scale("3c010204")


@pytest.mark.parametrize(("text", "number"), [("10.13.0", 101300), ("10.3.0", 100300), ("8.6.1", 8601),
                                              ("8.5.3", 8503), ("101300", 101300), ("10.0", 100000)])
def test_trt_version_encoding(text: str, number: int) -> None:
    assert C.trt_version_int(text) == number


def test_header_version_string() -> None:
    assert C.CacheHeader(101300, "EntropyCalibration2").version_string == "10.13.0"
    assert C.CacheHeader(8601, "EntropyCalibration2").version_string == "8.6.1"


@pytest.mark.parametrize("bad", ["10", "ten.1.0", "10.100.0", "8.12.0", ""])
def test_trt_version_rejects_garbage(bad: str) -> None:
    with pytest.raises(UsageError, match=f"the TensorRT version '{bad}'"):
        C.trt_version_int(bad)


def test_cache_text_layout(tmp_path: Path) -> None:
    ranges = {"input": 1.0, "/conv/Conv_output_0": 127.0, "logits": 63.5}
    path = C.write_cache(tmp_path / "m.cache", ranges, "10.3.0", "EntropyCalibration2")
    assert path.read_text() == (
        "TRT-100300-EntropyCalibration2\n"
        "input: 3c010204\n"
        "/conv/Conv_output_0: 3f800000\n"
        "logits: 3f000000\n"
    )


def test_cache_round_trip_is_exact(tmp_path: Path) -> None:
    rng = np.random.default_rng(0)
    amax = {f"t{i}": float(v) for i, v in enumerate(rng.lognormal(0, 3, size=50))}
    first = C.write_cache(tmp_path / "a.cache", amax, "8.6.1", "MinMaxCalibration")
    header, scales = C.read_cache(first)
    assert header == C.CacheHeader(8601, "MinMaxCalibration") and header.text == "TRT-8601-MinMaxCalibration"
    assert list(scales) == list(amax)
    for name, a in amax.items():
        # The scale is the float32 nearest to amax / 127, bit for bit.
        assert struct.pack(">f", scales[name]) == struct.pack(">f", a / 127)
    # Reading back and writing again reproduces the file byte for byte.
    ranges = Ranges.from_cache(first)
    second = C.write_cache(tmp_path / "b.cache", ranges, "8.6.1", "MinMaxCalibration")
    assert second.read_bytes() == first.read_bytes()
    assert ranges["t0"] == pytest.approx(amax["t0"], rel=1e-7)


def test_zero_range_gets_a_positive_scale(tmp_path: Path) -> None:
    path = C.write_cache(tmp_path / "z.cache", {"zeros": 0.0})
    _, scales = C.read_cache(path)
    assert 0 < scales["zeros"] < 1e-10


@pytest.mark.parametrize(("text", "match"), [
    ("", "empty"),
    ("input: 3c010204\n", "header"),
    ("TRT-100300-EntropyCalibration2\ninput 3c010204\n", "line 2"),
    ("TRT-100300-EntropyCalibration2\ninput: 3c01020\n", "line 2"),
    ("TRT-100300-EntropyCalibration2\na: 3c010204\na: 3c010204\n", "listed twice"),
])
def test_parse_errors_are_one_line(text: str, match: str) -> None:
    with pytest.raises(UsageError, match=match) as info:
        C.parse_cache(text, "x.cache")
    assert "\n" not in str(info.value)


def test_parse_accepts_crlf_and_names_with_colons_and_spaces() -> None:
    header, scales = C.parse_cache("TRT-8601-EntropyCalibration2\r\n(Unnamed Layer* 4) [Constant]_output: 3c010204\r\na:b: 3f800000\r\n")
    assert header.version == 8601
    assert scales == {"(Unnamed Layer* 4) [Constant]_output": pytest.approx(1 / 127), "a:b": 1.0}


def test_check_names_lists_mismatches() -> None:
    C.check_names(["a", "b", "(Unnamed Layer* 3) [Shuffle]_output"], ["a", "b"], known=["a", "b", "c"])
    with pytest.raises(OptionError) as info:
        C.check_names(["a", "zz"], ["a", "b"], known=["a", "b"], source="m.cache")
    msg = str(info.value)
    assert "m.cache does not match" in msg and "missing from it: b" in msg and "not in the model: zz" in msg
    assert msg.endswith("use recalibrate=True to rebuild it")
    assert info.value.with_flags({"recalibrate": "--recalibrate"}).endswith("use --recalibrate to rebuild it")


def test_dynamic_range_round_trip(tmp_path: Path) -> None:
    ranges = {"input": 1.0, "/a/Relu_output_0": 3.0195883854757994, "x": 1e-30}
    path = C.write_dynamic_range(tmp_path / "r.txt", ranges)
    assert path.read_text().splitlines()[1] == "/a/Relu_output_0:3.0195883854757994"
    assert C.read_dynamic_range(path) == ranges
    with pytest.raises(UsageError, match="':'"):
        C.format_dynamic_range({"a:b": 1.0})


def test_json_ranges_round_trip(tmp_path: Path) -> None:
    r = Ranges({"a": 1.5, "b": 0.0}, method="percentile", options={"percentile": 99.9}, num_samples=10, num_bins=2048)
    path = r.save_json(tmp_path / "r.json")
    back = Ranges.load_json(path)
    assert back["a"] == r["a"] and back.method == "percentile" and back.options == {"percentile": 99.9}
    assert back["b"] == pytest.approx(C.MIN_SCALE * 127)  # a zero range is stored as the smallest one, as in caches
    assert back.scales()["a"] == pytest.approx(1.5 / 127, rel=1e-7)
    (tmp_path / "bad.json").write_text('{"tensors": {"a": {}}}')
    with pytest.raises(UsageError, match="amax"):
        Ranges.load_json(tmp_path / "bad.json")


def test_format_refuses_invalid_algorithm_and_scale() -> None:
    with pytest.raises(UsageError, match="algorithm"):
        C.format_cache({"a": 1.0}, "10.0.0", "Entropy3")
    with pytest.raises(UsageError, match="tensor 'a'"):
        C.format_cache({"a": float("nan")})


def test_header_of_bytes_and_with_header() -> None:
    """The one cache codec also serves the TensorRT adapter, which handles caches as bytes."""
    from trtrepo.cache import CacheHeader, header_of, with_header

    data = C.format_cache({"x": 0.5}, "10.13.0").encode()
    header = header_of(data)
    assert header == CacheHeader(101300, "EntropyCalibration2")
    moved = with_header(data, CacheHeader(110400, header.algorithm))
    assert moved.split(b"\n", 1)[1] == data.split(b"\n", 1)[1] and header_of(moved) == CacheHeader(110400, header.algorithm)
    assert header_of(b"not a cache\nx: 3c000000") is None and header_of(b"") is None


@pytest.mark.parametrize("bits, what", [("00000000", "amax 0 is not a range"), ("bf800000", "amax -127 is not a range"),
                                        ("7f000000", "beyond float32's largest value"),
                                        ("7fc00000", "amax nan is not a finite range"),
                                        ("7f800000", "amax inf is not a finite range")])
def test_a_cache_with_an_impossible_scale_is_refused_naming_file_line_and_tensor(tmp_path, demo_onnx, run_cli, bits, what):
    """Issue 16 item 7: a zero scale used to become 1.0 (34 top-1 points lost), Inf/NaN/huge ones
    gave misleading errors or were written on: now every reader refuses them, and nothing is written."""
    good = tmp_path / "good.cache"
    assert run_cli("calibrate", demo_onnx, "--data", "demo:calib", "--limit", "32", "--cache", good,
                   "--no-progress").exit_code == 0
    lines = good.read_text().splitlines()
    name = lines[1].split(":")[0]
    bad = tmp_path / "bad.cache"
    bad.write_text("\n".join([lines[0], f"{name}: {bits}", *lines[2:]]) + "\n")
    before = bad.read_bytes()
    for args in (("deploy", demo_onnx, "--cache", bad, "--backend", "onnxruntime", "--repo", tmp_path / "repo"),
                 ("quantize", demo_onnx, "--cache", bad, "-o", tmp_path / "q.onnx"),
                 ("calibrate", demo_onnx, "--cache", bad, "--ranges", tmp_path / "r.json")):
        res = run_cli(*args)
        assert res.exit_code == 2, res.output
        assert f"{bad}: line 2: tensor '{name}'" in res.stderr and what in res.stderr
        assert len(res.stderr.strip().splitlines()) == 1
    assert not (tmp_path / "repo").exists() and not (tmp_path / "q.onnx").exists() and not (tmp_path / "r.json").exists()
    assert bad.read_bytes() == before


def test_ranges_json_and_dynamic_range_files_with_zero_or_non_finite_amax_are_refused(tmp_path, demo_onnx, run_cli):
    r = tmp_path / "r.json"
    assert run_cli("calibrate", demo_onnx, "--data", "demo:calib", "--limit", "32", "--ranges", r,
                   "--no-progress").exit_code == 0
    data = json.loads(r.read_text())
    name = next(iter(data["tensors"]))
    for value in (0, -2.0, "NaN", 1e39):
        data["tensors"][name]["amax"] = float(value)
        bad = tmp_path / "bad.json"
        bad.write_text(json.dumps(data))
        res = run_cli("quantize", demo_onnx, "--ranges", bad, "-o", tmp_path / "q.onnx")
        assert res.exit_code == 2 and f"{bad}: tensor '{name}': amax" in res.stderr, (value, res.stderr)
    dr = tmp_path / "dr.txt"
    dr.write_text(f"{name}:0\n")
    from trtrepo.cache import read_dynamic_range

    with pytest.raises(UsageError, match=rf"dr.txt: line 1: tensor '{name}': amax 0 is not a range"):
        read_dynamic_range(dr)


def test_a_tensor_that_is_zero_on_every_sample_round_trips_through_the_ranges_file(tmp_path):
    from trtrepo.calibrate import Ranges

    ranges = Ranges({"zeros": 0.0, "x": 2.0}, method="minmax")
    ranges.save_json(tmp_path / "r.json")
    back = Ranges.load_json(tmp_path / "r.json")
    assert back["x"] == 2.0 and 0 < back["zeros"] < 1e-9
