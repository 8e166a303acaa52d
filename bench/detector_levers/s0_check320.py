from common import *
print("existing default 320:", mAP(Path("/tmp/trtrepo-detector/all-INT8.onnx"), 320), flush=True)
held, fp, det = reference(320)
print("boxes per crop first/second half:", sum(len(d.classes) for d in det["output0"].reference[:160]), sum(len(d.classes) for d in det["output0"].reference[160:]))
