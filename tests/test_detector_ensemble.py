"""Issue 43 item 1: a detector served on encoded images. The letterbox preprocessing
(``Preprocess(letterbox=...)``: geometry, padding, a box's round trip, the refusals), the
detector ensemble's configs, and the real tritonserver serving a YOLOv8-style detector built here
through ``<model>_preprocess`` (letterbox) -> the model -> ``<model>_postprocess`` (decode, NMS,
boxes mapped back): the served boxes, scores and classes of a JPEG equal what
``trtrepo.detect.postprocess`` + ``unletterbox`` give locally on the same preprocessed tensor."""

from __future__ import annotations

import io
from pathlib import Path

import numpy as np
import pytest

from trtrepo.contracts import backends
from trtrepo.detect import YoloLayout, letterbox_params, postprocess, unletterbox
from trtrepo.errors import UsageError
from trtrepo.modelio import ModelIO, TensorSpec
from trtrepo.preprocessing import Preprocess
from trtrepo.repository import add_detector_ensemble, postprocess_package_files, read_config
from trtrepo.server import find_server_binary
from trtrepo.tritonconfig import (
    DETECTIONS,
    ModelOptions,
    NmsSettings,
    config_from_io,
    config_to_dict,
    parse_config_text,
    postprocess_config,
    render_config,
)
from trtrepo.tritonconfig.model import TensorConfig

SIZE = 64  # the detector's input (tests/test_detector_head.py's AnchorFree)
NC = 3
ANCHORS = (SIZE // 8) ** 2 + (SIZE // 16) ** 2 + (SIZE // 32) ** 2  # 84
LAYOUT = YoloLayout("anchor_free", NC)


def _image(h: int, w: int, box: tuple[int, int, int, int] | None = None):
    """An RGB PIL image of ``h x w``: grey 40, with a white ``box`` (x1, y1, x2, y2) when given."""
    from PIL import Image

    arr = np.full((h, w, 3), 40, np.uint8)
    if box is not None:
        x1, y1, x2, y2 = box
        arr[y1:y2, x1:x2] = 255
    return Image.fromarray(arr)


# --------------------------------------------------------------------------------------------
# The letterbox preprocessing


@pytest.mark.parametrize(("h", "w"), [(30, 60), (60, 30), (64, 64), (200, 120), (17, 5)])
def test_letterbox_scales_keeping_aspect_and_pads_with_pad_value(h, w):
    pre = Preprocess(letterbox=(SIZE, SIZE), scale=1.0, pad_value=114)
    out = pre.apply(_image(h, w))
    assert out.shape == (3, SIZE, SIZE) and out.dtype == np.float32
    r, pad_x, pad_y = pre.letterbox_geometry((h, w))
    assert (r, pad_x, pad_y) == letterbox_params((h, w), SIZE)
    new_w, new_h = round(w * r), round(h * r)
    assert r == min(SIZE / h, SIZE / w) and (new_w == SIZE or new_h == SIZE)
    x0, y0 = int(pad_x), int(pad_y)
    inside = np.zeros((SIZE, SIZE), bool)
    inside[y0:y0 + new_h, x0:x0 + new_w] = True
    assert np.all(out[:, ~inside] == 114)  # the padding, in raw pixel units before scale
    assert np.allclose(out[:, inside], 40, atol=1)  # the image (grey 40, interpolated)
    # centred: the two sides' padding differ by at most one pixel
    assert abs((SIZE - new_w - x0) - x0) <= 1 and abs((SIZE - new_h - y0) - y0) <= 1


def test_letterbox_pad_value_layout_dtype_and_non_square_target():
    pre = Preprocess(letterbox=(32, 48), pad_value=0, layout="NHWC", dtype="uint8", scale=1.0)
    out = pre.apply(_image(100, 100))  # r = 0.32: 32x32, 8 pixels of padding left and right
    assert out.shape == (32, 48, 3) and out.dtype == np.uint8
    assert pre.letterbox_geometry((100, 100)) == (0.32, 8.0, 0.0)
    assert np.all(out[:, :8] == 0) and np.all(out[:, 40:] == 0) and np.all(out[:, 8:40] == 40)
    gray = Preprocess(letterbox=16, color="gray", scale=1.0).apply(_image(8, 16))
    assert gray.shape == (1, 16, 16) and np.all(gray[:, :4] == 114) and np.all(gray[:, 12:] == 114)


def test_a_box_round_trips_through_letterbox_and_unletterbox():
    """A white rectangle of the original image, found in the letterboxed tensor and mapped back
    with letterbox_params/unletterbox, lands where it was (within a letterboxed pixel)."""
    h, w, box = 300, 500, (120, 60, 320, 200)
    pre = Preprocess(letterbox=(SIZE, SIZE), scale=1.0, interpolation="nearest")
    out = pre.apply(_image(h, w, box))
    ys, xs = np.nonzero(out[0] > 200)
    found = np.array([[xs.min(), ys.min(), xs.max() + 1, ys.max() + 1]], np.float32)
    params = letterbox_params((h, w), SIZE)
    back = unletterbox(found, params, (h, w))[0]
    assert np.all(np.abs(back - np.array(box, np.float32)) <= 1 / params[0] + 1e-3), (back, box)
    # and exactly, for coordinates mapped forward by the same geometry
    r, pad_x, pad_y = params
    forward = np.array([[box[0] * r + pad_x, box[1] * r + pad_y, box[2] * r + pad_x, box[3] * r + pad_y]], np.float32)
    np.testing.assert_allclose(unletterbox(forward, params, (h, w))[0], box, atol=1e-3)


@pytest.mark.parametrize("other", [{"resize": 32}, {"center_crop": 32}, {"resize": (32, 32), "center_crop": 16}])
def test_letterbox_refuses_resize_and_center_crop(other):
    with pytest.raises(UsageError, match="preprocess option 'letterbox': excludes 'resize' and 'center_crop'") as exc:
        Preprocess(letterbox=SIZE, **other)
    assert "\n" not in str(exc.value)


@pytest.mark.parametrize(("kw", "match"), [({"letterbox": (0, 4)}, "'letterbox': expected 1 or 2 positive ints"),
                                           ({"letterbox": (1, 2, 3)}, "'letterbox': expected 1 or 2 positive ints"),
                                           ({"letterbox": 8, "pad_value": 256}, "'pad_value': expected a whole number 0..255"),
                                           ({"letterbox": 8, "pad_value": True}, "'pad_value'"),
                                           ({"letterbox": 8, "pad_value": 1.5}, "'pad_value'")])
def test_letterbox_bad_values(kw, match):
    with pytest.raises(UsageError, match=match):
        Preprocess(**kw)


@pytest.mark.parametrize("suffix", [".json", ".yaml"])
def test_letterbox_is_saved_and_loaded(tmp_path, suffix):
    pre = Preprocess(letterbox=(480, 640), pad_value=0)
    loaded = Preprocess.load(pre.save(tmp_path / f"pre{suffix}"))
    assert loaded == pre and loaded.letterbox == (480, 640) and loaded.pad_value == 0
    assert Preprocess.from_dict({"letterbox": 640}).letterbox == (640, 640)
    assert Preprocess().letterbox is None and Preprocess().pad_value == 114
    with pytest.raises(UsageError, match="not set"):
        Preprocess().letterbox_geometry((10, 10))


def test_cli_preprocess_writes_letterbox(tmp_path, run_cli):
    out = tmp_path / "pre.json"
    result = run_cli("preprocess", "-o", out, "--letterbox", "48x64", "--pad-value", "0")
    assert result.exit_code == 0, result.output
    assert Preprocess.load(out).letterbox == (48, 64) and Preprocess.load(out).pad_value == 0
    bad = run_cli("preprocess", "-o", out, "--letterbox", "64", "--resize", "32")
    assert bad.exit_code == 2 and "excludes 'resize'" in bad.output


# --------------------------------------------------------------------------------------------
# The configs (no server)


def _detector_config(name: str = "det", size: int = SIZE, channels: int = 4 + NC):
    io_ = ModelIO(inputs=(TensorSpec("images", "float32", (-1, 3, size, size)),),
                  outputs=(TensorSpec("output0", "float32", (-1, channels, ANCHORS)),))
    return config_from_io(name, io_, backends.PYTHON, ModelOptions(max_batch_size=8))


def test_postprocess_config_round_trips_and_holds_the_parameters():
    raw = TensorConfig("output0", "TYPE_FP32", (1, 4 + NC, ANCHORS))
    cfg = postprocess_config("det_postprocess", raw, LAYOUT, NmsSettings(conf=0.3, iou=0.5, max_det=7))
    d = config_to_dict(parse_config_text(render_config(cfg), cfg.name))
    assert d["backend"] == "python" and int(d.get("max_batch_size", 0)) == 0
    assert [(t["name"], t["data_type"], [int(x) for x in t["dims"]]) for t in d["input"]] == [
        ("output0", "TYPE_FP32", [1, 7, ANCHORS]), ("LETTERBOX", "TYPE_FP32", [3]), ("IMAGE_HW", "TYPE_INT32", [2])]
    assert [(t["name"], t["data_type"], [int(x) for x in t["dims"]]) for t in d["output"]] == [
        (t.name, t.data_type, list(t.dims)) for t in DETECTIONS]
    params = {k: v["string_value"] for k, v in d["parameters"].items()}
    assert params == {"conf": "0.3", "iou": "0.5", "max_det": "7", "kind": "anchor_free", "num_classes": "3",
                      "num_masks": "0", "channels_last": "false"}
    defaults = postprocess_config("p", raw, LAYOUT)
    assert dict(defaults.parameters)["conf"] == "0.25" and dict(defaults.parameters)["iou"] == "0.7"
    assert dict(defaults.parameters)["max_det"] == "300"


@pytest.mark.parametrize(("kw", "match"), [({"conf": 1.5}, "the confidence threshold 1.5"),
                                           ({"iou": -0.1}, "the NMS IoU threshold -0.1"),
                                           ({"conf": float("nan")}, "the confidence threshold nan"),
                                           ({"max_det": 0}, "the detections per image 0")])
def test_nms_settings_refuse_out_of_range(kw, match):
    with pytest.raises(UsageError, match=match):
        NmsSettings(**kw)


def test_postprocess_package_is_the_detect_package_alone():
    files = postprocess_package_files()
    assert {Path(k).parts[1] for k in files if len(Path(k).parts) > 2} == {"detect"}
    assert "trtrepo_postprocess/detect/nms.py" in files and "trtrepo_postprocess/__init__.py" in files


def test_detector_ensemble_refusals_write_nothing(tmp_path):
    repo = tmp_path / "repo"
    det = _detector_config()
    cases = [
        (Preprocess(resize=(SIZE, SIZE)), LAYOUT, "does not letterbox"),
        (Preprocess(letterbox=32), LAYOUT, r"makes one image \[3, 32, 32\] \(NCHW, letterbox 32x32\) but input 'images' takes \[-1, 3, 64, 64\]"),
        (Preprocess(letterbox=SIZE, layout="NHWC"), LAYOUT, "makes one image"),
        (Preprocess(letterbox=SIZE, dtype="float16"), LAYOUT, "preprocessing produces float16"),
        (Preprocess(letterbox=SIZE), YoloLayout("anchor_free", 80), "no output fits the anchor-free layout with 84 channels"),
    ]
    for pre, layout, match in cases:
        with pytest.raises(UsageError, match=match):
            add_detector_ensemble(repo, det, pre, layout)
    assert not repo.exists()


# --------------------------------------------------------------------------------------------
# The real server

requires_server = pytest.mark.skipif(
    find_server_binary(None) is None,
    reason="tritonserver not installed (run scripts/install_tritonserver.sh or set TRTREPO_TRITONSERVER)")

CONF, IOU, MAX_DET = 0.3, 0.5, 100
def _anchor_free():
    """tests/test_detector_head.py's ``AnchorFree``: YOLOv8's Detect in export mode (DFL with 16
    bins) on a three-level backbone, ``[N, 4 + NC, 84]`` for a 64x64 input (imported here: torch
    loads only when a server test builds it)."""
    import test_detector_head as head

    assert (head.SIZE, head.NC) == (SIZE, NC)
    return head.AnchorFree()


def _detector_onnx(path: Path) -> Path:
    """tests/test_detector_head.py's AnchorFree (YOLOv8's Detect in export mode, 64x64, 3 classes),
    with class biases set per level so that some anchors pass CONF and others do not."""
    import torch

    torch.manual_seed(0)
    module = _anchor_free().eval()
    with torch.no_grad():
        # stride 8: every score far under CONF; stride 16 and 32: class 0 or 1 above it
        for seq, bias in zip(module.cv3, ([-4.0, -4.0, -4.0], [1.0, -1.0, -2.0], [-1.0, 2.0, -2.0]), strict=True):
            seq[-1].weight.mul_(8.0)
            seq[-1].bias.copy_(torch.tensor(bias))
        # the box distributions favour the low bins: wide, overlapping boxes at stride 16 (NMS has
        # work), boxes of some 10 pixels at stride 32 (inside the image, not clipped)
        for seq, slope in zip(module.cv2, (1.0, 0.3, 2.0), strict=True):
            seq[-1].weight.mul_(0.1)
            seq[-1].bias.copy_(-slope * torch.arange(16, dtype=torch.float32).repeat(4))
    torch.onnx.export(module, (torch.zeros(1, 3, SIZE, SIZE),), str(path), input_names=["images"], output_names=["output0"],
                      dynamo=False, opset_version=17, dynamic_axes={"images": {0: "batch"}, "output0": {0: "batch"}})
    return path


def _jpeg(rows: slice = slice(100, 400), cols: slice = slice(None)) -> tuple[bytes, tuple[int, int]]:
    """scikit-image's astronaut, cut (by default to 512x300, non-square: letterbox pads top and
    bottom), as JPEG bytes, and its (height, width)."""
    from PIL import Image
    from skimage import data

    arr = np.ascontiguousarray(data.astronaut()[rows, cols])
    buf = io.BytesIO()
    Image.fromarray(arr).save(buf, format="JPEG", quality=90)
    return buf.getvalue(), arr.shape[:2]


def _local(served, blob: bytes):
    """What trtrepo.detect gives locally on the same bytes: the ensemble's preprocessing, ONNX
    Runtime with the server's session options, postprocess, unletterbox. (detections, boxes in
    the image's pixels, the raw output, (height, width))."""
    from PIL import Image

    from trtrepo.evaluate import make_session

    pre: Preprocess = served["pre"]
    with Image.open(io.BytesIO(blob)) as img:
        hw = (img.size[1], img.size[0])
        x = pre.apply(img)[None]
    raw = make_session(served["onnx"]).run(["output0"], {"images": x})[0]
    (det,) = postprocess(raw, served["layout"], conf=CONF, iou=IOU, max_det=MAX_DET)
    return det, unletterbox(det.boxes, pre.letterbox_geometry(hw), hw), raw, hw


@pytest.fixture(scope="module")
def served(tmp_path_factory, triton_server):
    from trtrepo.evaluate import detection_layout
    from trtrepo.repository import add_onnx_model

    tmp = tmp_path_factory.mktemp("detens")
    onnx_path = _detector_onnx(tmp / "det.onnx")
    repo = tmp / "repo"
    _, cfg = add_onnx_model(repo, "det", onnx_path, backend="python", options=ModelOptions(max_batch_size=4))
    layout = detection_layout([-1, 4 + NC, ANCHORS], NC)
    pre = Preprocess(letterbox=(SIZE, SIZE))
    written = add_detector_ensemble(repo, cfg, pre, layout, NmsSettings(conf=CONF, iou=IOU, max_det=MAX_DET))
    server = triton_server(repo)
    return {"repo": repo, "onnx": onnx_path, "layout": layout, "pre": pre, "written": written, "server": server}


@requires_server
@pytest.mark.triton
def test_detector_ensemble_models_are_ready_with_their_configs(served):
    server, repo = served["server"], served["repo"]
    assert [w.name for w in served["written"]] == ["det_preprocess", "det_postprocess", "det_ensemble"]
    index = {m["name"]: m["state"] for m in server.repository_index()}
    assert index == dict.fromkeys(("det", "det_preprocess", "det_postprocess", "det_ensemble"), "READY")
    steps = server.model_config("det_ensemble")["ensemble_scheduling"]["step"]
    assert [s["model_name"] for s in steps] == ["det_preprocess", "det", "det_postprocess"]
    pre = config_to_dict(read_config(repo / "det_preprocess"))
    assert [t["name"] for t in pre["output"]] == ["images", "LETTERBOX", "IMAGE_HW"]
    assert int(pre.get("max_batch_size", 0)) == 0
    served_ens = server.model_config("det_ensemble")
    assert [t["name"] for t in served_ens["output"]] == ["boxes", "scores", "classes"]
    assert (repo / "det_postprocess" / "1" / "trtrepo_postprocess" / "detect" / "nms.py").is_file()


def _infer(server, blob: bytes) -> dict[str, np.ndarray]:
    import tritonclient.http as httpclient

    client = httpclient.InferenceServerClient(server.http_url)
    try:
        inp = httpclient.InferInput("IMAGE", [1], "BYTES")
        inp.set_data_from_numpy(np.array([blob], dtype=object))
        result = client.infer("det_ensemble", [inp], outputs=[httpclient.InferRequestedOutput(n) for n in
                                                              ("boxes", "scores", "classes")])
        return {n: result.as_numpy(n) for n in ("boxes", "scores", "classes")}
    finally:
        client.close()


@requires_server
@pytest.mark.triton
def test_served_detections_of_a_jpeg_equal_the_local_postprocessing(served):
    blob, hw = _jpeg()
    got = _infer(served["server"], blob)
    det, boxes, raw, local_hw = _local(served, blob)
    assert local_hw == hw == (300, 512)
    candidates = int((raw[0, 4:].max(0) > CONF).sum())
    # what the test wants: anchors under CONF, candidates NMS suppresses, two classes, boxes not clipped
    assert 0 < len(det) < candidates < ANCHORS and set(det.classes.tolist()) == {0, 1}, (len(det), candidates)
    assert ((boxes[:, 0] > 0) & (boxes[:, 2] < hw[1])).any()
    assert got["boxes"].dtype == np.float32 and got["scores"].dtype == np.float32 and got["classes"].dtype == np.int64
    assert got["boxes"].shape == (len(det), 4) and got["scores"].shape == (len(det),)
    np.testing.assert_allclose(got["boxes"], boxes, atol=1e-3, rtol=0)
    np.testing.assert_allclose(got["scores"], det.scores, atol=1e-6, rtol=0)
    np.testing.assert_array_equal(got["classes"], det.classes)
    # in the original image's pixels: inside the 512x300 image, not the 64x64 input
    assert boxes[:, [0, 2]].max() <= hw[1] and boxes[:, [1, 3]].max() <= hw[0] and boxes.max() > SIZE


@requires_server
@pytest.mark.triton
def test_served_preprocessing_gives_the_letterboxed_tensor_and_its_geometry(served):
    import tritonclient.http as httpclient
    from PIL import Image

    blob, hw = _jpeg()
    client = httpclient.InferenceServerClient(served["server"].http_url)
    try:
        inp = httpclient.InferInput("IMAGE", [1], "BYTES")
        inp.set_data_from_numpy(np.array([blob], dtype=object))
        result = client.infer("det_preprocess", [inp])
    finally:
        client.close()
    pre: Preprocess = served["pre"]
    with Image.open(io.BytesIO(blob)) as img:
        want = pre.apply(img)[None]
    np.testing.assert_array_equal(result.as_numpy("images"), want)
    assert result.as_numpy("LETTERBOX").dtype == np.float32 and result.as_numpy("IMAGE_HW").dtype == np.int32
    np.testing.assert_allclose(result.as_numpy("LETTERBOX"), letterbox_params(hw, SIZE), rtol=1e-7)
    assert result.as_numpy("IMAGE_HW").tolist() == [300, 512]
    np.testing.assert_allclose(want[0, :, :5], 114 / 255, rtol=1e-6)  # rows of padding above the 64x38 image


@requires_server
@pytest.mark.triton
def test_concurrent_requests_of_other_shapes_each_get_their_own_image_detections(served):
    """Wide, tall and square images in flight together (the detector may batch them): each
    response holds its own image's detections, mapped back through its own letterbox."""
    import tritonclient.http as httpclient

    cuts = [(slice(100, 400), slice(None)), (slice(None), slice(150, 350)), (slice(None), slice(None)),
            (slice(0, 120), slice(0, 500)), (slice(50, 500), slice(300, 380))]
    images = [_jpeg(r, c) for r, c in cuts]
    client = httpclient.InferenceServerClient(served["server"].http_url, concurrency=len(images))
    try:
        pending = []
        for blob, _ in images:
            inp = httpclient.InferInput("IMAGE", [1], "BYTES")
            inp.set_data_from_numpy(np.array([blob], dtype=object))
            pending.append(client.async_infer("det_ensemble", [inp]))
        results = [r.get_result() for r in pending]
    finally:
        client.close()
    for (blob, hw), result in zip(images, results, strict=True):
        det, boxes, _, _ = _local(served, blob)
        got = result.as_numpy("boxes")
        assert got.shape == (len(det), 4), hw
        np.testing.assert_allclose(got, boxes, atol=1e-3, rtol=0)
        np.testing.assert_array_equal(result.as_numpy("classes"), det.classes)
        if len(det):
            assert boxes[:, [0, 2]].max() <= hw[1] and boxes[:, [1, 3]].max() <= hw[0]


@requires_server
@pytest.mark.triton
def test_a_request_that_is_not_an_image_is_refused(served):
    """Bytes that are no image: the ensemble answers with the preprocessing model's error."""
    import tritonclient.http as httpclient
    from tritonclient.utils import InferenceServerException

    client = httpclient.InferenceServerClient(served["server"].http_url)
    try:
        inp = httpclient.InferInput("IMAGE", [1], "BYTES")
        inp.set_data_from_numpy(np.array([b"not an image"], dtype=object))
        with pytest.raises(InferenceServerException, match="preprocess"):
            client.infer("det_ensemble", [inp])
    finally:
        client.close()
