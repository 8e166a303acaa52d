"""Issue 39 item 8, the data rows: each case is one line on stderr naming the file, key or option
at fault, exit 2, and no Python exception name (real CLI, in-process, the demo model)."""

from __future__ import annotations

import os
import re
import struct
import zipfile

import numpy as np
import pytest

_EXCEPTION = re.compile(r"Traceback|\b[A-Z]\w*(Error|Exception)\b")


def _samples() -> np.ndarray:
    return np.zeros((4, 1, 32, 32), np.float32)


def _non_utf8_key(tmp_path):
    """A member name flagged UTF-8 (bit 11) that is not: ``inp\\xfft.npy``."""
    path = tmp_path / "names.npz"
    with zipfile.ZipFile(path, "w") as zf:
        with zf.open("inpXt.npy", "w") as f:
            np.lib.format.write_array(f, _samples())
    data = bytearray(path.read_bytes().replace(b"inpXt.npy", b"inp\xfft.npy"))
    for signature, flags_at in ((b"PK\x03\x04", 6), (b"PK\x01\x02", 8)):
        i = data.find(signature) + flags_at
        struct.pack_into("<H", data, i, struct.unpack_from("<H", data, i)[0] | 0x800)
    path.write_bytes(bytes(data))
    return ["--data", path], [f"{path}: not a readable .npz file", "inp\\xfft.npy", "not valid UTF-8"]


def _non_utf8_tensor_name(tmp_path):
    """A model whose input is named ``inp\xfft`` (protobuf hands the name over as bytes; before: a
    TypeError from joining the input names into the message about the npz's key)."""
    from onnx import TensorProto, helper

    graph = helper.make_graph([helper.make_node("Relu", ["inpZt"], ["out"])], "g",
                              [helper.make_tensor_value_info("inpZt", TensorProto.FLOAT, ["N", 4])],
                              [helper.make_tensor_value_info("out", TensorProto.FLOAT, ["N", 4])])
    model = tmp_path / "names.onnx"
    model.write_bytes(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)]).SerializeToString()
                      .replace(b"inpZt", b"inp\xfft"))
    np.savez(tmp_path / "d.npz", x=np.zeros((4, 4), np.float32), y2=np.zeros((4, 4), np.float32))
    return ["--data", tmp_path / "d.npz"], [f"{model}: the tensor name 'inp\\xfft' is not valid UTF-8"], model


def _fifo(tmp_path, name):
    path = tmp_path / name
    os.mkfifo(path)
    return ["--data", path], [f"{path}: a FIFO (named pipe), not a regular file or a folder"]


def _array(tmp_path, array, what, key="input"):
    path = tmp_path / "d.npz"
    np.savez(path, **{key: array})
    return ["--data", path], [f"{path}: key '{key}': the array holds {what}", "trtrepo reads bool, integer and floating-point"]


def _npz_labels(tmp_path, labels, shown):
    path = tmp_path / "d.npz"
    np.savez(path, input=_samples(), labels=np.asarray(labels))
    return ["--data", path], [f"{path}: key 'labels': label {shown} of sample 0 is not a class index",
                              "from 0 to 9 (the model's 10 classes)"]


def _labels_file(tmp_path, name, content, shown):
    np.savez(tmp_path / "d.npz", input=_samples())
    path = tmp_path / name
    if name.endswith(".npy"):
        np.save(path, np.asarray(content))
    else:
        path.write_text(content)
    return (["--data", tmp_path / "d.npz", "--labels", path],
            [f"{path}: label {shown} of sample 1 is not a class index", "from 0 to 9"])


def _labels_fifo(tmp_path):
    np.savez(tmp_path / "d.npz", input=_samples())
    os.mkfifo(tmp_path / "labels")
    return (["--data", tmp_path / "d.npz", "--labels", tmp_path / "labels"],
            [f"{tmp_path / 'labels'}: the labels file is a FIFO (named pipe), not a regular file"])


CASES = {
    "non-UTF-8 key": _non_utf8_key,
    "non-UTF-8 tensor name": _non_utf8_tensor_name,
    "FIFO .npz": lambda t: _fifo(t, "data.npz"),
    "FIFO without suffix": lambda t: _fifo(t, "data"),
    "string array": lambda t: _array(t, np.array(["a", "b", "c", "d"]), "strings (dtype <U1)"),
    "structured array": lambda t: _array(t, np.zeros(4, [("a", "<f4"), ("b", "<i4")]), "records (dtype |V8)"),
    "complex data": lambda t: _array(t, _samples().astype(np.complex64), "complex numbers (dtype <c8)"),
    "empty --data": lambda t: (["--data", ""], ["Invalid value for '--data': an empty value"]),
    "label -1": lambda t: _npz_labels(t, [-1, 0, 1, 2], "-1"),
    "label 1e12": lambda t: _npz_labels(t, [1e12, 0, 1, 2], "1000000000000"),
    "label NaN": lambda t: _npz_labels(t, [np.nan, 0, 1, 2], "nan"),
    "label 10 of 10 classes": lambda t: _npz_labels(t, [10, 0, 1, 2], "10"),
    "--labels 1.5 (.npy)": lambda t: _labels_file(t, "labels.npy", [0, 1.5, 2, 3], "1.5"),
    "--labels -1 (text)": lambda t: _labels_file(t, "labels.txt", "0\n-1\n2\n3\n", "-1"),
    "--labels FIFO": _labels_fifo,
    "--seed -5": lambda t: (["--data", "demo:calib", "--limit", "8", "--seed", "-5"],
                            ["Invalid value for '--seed': -5 is not in the range x>=0"]),
}


@pytest.mark.parametrize("case", list(CASES))
def test_bad_data_is_one_line_naming_it(run_cli, demo_onnx, tmp_path, case):
    args, fragments, *model = CASES[case](tmp_path)
    r = run_cli("calibrate", model[0] if model else demo_onnx, *args, "--method", "minmax", "--num-bins", "128", "--cache", tmp_path / "c.bin")
    lines = r.stderr.strip().splitlines()
    assert r.exit_code == 2 and len(lines) == 1 and lines[0].startswith("error: "), r.output
    assert all(f in lines[0] for f in fragments), (fragments, lines[0])
    assert not _EXCEPTION.search(lines[0]), lines[0]
    assert not (tmp_path / "c.bin").exists()


def test_an_empty_eval_data_is_refused_naming_the_option(run_cli, demo_onnx, tmp_path):
    r = run_cli("quantize", demo_onnx, "--data", "demo:calib", "--eval-data", "", "-o", tmp_path / "q.onnx")
    lines = r.stderr.strip().splitlines()
    assert r.exit_code == 2 and len(lines) == 1 and "Invalid value for '--eval-data': an empty value" in lines[0], r.output
    assert not (tmp_path / "q.onnx").exists()
