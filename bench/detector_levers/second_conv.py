"""Issue 43 study (judge only, no new calibration or rounding): the top-percentile files of
af2d93d:bench/detector_levers/top_percentile.py with the output of the second convolution
(``/model.1/conv``) and its SiLU's Sigmoid made float (their activation Q -> DQ pairs removed; the
weights and the SiLU's output stay quantized), judged by that script's ``judge`` on the 640 held-out
crops of bench/detector.py's wide set.

    python second_conv.py OUT FILE.onnx ...   # writes OUT/<stem>_m1float.onnx beside links to the inputs,
    git show af2d93d:bench/detector_levers/top_percentile.py > tp.py   # then drop its paired part (it pairs
    python tp.py judge OUT                                             # *_top with *_minmax)
"""
from __future__ import annotations

import sys
from pathlib import Path

import onnx


def strip(model: onnx.ModelProto, names: set[str]) -> onnx.ModelProto:
    """Every activation Q -> DQ pair on the output of a node named in ``names`` removed."""
    m = onnx.ModelProto()
    m.CopyFrom(model)
    g = m.graph
    producer = {o: n for n in g.node for o in n.output}
    inits = {i.name for i in g.initializer}
    rename = {n.output[0]: n.input[0] for n in g.node if n.op_type == "QuantizeLinear" and n.input[0] not in inits
              and n.input[0] in producer and producer[n.input[0]].name in names}
    rename.update({n.output[0]: rename[n.input[0]] for n in g.node if n.op_type == "DequantizeLinear" and n.input[0] in rename})
    keep = [n for n in g.node if not any(o in rename for o in n.output)]
    for n in keep:
        n.input[:] = [rename.get(x, x) for x in n.input]
    del g.node[:]
    g.node.extend(keep)
    return m


if __name__ == "__main__":
    out = Path(sys.argv[1])
    out.mkdir(parents=True, exist_ok=True)
    for f in map(Path, sys.argv[2:]):
        (out / f.name).unlink(missing_ok=True)
        (out / f.name).symlink_to(f.resolve())
        onnx.save(strip(onnx.load(str(f)), {"/model.1/conv/Conv", "/model.1/act/Sigmoid"}), str(out / f"{f.stem}_m1float.onnx"))
