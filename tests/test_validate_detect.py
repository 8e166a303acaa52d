"""Issue 43 item 4: ``trtrepo validate`` speaks boxes. The real tritonserver serves the YOLOv8-style
detector of tests/test_detector_ensemble.py behind its detector ensemble (letterbox -> model ->
decode + NMS); validate sends image files, runs the FP32 ONNX reference locally through the same
letterbox and postprocessing at the served settings, and reports mAP vs the reference, box counts,
the worst images by name and the end-to-end latency per concurrency level. A served model that
differs from the reference is caught by ``--min-map`` (exit 1). Long tier: the trained YOLO11n
deployed FP32 as an ensemble, validated on the Ultralytics wheel's ``bus.jpg`` and ``zidane.jpg``."""

from __future__ import annotations

import json
import zipfile
from pathlib import Path

import numpy as np
import pytest
from test_detector_ensemble import CONF, IOU, MAX_DET, NC, SIZE, _detector_onnx, _local

from trtrepo.errors import UsageError
from trtrepo.preprocessing import Preprocess
from trtrepo.validate import Thresholds


def _photos(folder: Path) -> dict[str, tuple[int, int]]:
    """Four JPEGs of other shapes (wide, tall, square, small) from scikit-image's samples:
    file name -> (height, width)."""
    from PIL import Image
    from skimage import data

    folder.mkdir()
    cuts = {"astronaut_wide.jpg": data.astronaut()[100:400], "astronaut_tall.jpg": data.astronaut()[:, 150:350],
            "coffee.jpg": data.coffee(), "chelsea_small.jpg": data.chelsea()[50:150, 100:260]}
    out = {}
    for name, arr in cuts.items():
        Image.fromarray(np.ascontiguousarray(arr[..., :3])).save(folder / name, format="JPEG", quality=90)
        out[name] = arr.shape[:2]
    return out


def _perturbed(src: Path, dst: Path) -> Path:
    """The same detector with the stride-16 box distributions' biases scaled by 0.9: other boxes, and
    one box fewer per image after NMS."""
    import onnx
    from onnx import numpy_helper

    model = onnx.load(str(src))
    for init in model.graph.initializer:
        if init.name == "cv2.1.2.bias":
            init.CopyFrom(numpy_helper.from_array(numpy_helper.to_array(init) * np.float32(0.9), init.name))
    onnx.save(model, str(dst))
    return dst


@pytest.fixture(scope="module")
def served(tmp_path_factory, triton_server):
    from trtrepo.evaluate import detection_layout
    from trtrepo.repository import add_detector_ensemble, add_onnx_model
    from trtrepo.tritonconfig import ModelOptions, NmsSettings

    tmp = tmp_path_factory.mktemp("valdet")
    onnx_path = _detector_onnx(tmp / "det.onnx")
    other = _perturbed(onnx_path, tmp / "other.onnx")
    repo = tmp / "repo"
    layout = detection_layout([-1, 4 + NC, (SIZE // 8) ** 2 + (SIZE // 16) ** 2 + (SIZE // 32) ** 2], NC)
    pre = Preprocess(letterbox=(SIZE, SIZE))
    for name, path in (("det", onnx_path), ("other", other)):
        _, cfg = add_onnx_model(repo, name, path, backend="python", options=ModelOptions(max_batch_size=4))
        add_detector_ensemble(repo, cfg, pre, layout, NmsSettings(conf=CONF, iou=IOU, max_det=MAX_DET))
    photos = _photos(tmp / "photos")
    spec = pre.save(tmp / "pre.json")
    server = triton_server(repo)
    return {"repo": repo, "onnx": onnx_path, "layout": layout, "pre": pre, "server": server, "photos": photos,
            "folder": tmp / "photos", "spec": spec, "tmp": tmp}


def _validate(run_cli, served, model: str, *args: str):
    report = served["tmp"] / f"report-{model}-{len(args)}"
    r = run_cli("validate", "--url", served["server"].grpc_url, "--model", model, "--reference", served["onnx"],
                "--data", served["folder"], "--preprocess", served["spec"], "--report", report, "--no-progress",
                "--no-reference-speed", *args)
    data = json.loads((report / "validate.json").read_text()) if (report / "validate.json").is_file() else None
    return r, data, report


@pytest.mark.triton
def test_validate_on_the_fp32_ensemble_prints_boxes_figures_and_end_to_end_latency(served, run_cli):
    r, data, report = _validate(run_cli, served, "det_ensemble", "--min-map", "0.99", "--concurrency", "1,2",
                                "--requests", "8", "--warmup", "2", "--max-trials", "4", "--stability-percentage", "100")
    assert r.exit_code == 0, r.output + r.stderr
    det = data["detection"]
    # the served settings, read from the postprocessing model's config
    assert det["settings"] == {"postprocess": "det_postprocess", "raw_output": "output0", "conf": CONF, "iou": IOU,
                                    "max_det": MAX_DET, "layout": "anchor_free", "classes": NC}
    # the reference's boxes, computed here on the same files the ensemble's way
    local = {f: len(_local(served, (served["folder"] / f).read_bytes())[0]) for f in served["photos"]}
    assert sum(local.values()) > 0, local
    assert {row["file"]: row["reference_boxes"] for row in det["per_image"]} == local
    assert {row["file"]: row["served_boxes"] for row in det["per_image"]} == local
    f = det["figures"]
    assert f["map50_95"] == pytest.approx(1.0) and f["map50"] == pytest.approx(1.0) and f["lower"] == pytest.approx(1.0)
    assert f["count_agreement"] == 1.0 and f["reference_boxes"] == f["candidate_boxes"] == sum(local.values())
    assert det["images"] == 4 and det["count_differences"] == []
    assert {w["file"] for w in det["worst_images"]} <= set(local)
    assert data["accuracy"] is None and data["server"]["endpoint"] == "encoded images"
    (t,) = [t for t in data["thresholds"] if t["name"].startswith("map[")]
    assert t == {**t, "name": "map[det_ensemble]", "limit": 0.99, "passed": True} and t["value"] == pytest.approx(1.0)
    # end-to-end latency: every request went through the whole ensemble, one image each
    levels = data["latency"]["levels"]
    assert [lv["concurrency"] for lv in levels] == [1, 2]
    assert all(lv["requests"] >= 24 and lv["server"]["request_count"] == lv["requests"] for lv in levels)
    out = r.output
    assert "detections of det_ensemble vs the reference run locally" in out and "mAP50-95 1.000" in out
    assert f"conf {CONF:g}, IoU {IOU:g}, max {MAX_DET}" in out
    assert "latency end to end (one encoded image per request: decode + preprocessing + model + NMS):" in out
    assert "worst images:" not in out  # every image at 1.0: none is listed
    assert "c=1:" in out and "c=2:" in out and "map[det_ensemble]: 1 (limit 0.99) ok" in out
    md = (report / "validate.md").read_text()
    assert "## Detections (4 images, one request each)" in md and "Worst images" in md


@pytest.mark.triton
def test_a_served_model_that_differs_is_caught_in_boxes(served, run_cli):
    r, data, report = _validate(run_cli, served, "other_ensemble", "--min-map", "0.99", "--no-latency")
    assert r.exit_code == 1, r.output + r.stderr
    f = data["detection"]["figures"]
    assert f["map50_95"] < 0.99
    assert data["failures"] == ["map[other_ensemble]"] and data["passed"] is False
    assert "validation failed: map[other_ensemble] =" in r.stderr + r.output
    worst = data["detection"]["worst_images"]
    assert worst and worst[0]["file"] in served["photos"] and worst[0]["map50_95"] < 1.0
    assert "worst images: " + worst[0]["file"] in r.output
    differ = data["detection"]["count_differences"]
    assert differ and all(d["reference_boxes"] != d["served_boxes"] for d in differ) and "box counts differ: " in r.output
    assert "map[other_ensemble]" in (report / "validate.md").read_text()


@pytest.mark.triton
def test_the_raw_detector_model_is_judged_in_boxes_too(served, run_cli):
    """The model behind the ensemble, served on tensors: its head output is found in the ONNX
    graph and judged by the gate's rule beside the cosine."""
    r, data, _ = _validate(run_cli, served, "det", "--no-latency", "--min-map", "0.99")
    assert r.exit_code == 0, r.output + r.stderr
    m = data["accuracy"]["outputs"]["output0"]
    assert m["cosine_mean"] == pytest.approx(1.0, abs=1e-6) and m["detection"]["map50_95"] == pytest.approx(1.0)
    assert data["detection"] is None and "output0: in boxes" in r.output
    assert [t["name"] for t in data["thresholds"] if t["name"].startswith("map")] == ["map[output0]"]


@pytest.mark.triton
def test_a_detector_ensemble_refuses_batches_and_non_detectors_refuse_min_map(served, run_cli):
    r, _, report = _validate(run_cli, served, "det_ensemble", "--batch-size", "2", "--no-latency")
    assert r.exit_code == 2 and "--batch-size 2: model 'det_ensemble' is a detector ensemble" in r.stderr
    assert len(r.stderr.strip().splitlines()) == 1 and not report.exists()
    resize = Preprocess(resize=(SIZE, SIZE)).save(served["tmp"] / "resize.json")
    r = run_cli("validate", "--url", served["server"].grpc_url, "--model", "det_ensemble", "--reference", served["onnx"],
                "--data", served["folder"], "--preprocess", resize, "--no-latency")
    assert r.exit_code == 2 and r.stderr.strip() == ("error: --preprocess must letterbox as the served detector's "
                                                     "preprocessing does (a spec with letterbox, as deploy wrote it)")
    with pytest.raises(UsageError, match="the mAP floor 1.5: between 0 and 1"):
        Thresholds(min_map=1.5)


@pytest.mark.triton
def test_an_ultralytics_export_needs_no_preprocessing_spec(served, run_cli):
    """A reference whose exporter declares its input size (Ultralytics' task and imgsz metadata) is
    read through its own letterbox, as deploy wrote the ensemble's: no --preprocess."""
    import onnx

    model = onnx.load(str(served["onnx"]))
    for key, value in (("task", "detect"), ("imgsz", f"[{SIZE}, {SIZE}]")):
        prop = model.metadata_props.add()
        prop.key, prop.value = key, value
    exported = served["tmp"] / "exported.onnx"
    onnx.save(model, str(exported))
    r = run_cli("validate", "--url", served["server"].grpc_url, "--model", "det_ensemble", "--reference", exported,
                "--data", served["folder"], "--no-latency", "--min-map", "0.99", "--no-progress")
    assert r.exit_code == 0, r.output + r.stderr
    assert "mAP50-95 1.000" in r.output and "map[det_ensemble]: 1 (limit 0.99) ok" in r.output
    bare = run_cli("validate", "--url", served["server"].grpc_url, "--model", "det_ensemble", "--reference",
                   served["onnx"], "--data", served["folder"], "--no-latency")
    assert bare.exit_code == 2 and "an image folder needs a preprocessing spec (--preprocess FILE)" in bare.stderr


def _coco_labels(served, path: Path) -> Path:
    """The reference's own boxes on each photo, written as a COCO instances file in the files'
    pixels (category ids 0..NC-1: by sorted id they are the classes themselves)."""
    images, anns = [], []
    for i, (f, (h, w)) in enumerate(served["photos"].items()):
        det, boxes, _, _ = _local(served, (served["folder"] / f).read_bytes())
        images.append({"id": i, "file_name": f, "width": int(w), "height": int(h)})
        anns += [{"image_id": i, "category_id": int(c), "bbox": [float(b[0]), float(b[1]), float(b[2] - b[0]),
                                                                 float(b[3] - b[1])]}
                 for b, c in zip(boxes, det.classes, strict=True)]
    path.write_text(json.dumps({"images": images, "annotations": anns,
                                "categories": [{"id": k, "name": f"c{k}"} for k in range(NC)]}))
    return path


@pytest.mark.triton
def test_with_box_labels_validate_judges_the_served_map_drop(served, run_cli):
    """--labels on the image folder: the served detections and the reference's are both judged
    against the labels; --max-map-drop judges the drop (the gate's labelled rule). The labels are
    the reference's own boxes, so the reference scores 1.0 and the perturbed model loses."""
    labels = _coco_labels(served, served["tmp"] / "labels.json")
    r, data, report = _validate(run_cli, served, "det_ensemble", "--labels", labels, "--max-map-drop", "0.5",
                                "--no-latency")
    assert r.exit_code == 0, r.output + r.stderr
    lab = data["detection"]["figures"]["labels"]
    assert lab["fp32_map50_95"] == pytest.approx(1.0) and lab["map50_95"] == pytest.approx(1.0) and lab["drop"] == 0
    assert lab["images"] == 4 and lab["boxes"] == data["detection"]["figures"]["reference_boxes"]
    (t,) = [t for t in data["thresholds"] if t["name"].startswith("map_drop[")]
    assert t["name"] == "map_drop[det_ensemble]" and t["passed"] and t["value"] == 0
    assert "against the box labels: mAP50-95 vs labels 1.000 against the reference's 1.000" in r.output
    r, data, _ = _validate(run_cli, served, "other_ensemble", "--labels", labels, "--max-map-drop", "0.5",
                           "--no-latency")
    lab = data["detection"]["figures"]["labels"]
    assert r.exit_code == 1 and lab["drop"] > 0.5 and data["failures"] == ["map_drop[other_ensemble]"], r.output
    assert lab["drop"] == pytest.approx(100 * (lab["fp32_map50_95"] - lab["map50_95"]))
    # the raw model on tensors: its head output judged against the same labels, in the input's frame
    r, data, _ = _validate(run_cli, served, "det", "--labels", labels, "--max-map-drop", "0.5", "--no-latency")
    assert r.exit_code == 0, r.output + r.stderr
    raw = data["accuracy"]["outputs"]["output0"]["detection"]["labels"]
    assert raw["drop"] == 0 and raw["images"] == 4 and "output0: in boxes" in r.output
    # no labels: --max-map-drop has nothing to judge
    r, _, _ = _validate(run_cli, served, "det_ensemble", "--max-map-drop", "0.5", "--no-latency")
    assert r.exit_code == 2 and "no detector was judged against box labels (give --labels" in r.stderr, r.stderr


# --------------------------------------------------------------------------------------------
# Pure parts: the verdict and the endpoint's recognition


def _figures(map50_95: float, sd: float, decided: int):
    from trtrepo.detect import DetectionFigures

    half = 1.96 * sd / decided ** 0.5
    return DetectionFigures(images=decided, decided=decided, reference_boxes=10, candidate_boxes=10, map50_95=map50_95,
                            map50=map50_95, lower=max(0.0, map50_95 - half), upper=min(1.0, map50_95 + half), sd=sd,
                            count_agreement=1.0)


def test_min_map_judges_the_interval_as_the_gate_does():
    from trtrepo.validate.detection import map_threshold

    ok = map_threshold(_figures(0.97, 0.01, 20), "m", 0.9)
    assert ok.passed and ok.value == 0.97 and ok.name == "map[m]"
    low = map_threshold(_figures(0.85, 0.01, 20), "m", 0.9)
    assert not low.passed and "cannot decide" not in low.detail
    undecided = map_threshold(_figures(0.92, 0.1, 4), "m", 0.9)  # over the limit, its interval reaches under it
    assert not undecided.passed and "cannot decide on 4 images, about" in undecided.detail
    need = int(undecided.detail.split("about ")[1].split()[0])
    assert map_threshold(_figures(0.92, 0.1, need), "m", 0.9).passed


def test_only_a_detection_ensemble_is_recognised_and_its_settings_come_from_the_server():
    from trtrepo.modelio import ModelIO, TensorSpec
    from trtrepo.validate.detection import detector_endpoint

    io_ = ModelIO((TensorSpec("images", "float32", (-1, 3, SIZE, SIZE)),), (TensorSpec("output0", "float32", (-1, 7, 84)),))
    meta = {"name": "d_ensemble", "inputs": [{"name": "IMAGE", "datatype": "BYTES"}],
            "outputs": [{"name": n} for n in ("boxes", "scores", "classes")]}
    steps = {"ensemble_scheduling": {"step": [
        {"model_name": "d", "input_map": {"images": "images"}, "output_map": {"output0": "raw"}},
        {"model_name": "d_post", "input_map": {"output0": "raw"}, "output_map": {"boxes": "boxes"}}]}}
    params = {"conf": "0.4", "iou": "0.6", "max_det": "9", "kind": "anchor_free", "num_classes": "3"}
    post = {"input": [{"name": "output0"}], "parameters": {k: {"string_value": v} for k, v in params.items()}}
    ep = detector_endpoint(io_, meta, steps, {"d_post": post}.__getitem__)
    assert ep is not None and (ep.raw_output, ep.postprocess, ep.image_input) == ("output0", "d_post", "IMAGE")
    assert (ep.nms.conf, ep.nms.iou, ep.nms.max_det, ep.layout.num_classes) == (0.4, 0.6, 9, 3)
    classifier = {**meta, "outputs": [{"name": "logits"}]}
    assert detector_endpoint(io_, classifier, steps, {"d_post": post}.__getitem__) is None
    bare = {"input": post["input"], "parameters": {}}
    with pytest.raises(UsageError, match="its postprocessing model 'd_post' has no parameter 'conf'"):
        detector_endpoint(io_, meta, steps, {"d_post": bare}.__getitem__)


# --------------------------------------------------------------------------------------------
# Long tier: the trained YOLO11n



@pytest.mark.long
@pytest.mark.triton
def test_yolo11n_fp32_ensemble_matches_the_local_fp32_run_on_bus_and_zidane(yolo, tmp_path, run_cli, triton_server):
    photos = tmp_path / "photos"
    photos.mkdir()
    with zipfile.ZipFile(next((yolo / "wheels").glob("ultralytics-*.whl"))) as z:
        for name in ("bus.jpg", "zidane.jpg"):
            (photos / name).write_bytes(z.read(f"ultralytics/assets/{name}"))
    model = yolo / "yolo11n_dyn.onnx"
    repo = tmp_path / "repo"
    res = run_cli("deploy", model, "--name", "yolo", "--repo", repo, "--data", photos, "--backend", "python",
                  "--ensemble", "--precision", "fp32")
    assert res.exit_code == 0, res.output + res.stderr
    server = triton_server(repo, timeout=300.0)
    report = tmp_path / "report"
    # no --preprocess: the export's own letterbox (its metadata), as deploy wrote the ensemble's
    r = run_cli("validate", "--url", server.grpc_url, "--model", "yolo_ensemble", "--reference", model,
                "--data", photos, "--min-map", "0.99", "--concurrency", "1,2", "--requests", "4",
                "--warmup", "2", "--max-trials", "4", "--stability-percentage", "100", "--no-reference-speed",
                "--timeout", "60", "--report", report, "--no-progress")
    assert r.exit_code == 0, r.output + r.stderr
    data = json.loads((report / "validate.json").read_text())
    det = data["detection"]
    counts = {row["file"]: (row["reference_boxes"], row["served_boxes"]) for row in det["per_image"]}
    # bus.jpg: the people and the bus; zidane.jpg: the two men (and a tie), at the served conf 0.25
    assert counts["bus.jpg"][0] >= 4 and counts["zidane.jpg"][0] >= 2, counts
    assert det["settings"]["classes"] == 80 and det["settings"]["conf"] == 0.25
    assert det["figures"]["map50_95"] >= 0.99 and det["figures"]["count_agreement"] == 1.0
    assert "detections of yolo_ensemble" in r.output and "latency end to end" in r.output
    assert [lv["concurrency"] for lv in data["latency"]["levels"]] == [1, 2]
