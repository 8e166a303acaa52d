"""Issue 28 item 5: ``.npy``/``.npz`` data are read only as far as ``--limit`` needs, a declared
size beyond the bound is refused before anything is inflated, and the rows read are exactly the
subset the in-memory rule picks."""

from __future__ import annotations

import subprocess
import sys
import zipfile
from pathlib import Path

import numpy as np
import pytest

from trtrepo import arrayfile
from trtrepo.data import ArraySource, open_data
from trtrepo.errors import UsageError

ROW = (3, 224, 224)


def _samples(source) -> list[dict[str, np.ndarray]]:
    return [dict(s.inputs) | ({"label": s.label} if s.label is not None else {}) for s in source]


@pytest.mark.parametrize("chunk", [100, 24], ids=["rows per piece", "pieces per row"])
@pytest.mark.parametrize("limit,seed", [(None, None), (5, None), (5, 3), (40, 0), (1, 7)])
def test_rows_read_from_files_are_the_subset_of_the_in_memory_rule(tmp_path, monkeypatch, limit, seed, chunk):
    monkeypatch.setattr(arrayfile, "CHUNK_BYTES", chunk)  # many small pieces: their edges are exercised (rows: 80, 56 B)
    rng = np.random.default_rng(0)
    a = rng.normal(size=(23, 4, 5)).astype(np.float32)
    b = np.asfortranarray(rng.integers(0, 9, size=(23, 7)).astype(np.int64))
    labels = rng.integers(0, 3, size=23)
    np.savez_compressed(tmp_path / "d.npz", a=a, b=b, labels=labels)
    np.save(tmp_path / "d.npy", a)
    want = ArraySource("mem", {"a": a, "b": np.ascontiguousarray(b)}, labels).subset(limit, seed)
    got = open_data(str(tmp_path / "d.npz"), limit=limit, seed=seed)
    assert len(got) == len(want)
    for x, y in zip(_samples(got), _samples(want), strict=True):
        assert x.keys() == y.keys() and all(np.array_equal(x[k], y[k]) for k in x)
    one = [next(iter(s.inputs.values())) for s in open_data(str(tmp_path / "d.npy"), limit=limit, seed=seed)]
    ref = [next(iter(s.inputs.values())) for s in ArraySource("mem", {None: a}).subset(limit, seed)]  # type: ignore[dict-item]
    assert len(one) == len(ref) and all(np.array_equal(x, y) for x, y in zip(one, ref, strict=True))


def _bomb(path: Path, rows: int, key: str = "input", data_rows: int | None = None) -> Path:
    """An npz whose member declares ``rows`` x 3x224x224 float32 zeros and holds ``data_rows`` of
    them (all when None), deflated: 2000 rows are 1.2 GB in about 1.2 MB."""
    header = {"descr": "<f4", "fortran_order": False, "shape": (rows, *ROW)}
    row = bytes(int(np.prod(ROW)) * 4)
    with zipfile.ZipFile(path, "w", zipfile.ZIP_DEFLATED, compresslevel=9) as zf, \
            zf.open(f"{key}.npy", "w", force_zip64=True) as f:
        np.lib.format.write_array_header_1_0(f, header)
        for _ in range(rows if data_rows is None else data_rows):
            f.write(row)
    return path


def _model(path: Path) -> Path:
    import onnx
    from onnx import TensorProto, helper

    graph = helper.make_graph([helper.make_node("GlobalAveragePool", ["input"], ["pooled"])], "pool",
                              [helper.make_tensor_value_info("input", TensorProto.FLOAT, ["N", *ROW])],
                              [helper.make_tensor_value_info("pooled", TensorProto.FLOAT, ["N", 3, 1, 1])])
    onnx.save(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)]), path)
    return path


@pytest.mark.slow
@pytest.mark.long
def test_an_npz_bomb_with_limit_8_stays_under_300_mb(tmp_path):
    """calibrate's default --seed 0 draws a random 8 of the 2000 samples: the member is streamed
    to its last picked row (about 1.2 GB inflated in 16 MB chunks) and 8 rows are kept."""
    bomb = _bomb(tmp_path / "bomb.npz", 2000)
    assert bomb.stat().st_size < 2 * 2**20  # 1.2 GB of samples in a file of about 1.2 MB
    model = _model(tmp_path / "pool.onnx")
    args = [sys.executable, "-m", "trtrepo.cli", "calibrate", str(model), "--data", str(bomb), "--limit", "8",
            "--method", "minmax", "--cache", str(tmp_path / "cache.bin")]
    probe = ("import resource, subprocess, sys; r = subprocess.run(sys.argv[1:]); "
             "print(r.returncode, resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss)")
    out = subprocess.run([sys.executable, "-c", probe, *args], capture_output=True, text=True, timeout=300)
    code, rss_kb = (int(x) for x in out.stdout.split()[-2:])
    assert code == 0, out.stderr
    assert rss_kb < 300 * 1024, f"peak RSS {rss_kb / 1024:.0f} MB"


def test_a_declared_size_beyond_the_bound_is_refused_before_inflating(tmp_path):
    bomb = _bomb(tmp_path / "huge.npz", 10**6, data_rows=1)  # declares 602 GB, holds one row
    with pytest.raises(UsageError, match=r"huge.npz: key 'input': 1000000 samples of shape \[3, 224, 224\] float32 are "
                                         r"560.8 GiB, more than the 2 GiB"):
        open_data(str(bomb))
    assert len(open_data(str(bomb), limit=1)) == 1  # the one row it holds is readable


def test_a_truncated_member_names_the_file_and_key(tmp_path):
    short = _bomb(tmp_path / "short.npz", 10, data_rows=4)
    with pytest.raises(UsageError, match=r"short.npz: key 'input': the file ends before"):
        open_data(str(short))
    assert len(open_data(str(short), limit=4)) == 4
