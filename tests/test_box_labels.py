"""Issue 43 item 3, "with labels (COCO JSON or YOLO txt) the real mAP drop decides": the two label
formats read into the model input's frame (trtrepo.detect.labels, trtrepo.boxlabels), COCO's mAP
against them checked with pycocotools' COCOeval on the same JSON, the gate's labelled rule on
hand-built detections, and ``quantize --labels`` through the real CLI on a small exported detector."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
from PIL import Image

from trtrepo.boxlabels import read_box_labels
from trtrepo.data import open_data
from trtrepo.detect import (
    BoxLabels,
    Detections,
    YoloLayout,
    class_names,
    coco_index,
    image_region,
    in_input_frame,
    labelled_figures,
    letterbox_params,
    mean_ap,
    unletterbox,
    yolo_txt_boxes,
)
from trtrepo.errors import OptionError, UsageError
from trtrepo.evaluate import AccuracyTarget, Detector, compare_outputs
from trtrepo.preprocessing import Preprocess
from trtrepo.quantize import AccuracyCheck
from trtrepo.quantize.gate import DETECTION_RULE, LABELLED_DETECTION_RULE

SIZE = 64
LETTERBOX = Preprocess(letterbox=(SIZE, SIZE), scale=1 / 255, color="rgb", layout="NCHW")


# --- the formats --------------------------------------------------------------------------------


def test_yolo_txt_lines_become_pixel_boxes_and_a_polygon_its_bounding_box() -> None:
    text = "0 0.5 0.5 0.2 0.4\n\n2 0.1 0.2 0.3 0.2 0.2 0.6\n"
    classes, boxes = yolo_txt_boxes(text, (200, 100), num_classes=3)
    assert classes.tolist() == [0, 2]
    np.testing.assert_allclose(boxes, [[80, 30, 120, 70], [20, 20, 60, 60]], atol=1e-4)


@pytest.mark.parametrize("text,needle", [
    ("0 0.5 0.5 0.2 0.4\n1 0.5 0.5\n", "line 2: 3 values"),
    ("3 0.5 0.5 0.2 0.4\n", "line 1: class '3' is not a class index: expected from 0 to 2"),
    ("1.5 0.5 0.5 0.2 0.4\n", "line 1: class '1.5'"),
    ("0 0.5 nan 0.2 0.4\n", "line 1: coordinate 'nan' is not a finite number"),
    ("0 0.5 0.5 -0.2 0.4\n", "line 1: a negative width or height"),
])
def test_a_bad_yolo_line_is_named(text: str, needle: str) -> None:
    with pytest.raises(ValueError, match=None) as err:
        yolo_txt_boxes(text, (100, 100), num_classes=3)
    assert needle in str(err.value)


def _coco(categories, annotations, images=None):
    images = images or [{"id": 1, "file_name": "a.jpg", "width": 100, "height": 50}]
    return {"images": images, "annotations": annotations, "categories": categories}


def test_coco_categories_map_by_the_models_names_else_by_sorted_id() -> None:
    ann = [{"image_id": 1, "category_id": 3, "bbox": [10, 5, 20, 10]},
           {"image_id": 1, "category_id": 1, "bbox": [0, 0, 5, 5], "iscrowd": 1}]
    cats = [{"id": 1, "name": "cat"}, {"id": 3, "name": "dog"}]
    by_name = coco_index(_coco(cats, ann), class_names=("person", "dog", "cat"))
    assert by_name.mapping == "by name"
    img = by_name.images["a.jpg"]
    assert img.classes.tolist() == [1, 2] and img.crowd.tolist() == [False, True] and img.size == (100, 50)
    np.testing.assert_allclose(img.boxes[0], [10, 5, 30, 15])
    by_id = coco_index(_coco(cats, ann), num_classes=2)  # no names: ids 1, 3 -> classes 0, 1
    assert by_id.mapping == "by sorted id" and by_id.images["a.jpg"].classes.tolist() == [1, 0]
    with pytest.raises(ValueError, match="2 categories map by sorted id only onto 80 classes"):
        coco_index(_coco(cats, ann), num_classes=80)
    with pytest.raises(ValueError, match="names 'dog' are not among the model's classes"):
        coco_index(_coco(cats, ann), class_names=("person", "cat", "bus"))


@pytest.mark.parametrize("doc,needle", [
    (_coco([{"id": 1, "name": "a"}], [{"image_id": 7, "category_id": 1, "bbox": [0, 0, 1, 1]}]),
     "annotations[0]: image_id 7 is not among the images"),
    (_coco([{"id": 1, "name": "a"}], [{"image_id": 1, "category_id": 2, "bbox": [0, 0, 1, 1]}]),
     "annotations[0]: category_id 2 is not among the categories"),
    (_coco([{"id": 1, "name": "a"}], [{"image_id": 1, "category_id": 1, "bbox": [0, 0, 1]}]),
     "annotations[0]: 'bbox' is not [x, y, width, height]"),
    (_coco([{"id": 1, "name": "a"}], [], images=[{"id": 1, "file_name": "a.jpg", "width": 0, "height": 5}]),
     "images[0]: width and height must be positive"),
    ({"images": [], "annotations": {}}, "'annotations' is not a list of objects"),
])
def test_a_bad_coco_entry_is_named(doc, needle: str) -> None:
    with pytest.raises(ValueError) as err:
        coco_index(doc, num_classes=1)
    assert needle in str(err.value)


def test_the_exporters_class_names_are_read_as_literals_only() -> None:
    assert class_names("{0: 'person', 1: 'bicycle'}") == ("person", "bicycle")
    assert class_names("['a', 'b']") == ("a", "b")
    for bad in ("{1: 'a'}", "__import__('os').system('true')", "{0: 1}", "", "{0: 'a', 2: 'b'}"):
        assert class_names(bad) == ()


def test_boxes_go_into_the_letterboxed_input_and_back() -> None:
    params = letterbox_params((50, 100), SIZE)  # a 100x50 image: scaled 0.64, padded 16 rows on top
    boxes = np.array([[10, 5, 30, 15], [0, 0, 100, 50]], np.float32)
    inside = in_input_frame(boxes, params)
    np.testing.assert_allclose(inside[1], [0, 16, 64, 48], atol=1e-4)
    assert image_region((100, 50), params) == pytest.approx((0, 16, 64, 48))
    np.testing.assert_allclose(unletterbox(inside, params, (50, 100)), boxes, atol=1e-4)


# --- mAP against labels, checked with pycocotools -----------------------------------------------


@pytest.mark.parametrize("seed", [0, 1])
def test_map_against_coco_labels_matches_cocoeval(tmp_path: Path, seed: int) -> None:
    coco_module = pytest.importorskip("pycocotools.coco")
    cocoeval = pytest.importorskip("pycocotools.cocoeval")
    rng = np.random.default_rng(seed)
    cats = [{"id": cid, "name": f"c{cid}"} for cid in (1, 3, 7, 90)]  # COCO-style ids with gaps
    images, anns, dets, results = [], [], [], []
    for i in range(12):
        images.append({"id": i + 1, "file_name": f"{i}.jpg", "width": 200, "height": 160})
        boxes, classes, scores = [], [], []
        for _ in range(int(rng.integers(0, 6))):
            x, y = rng.uniform(0, 150), rng.uniform(0, 110)
            w, h = rng.uniform(8, 50), rng.uniform(8, 50)
            cid = int(rng.choice([1, 3, 7, 90]))
            anns.append({"id": len(anns) + 1, "image_id": i + 1, "category_id": cid, "bbox": [x, y, w, h],
                         "area": w * h, "iscrowd": 0})
            for _ in range(int(rng.integers(0, 3))):  # predictions near the truth, and strays
                jx, jy = rng.normal(0, 4, 2)
                cls = cid if rng.random() < 0.8 else int(rng.choice([1, 3, 7, 90]))
                boxes.append([x + jx, y + jy, x + jx + w, y + jy + h])
                classes.append(cls)
                scores.append(float(rng.uniform(0.05, 1)))
        for _ in range(int(rng.integers(0, 3))):
            x, y = rng.uniform(0, 150), rng.uniform(0, 110)
            boxes.append([x, y, x + 30, y + 30])
            classes.append(int(rng.choice([1, 3, 7, 90])))
            scores.append(float(rng.uniform(0.05, 1)))
        index_of = {1: 0, 3: 1, 7: 2, 90: 3}
        dets.append(Detections(np.asarray(boxes, np.float32).reshape(-1, 4), np.asarray(scores, np.float32),
                               np.asarray([index_of[c] for c in classes], np.int64)))
        results += [{"image_id": i + 1, "category_id": c, "score": s,
                     "bbox": [float(b[0]), float(b[1]), float(b[2] - b[0]), float(b[3] - b[1])]}
                    for b, c, s in zip(boxes, classes, scores, strict=True)]
    doc = {"images": images, "annotations": anns, "categories": cats}
    index = coco_index(doc, num_classes=4)
    truth = [BoxLabels.of(index.images[f"{i}.jpg"].classes, index.images[f"{i}.jpg"].boxes) for i in range(12)]
    ours = mean_ap(dets, [t.objects for t in truth])
    # pycocotools on the same JSON and results
    (tmp_path / "gt.json").write_text(json.dumps(doc))
    gt = coco_module.COCO(str(tmp_path / "gt.json"))
    ev = cocoeval.COCOeval(gt, gt.loadRes(results), "bbox")
    ev.evaluate()
    ev.accumulate()
    ev.summarize()
    assert ours.map50_95 == pytest.approx(ev.stats[0], abs=1e-6)
    assert ours.map50 == pytest.approx(ev.stats[1], abs=1e-6)
    # the same detections judged twice: no drop, an interval of zero width
    fig = labelled_figures(truth, dets, dets)
    assert fig.drop == 0 and fig.lower == 0 and fig.upper == 0 and fig.fp32_map50_95 == pytest.approx(ev.stats[0])


# --- the files, in the input's frame ------------------------------------------------------------


def _folder(tmp_path: Path) -> Path:
    photos = tmp_path / "photos"
    (photos / "sub").mkdir(parents=True)
    Image.new("RGB", (100, 50), (200, 10, 10)).save(photos / "sub" / "a.png")
    Image.new("RGB", (40, 80), (10, 200, 10)).save(photos / "b.png")
    return photos


def _files(photos: Path) -> list[Path]:
    return [photos / "b.png", photos / "sub" / "a.png"]


def test_coco_json_labels_are_found_by_relative_path_or_file_name(tmp_path: Path) -> None:
    photos = _folder(tmp_path)
    doc = _coco([{"id": 1, "name": "x"}, {"id": 2, "name": "y"}],
                [{"image_id": 1, "category_id": 2, "bbox": [10, 5, 20, 10]},
                 {"image_id": 2, "category_id": 1, "bbox": [0, 0, 40, 80], "iscrowd": 1}],
                images=[{"id": 1, "file_name": "sub/a.png", "width": 100, "height": 50},
                        {"id": 2, "file_name": "val/b.png", "width": 40, "height": 80}])
    (tmp_path / "l.json").write_text(json.dumps(doc))
    got = read_box_labels(tmp_path / "l.json", photos, _files(photos), LETTERBOX, class_names=("x", "y"))
    assert got.kind == "COCO JSON" and got.mapping == "by name"
    b, a = got.labels
    assert len(b.objects) == 0 and len(b.crowd) == 1  # the crowd region is an ignore region
    np.testing.assert_allclose(b.crowd.boxes[0], [16, 0, 48, 64], atol=1e-4)
    np.testing.assert_allclose(a.objects.boxes[0], in_input_frame(np.array([[10, 5, 30, 15]]),
                                                                  letterbox_params((50, 100), SIZE))[0])
    assert a.objects.classes.tolist() == [1] and a.region == pytest.approx((0, 16, 64, 48))

    doc["images"][1]["width"] = 41
    (tmp_path / "l.json").write_text(json.dumps(doc))
    with pytest.raises(UsageError, match=r"l.json: image 'b.png' is 41x80 in the labels but 40x80 in"):
        read_box_labels(tmp_path / "l.json", photos, _files(photos), LETTERBOX, class_names=("x", "y"))
    doc["images"] = doc["images"][:1]
    doc["annotations"] = doc["annotations"][:1]
    (tmp_path / "l.json").write_text(json.dumps(doc))
    with pytest.raises(UsageError, match=r"l.json: no entry for image 'b.png' of"):
        read_box_labels(tmp_path / "l.json", photos, _files(photos), LETTERBOX, class_names=("x", "y"))
    (tmp_path / "l.json").write_text("{not json")
    with pytest.raises(UsageError, match=r"l.json: not a readable JSON file"):
        read_box_labels(tmp_path / "l.json", photos, _files(photos), LETTERBOX)


def test_yolo_txt_labels_sit_beside_the_images_and_a_missing_file_is_a_background_image(tmp_path: Path) -> None:
    photos = _folder(tmp_path)
    labels = tmp_path / "labels"
    (labels / "sub").mkdir(parents=True)
    (labels / "sub" / "a.txt").write_text("1 0.2 0.2 0.2 0.2\n")
    got = read_box_labels(labels, photos, _files(photos), LETTERBOX, num_classes=2)
    assert got.kind == "YOLO txt" and [len(x.objects) for x in got.labels] == [0, 1]
    np.testing.assert_allclose(got.labels[1].objects.boxes[0], [6.4, 16 + 3.2, 19.2, 16 + 9.6], atol=1e-4)
    (labels / "sub" / "a.txt").write_text("1 0.2 0.2 0.2 0.2\n2 0.2 0.2 0.2 0.2\n")
    with pytest.raises(UsageError, match=r"a.txt: line 2: class '2' is not a class index"):
        read_box_labels(labels, photos, _files(photos), LETTERBOX, num_classes=2)
    (labels / "sub" / "a.txt").unlink()
    with pytest.raises(UsageError, match="no .txt label files"):
        read_box_labels(labels, photos, _files(photos), LETTERBOX, num_classes=2)


def test_boxes_follow_the_samples_through_a_split_and_need_an_image_folder_with_a_letterbox(tmp_path: Path) -> None:
    photos = _folder(tmp_path)
    labels = tmp_path / "labels"
    labels.mkdir()
    (labels / "b.txt").write_text("0 0.5 0.5 1 1\n")
    src = open_data(str(photos), preprocess=LETTERBOX, labels=str(labels))
    assert not src.has_labels and src.labels() is None  # boxes replace the sub-folder's class labels
    names = src.sample_names()
    boxes = src.box_labels()
    assert names is not None and boxes is not None
    assert [len(b.objects) for b in boxes] == [1 if n == "b.png" else 0 for n in names]
    flipped = src.take([1, 0])
    assert [len(b.objects) for b in flipped.box_labels()] == [len(b.objects) for b in boxes][::-1]
    np.save(tmp_path / "x.npy", np.zeros((2, 3, SIZE, SIZE), np.float32))
    with pytest.raises(OptionError, match="go with an image folder as the data"):
        open_data(str(tmp_path / "x.npy"), labels=str(labels))
    with pytest.raises(OptionError, match="boxes need the letterbox preprocessing"):
        open_data(str(photos), preprocess=Preprocess(resize=(SIZE, SIZE)), labels=str(labels))


# --- the gate's labelled rule ---------------------------------------------------------------------


def _head(boxes_per_image: list[list[tuple[float, float, float, float, int, float]]], anchors: int = 32) -> np.ndarray:
    """A raw anchor-free head output ``[N, 4 + 3, anchors]`` (cx, cy, w, h, class scores) holding
    the given (x1, y1, x2, y2, class, score) boxes and nothing else."""
    out = np.zeros((len(boxes_per_image), 7, anchors), np.float32)
    for i, boxes in enumerate(boxes_per_image):
        for j, (x1, y1, x2, y2, c, s) in enumerate(boxes):
            out[i, :4, j] = [(x1 + x2) / 2, (y1 + y2) / 2, x2 - x1, y2 - y1]
            out[i, 4 + c, j] = s
    return out


def test_with_labels_the_gate_judges_the_map_drop_and_catches_a_worse_model() -> None:
    rng = np.random.default_rng(0)
    objects = [[(float(x), float(y), float(x) + 12, float(y) + 10, int(c), 0.9)
                for x, y, c in zip(rng.uniform(0, 50, 3), rng.uniform(0, 50, 3), rng.integers(0, 3, 3), strict=True)]
               for _ in range(40)]
    truth = [BoxLabels.of(np.array([o[4] for o in img]), np.array([o[:4] for o in img])) for img in objects]
    ref = _head(objects)
    detector = Detector.of(ref, 3, truth)
    same = compare_outputs({"output0": ref}, {"output0": ref.copy()}, detection={"output0": detector})["output0"]
    check = AccuracyCheck()
    v = check.judge(same)
    assert v["rule"] == LABELLED_DETECTION_RULE and v["ok"] and v["value"] == 0, v["message"]
    assert "vs labels 1.000 against FP32's 1.000" in v["message"] and "against FP32's detections" in v["message"]
    shifted = _head([[(x1 + 3, y1 + 2, x2 + 3, y2 + 2, c, s) for x1, y1, x2, y2, c, s in img] for img in objects])
    worse = compare_outputs({"output0": ref}, {"output0": shifted}, detection={"output0": detector})["output0"]
    v = check.judge(worse)
    lab = worse.detection.labels
    assert v["rule"] == LABELLED_DETECTION_RULE and not v["ok"] and not v["inconclusive"]
    assert v["value"] == pytest.approx(100 * (lab.fp32_map50_95 - lab.map50_95)) and v["value"] > 10
    assert lab.lower <= lab.drop <= lab.upper
    from trtrepo.detect import DetectionFigures
    from trtrepo.validate.detection import figures_dict, figures_from

    assert DetectionFigures.from_dict(worse.detection.to_dict()).labels == lab  # the reports read it back
    assert figures_from(json.loads(json.dumps(figures_dict(worse.detection)))).labels == lab
    from trtrepo.evaluate import score

    assert score({"output0": worse})[:2] == (lab.map50_95, worse.detection.map50_95)  # candidates rank by labels
    # without labels the same outputs are judged against FP32's boxes
    plain = compare_outputs({"output0": ref}, {"output0": shifted}, detection={"output0": Detector.of(ref, 3)})
    assert check.judge(plain["output0"])["rule"] == DETECTION_RULE
    one = labelled_figures(truth[:1], [detector.fp32[0]], [detector.fp32[0]])  # one image: no spread to judge
    assert one.drop == 0 and (one.lower, one.upper) == (-100.0, 100.0) and one.verdict(1.0) == "undecided"
    target = AccuracyTarget.parse("map-drop=20")
    assert target.lower_is_better and target.met({"output0": worse}) == (lab.drop <= 20)
    with pytest.raises(OptionError, match="needs box labels of the evaluation images"):
        target.measure(plain)


# --- the command line -----------------------------------------------------------------------------


def test_quantize_with_coco_labels_through_the_cli(tmp_path: Path, run_cli) -> None:
    import skimage.data as d
    from test_deploy_detector import _ultralytics_like

    from trtrepo.detect import postprocess
    from trtrepo.evaluate import make_session

    model = _ultralytics_like(tmp_path)
    photos = tmp_path / "photos"
    photos.mkdir()
    pre = Preprocess(letterbox=(SIZE, SIZE), scale=1 / 255, color="rgb", layout="NCHW", input_name="images")
    pre.save(tmp_path / "pre.json")
    sess = make_session(str(model))
    images, anns = [], []
    for i, name in enumerate(["astronaut", "coffee", "chelsea", "rocket"] * 5):
        img = getattr(d, name)()[..., :3][i:, 2 * i:]
        Image.fromarray(img).save(photos / f"{i:02d}.jpg")
        h, w = img.shape[:2]
        out = sess.run(None, {"images": pre.apply(Image.fromarray(img))[None]})[0]
        det = postprocess(out, YoloLayout.from_shape(out.shape, num_classes=3), conf=0.25, iou=0.7)[0].take(np.arange(5))
        boxes = unletterbox(det.boxes, letterbox_params((h, w), SIZE), (h, w))
        images.append({"id": i, "file_name": f"{i:02d}.jpg", "width": w, "height": h})
        anns += [{"image_id": i, "category_id": int(c) + 1, "bbox": [float(b[0]), float(b[1]), float(b[2] - b[0]),
                                                                    float(b[3] - b[1])]}
                 for b, c in zip(boxes, det.classes, strict=True)]
    cats = [{"id": k + 1, "name": n} for k, n in enumerate("abc")]
    (tmp_path / "coco.json").write_text(json.dumps({"images": images, "annotations": anns, "categories": cats}))
    common = ("--data", photos, "--preprocess", tmp_path / "pre.json", "--method", "minmax", "--weight-rounding",
              "nearest", "--report", tmp_path / "report")
    res = run_cli("quantize", model, "-o", tmp_path / "q.onnx", "--labels", tmp_path / "coco.json",
                  "--accept-accuracy-loss", *common)
    assert res.exit_code == 0, res.output + res.stderr
    assert "mAP50-95 vs labels" in res.output and "against FP32's detections" in res.output, res.output
    report = json.loads((tmp_path / "report" / "quantize.json").read_text())
    verdict = report["accuracy_check"]["verdict"]
    assert verdict["rule"] == LABELLED_DETECTION_RULE and verdict["detection"]["labels"]["images"] == 4
    # evaluate reports the same figures
    res = run_cli("evaluate", model, tmp_path / "q.onnx", "--data", photos, "--preprocess", tmp_path / "pre.json",
                  "--labels", tmp_path / "coco.json")
    assert res.exit_code == 0 and "`output0` against the box labels: mAP50-95 vs labels" in res.output, res.output
    # a label file at fault: one line naming it, exit 2, nothing written
    (tmp_path / "bad.json").write_text(json.dumps({"images": images[:3], "annotations": [], "categories": cats}))
    res = run_cli("quantize", model, "-o", tmp_path / "q2.onnx", "--labels", tmp_path / "bad.json", *common)
    lines = res.stderr.strip().splitlines()
    assert res.exit_code == 2 and len(lines) == 1 and "bad.json: no entry for image '03.jpg'" in lines[0], lines
    assert not (tmp_path / "q2.onnx").exists()


def test_box_labels_for_a_model_without_a_detector_output_are_refused(tmp_path: Path, demo_onnx, run_cli) -> None:
    photos = tmp_path / "photos"
    photos.mkdir()
    Image.new("RGB", (40, 30), (9, 9, 9)).save(photos / "a.png")
    Preprocess(letterbox=(32, 32), color="gray", input_name="input").save(tmp_path / "pre.json")
    (tmp_path / "l.json").write_text(json.dumps(_coco([{"id": 1, "name": "x"}], [],
                                                      images=[{"id": 1, "file_name": "a.png", "width": 40,
                                                               "height": 30}])))
    res = run_cli("evaluate", demo_onnx, demo_onnx, "--data", photos, "--preprocess", tmp_path / "pre.json",
                  "--labels", tmp_path / "l.json")
    assert res.exit_code == 2 and res.stderr.strip().splitlines() == [
        "error: --labels: boxes (a COCO JSON file or a YOLO txt folder), but the model has no detector output "
        "(a YOLO-style head)"], res.stderr


def test_quantize_reads_images_through_an_ultralytics_exports_letterbox(tmp_path: Path, run_cli) -> None:
    """No --preprocess: --data and --eval-data folders are read through the export's own letterbox
    (its task and imgsz metadata), as deploy and validate read them."""
    import skimage.data as d
    from test_deploy_detector import _ultralytics_like

    model = _ultralytics_like(tmp_path)
    for folder, names in (("calib", ["coffee", "rocket", "chelsea"] * 3), ("held", ["astronaut", "coffee"] * 2)):
        (tmp_path / folder).mkdir()
        for i, name in enumerate(names):
            Image.fromarray(getattr(d, name)()[..., :3][i:, i:]).save(tmp_path / folder / f"{i}.jpg")
    res = run_cli("quantize", model, "-o", tmp_path / "q.onnx", "--data", tmp_path / "calib", "--eval-data",
                  tmp_path / "held", "--method", "minmax", "--weight-rounding", "nearest", "--accept-accuracy-loss")
    assert res.exit_code == 0, res.output + res.stderr
    assert "of 4 images hold FP32 boxes" in res.output and (tmp_path / "q.onnx").is_file(), res.output
    # box labels describe the judged images: with --eval-data they go with it (the calibration images have none)
    (tmp_path / "yolo").mkdir()
    for i in range(4):
        (tmp_path / "yolo" / f"{i}.txt").write_text(f"{i % 3} 0.5 0.5 0.4 0.6\n")
    for command, target in (("quantize", ("-o", tmp_path / "q2.onnx")), ("deploy", ("--repo", tmp_path / "repo"))):
        res = run_cli(command, model, *target, "--data", tmp_path / "calib", "--eval-data", tmp_path / "held",
                      "--labels", tmp_path / "yolo", "--method", "minmax", "--weight-rounding", "nearest",
                      "--accept-accuracy-loss", *(("--backend", "python") if command == "deploy" else ()))
        assert res.exit_code == 0, res.output + res.stderr
        assert "(4 labelled boxes in 3 classes on 4 of 4 images)" in res.output, res.output
