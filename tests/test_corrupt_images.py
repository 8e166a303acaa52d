"""A file of an image folder that is no image is named before any work (issue 41 item 7): a text
file named ``zz_notes.png`` is refused by ``validate``, ``deploy``, ``calibrate`` and ``quantize``
with one line naming it and why (exit 2), before an export, a calibration or a server connection,
and nothing is written; ``--skip-non-images`` skips it with a warning naming it."""

from __future__ import annotations

import shutil
import socket
import sys
import textwrap
from pathlib import Path

import numpy as np
import pytest
from PIL import Image

from trtrepo import demo
from trtrepo.data import check_image_folder, image_problem, open_data, scan_image_folder
from trtrepo.errors import OptionError

NOT_AN_IMAGE = "not an image (cannot identify image file); --skip-non-images skips such files"
SKIP = {"skip_non_images": "--skip-non-images"}  # the CLI's flag for the setting the library's message names

TINY = textwrap.dedent('''
    from torch import nn


    def build():
        return nn.Sequential(nn.Conv2d(1, 4, 3, padding=1), nn.ReLU(), nn.AdaptiveAvgPool2d(2), nn.Flatten(),
                             nn.Linear(16, 10))
''')


@pytest.fixture(scope="module")
def project(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """corruptmods/tiny.py (a PyTorch entry point for 1x32x32 inputs, as the demo's), the demo's
    preprocessing spec as pre.json and imgs/: 12 digit PNGs and a text file named zz_notes.png."""
    root = tmp_path_factory.mktemp("corrupt")
    (root / "corruptmods").mkdir()
    (root / "corruptmods" / "__init__.py").write_text("")
    (root / "corruptmods" / "tiny.py").write_text(TINY)
    demo.preprocess().save(root / "pre.json")
    images, _ = demo.raw_split("val")
    (root / "imgs").mkdir()
    for i in range(12):
        Image.fromarray(images[i], mode="L").save(root / "imgs" / f"{i:04d}.png")
    (root / "imgs" / "zz_notes.png").write_text("notes from the photo session, not a picture\n")
    return root


@pytest.fixture
def in_project(project: Path, monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> Path:
    """The project as the working folder, with a fresh reference export cache."""
    monkeypatch.chdir(project)
    monkeypatch.syspath_prepend(str(project))
    monkeypatch.setenv("TRTREPO_CACHE_DIR", str(tmp_path / "cache"))
    yield project
    for name in ("corruptmods.tiny", "corruptmods"):
        sys.modules.pop(name, None)


def _refused(res) -> None:
    """Exit 2 and one line naming the file as the user wrote its folder (--data imgs)."""
    assert res.exit_code == 2, res.output
    assert res.stderr.strip() == f"error: {Path('imgs') / 'zz_notes.png'}: {NOT_AN_IMAGE}"


def _nothing_in(tmp_path: Path) -> list[str]:
    """What the command wrote under tmp_path (the export cache, reports, repositories, work folders)."""
    return sorted(str(p.relative_to(tmp_path)) for p in tmp_path.rglob("*"))


# --------------------------------------------------------------------------------------------
# The check itself


def test_the_header_check_names_what_is_wrong_with_each_file(tmp_path):
    rng = np.random.default_rng(0)
    pixels = (rng.random((24, 24, 3)) * 255).astype(np.uint8)
    Image.fromarray(pixels).save(tmp_path / "ok.png")
    Image.fromarray(pixels).save(tmp_path / "photo.png", format="JPEG")  # a JPEG named .png: an image all the same
    png = (tmp_path / "ok.png").read_bytes()
    (tmp_path / "cut.png").write_bytes(png[: len(png) // 2])
    (tmp_path / "empty.jpg").write_bytes(b"")
    (tmp_path / "notes.png").write_text("hello\n")
    assert image_problem(tmp_path / "ok.png") is None
    assert image_problem(tmp_path / "photo.png") is None
    assert image_problem(tmp_path / "notes.png") == "not an image (cannot identify image file)"
    assert image_problem(tmp_path / "empty.jpg") == "not an image (cannot identify image file)"
    problem = image_problem(tmp_path / "cut.png")
    assert problem is not None and problem.startswith("a damaged image (") and str(tmp_path) not in problem


def test_a_file_replaced_after_a_check_is_checked_again(tmp_path):
    """The checks are remembered per file version (a command opens its folder twice), so a file
    rewritten in between is judged on its new content."""
    images, _ = demo.raw_split("val")
    for i in range(3):
        Image.fromarray(images[i], mode="L").save(tmp_path / f"{i}.png")
    assert scan_image_folder(tmp_path) == (sorted(tmp_path.iterdir()), [])
    (tmp_path / "1.png").write_text("overwritten by a text editor\n")
    with pytest.raises(OptionError) as err:
        scan_image_folder(tmp_path)
    assert err.value.with_flags(SKIP) == f"{tmp_path / '1.png'}: {NOT_AN_IMAGE}"
    assert err.value.message.endswith("; skip_non_images=True skips such files")


def test_the_error_counts_the_other_unreadable_files(tmp_path):
    images, _ = demo.raw_split("val")
    Image.fromarray(images[0], mode="L").save(tmp_path / "a.png")
    for name in ("b.png", "c.jpg", "d.webp"):
        (tmp_path / name).write_text("text")
    with pytest.raises(OptionError) as err:
        open_data(str(tmp_path), preprocess=demo.preprocess())
    assert err.value.with_flags(SKIP) == (f"{tmp_path / 'b.png'}: not an image (cannot identify image file) (2 more "
                                          f"file(s) of {tmp_path} as well); --skip-non-images skips such files")


def test_skip_non_images_skips_unreadable_files_naming_them(project, caplog):
    """Skipped with a warning naming the count and the files (why for each one whose name looks
    like an image's); the samples are the readable images, in order."""
    folder = project / "imgs"
    src = open_data(str(folder), preprocess=demo.preprocess(), skip_non_images=True)
    assert len(src) == 12 and [p.name for p in src.sample_files()] == [f"{i:04d}.png" for i in range(12)]
    assert check_image_folder(str(folder), skip_non_images=True) == [folder / "zz_notes.png"]
    assert check_image_folder("demo:val") == [] and check_image_folder(None) == []
    warned = [r.getMessage() for r in caplog.records if r.name == "trtrepo.data"]
    assert warned == [f"{folder}: skipped 1 file(s) that are not images (--skip-non-images): "
                      "zz_notes.png [not an image (cannot identify image file)]"]


# --------------------------------------------------------------------------------------------
# The commands: refused before any work, nothing written


def test_validate_names_the_file_before_exporting_or_contacting_the_server(in_project, run_cli, tmp_path, demo_onnx):
    """The issue's case: a PyTorch reference whose IO is read off the data. The error is the
    file's (not 'cannot derive its IO by exporting it'), no reference export lands in the cache
    and the server (a listening socket here) gets no connection; with --onnx too."""
    listener = socket.create_server(("127.0.0.1", 0))
    listener.setblocking(False)
    url = f"127.0.0.1:{listener.getsockname()[1]}"
    try:
        for extra in ((), ("--onnx", str(demo_onnx))):
            res = run_cli("validate", "--url", url, "--model", "tiny", "--reference", "corruptmods.tiny:build",
                          "--data", "imgs", "--preprocess", "pre.json", "--report", str(tmp_path / "report"),
                          "--csv", str(tmp_path / "samples.csv"), *extra)
            _refused(res)
            with pytest.raises(BlockingIOError):
                listener.accept()
    finally:
        listener.close()
    assert _nothing_in(tmp_path) == []  # no export in the cache, no report, no CSV


def test_deploy_names_the_file_before_exporting(in_project, run_cli, tmp_path, demo_onnx):
    """A PyTorch source (export reads the data's shapes) and an ONNX source (the data is first
    read by calibration): refused before the work folder, the export or the repository."""
    for source in ("corruptmods.tiny:build", str(demo_onnx)):
        res = run_cli("deploy", source, "--data", "imgs", "--preprocess", "pre.json", "--backend", "onnxruntime",
                      "--repo", str(tmp_path / "repo"), "--workdir", str(tmp_path / "work"))
        _refused(res)
        assert _nothing_in(tmp_path) == []
    # --eval-data is checked the same way
    res = run_cli("deploy", str(demo_onnx), "--data", "demo:calib", "--eval-data", "imgs", "--preprocess", "pre.json",
                  "--backend", "onnxruntime", "--repo", str(tmp_path / "repo"), "--workdir", str(tmp_path / "work"))
    _refused(res)
    assert _nothing_in(tmp_path) == []


def test_calibrate_and_quantize_name_the_file_and_write_nothing(in_project, run_cli, tmp_path, demo_onnx):
    res = run_cli("calibrate", str(demo_onnx), "--data", "imgs", "--preprocess", "pre.json",
                  "--cache", str(tmp_path / "calib.cache"), "--ranges", str(tmp_path / "ranges.json"))
    _refused(res)
    res = run_cli("quantize", str(demo_onnx), "-o", str(tmp_path / "int8.onnx"), "--data", "imgs",
                  "--preprocess", "pre.json", "--report", str(tmp_path / "report"))
    _refused(res)
    assert _nothing_in(tmp_path) == []


def test_calibrate_with_skip_non_images_runs_on_the_images(in_project, run_cli, tmp_path, demo_onnx, caplog):
    imgs = tmp_path / "imgs"  # a folder of its own: a folder's skip warning is given once per process
    shutil.copytree(in_project / "imgs", imgs)
    res = run_cli("calibrate", str(demo_onnx), "--data", str(imgs), "--preprocess", "pre.json", "--skip-non-images",
                  "--method", "minmax", "--ranges", str(tmp_path / "ranges.json"))
    assert res.exit_code == 0, res.output
    assert "on 12 samples" in res.output and (tmp_path / "ranges.json").is_file()
    warned = [r.getMessage() for r in caplog.records if r.name == "trtrepo.data"]
    assert warned == [f"{imgs}: skipped 1 file(s) that are not images (--skip-non-images): "
                      "zz_notes.png [not an image (cannot identify image file)]"]
