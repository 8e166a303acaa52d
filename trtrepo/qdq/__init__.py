"""Explicit INT8 quantization: insert QuantizeLinear/DequantizeLinear (Q/DQ) nodes into an ONNX model.

The placement and insertion algorithm; the flow of ``trtrepo quantize`` around it (calibrate, try
the methods, judge on held-out data) is :mod:`trtrepo.quantize` (docs/architecture.md, "Names").

Two targets, because their consumers need different graphs:

``tensorrt`` (TensorRT 10/11 explicit quantization, the placement ModelOpt uses)
    * the activation inputs and the weights of Conv, ConvTranspose, Gemm and MatMul get Q/DQ;
    * weights: symmetric int8 per output channel (Conv axis 0, ConvTranspose axis 1, Gemm
      axis 0 with ``transB=1`` else 1, MatMul the last axis), FP32 weights behind Q -> DQ so
      TensorRT quantizes them at build time;
    * activations: symmetric int8 per tensor, zero point 0, scale ``amax / 127``;
    * residual Add: the input coming from the convolution backbone gets no Q/DQ, the other
      (residual) input does, so TensorRT fuses Conv + Add (+ ReLU) with INT8 I/O;
    * outputs of quantized ops get no Q (TensorRT picks output precision itself), network
      outputs are never quantized.

``onnxruntime`` (ONNX Runtime's CPU integer kernels)
    * node units: the activation inputs *and* the output of Conv, ConvTranspose, Gemm, MatMul,
      Add, Mul, AveragePool and GlobalAveragePool are quantized, so ONNX Runtime turns
      ``DQ -> Conv -> Q`` into QLinearConv, ``DQ -> Add -> Q`` into QLinearAdd and so on. An
      output that feeds a single Relu/Clip is quantized after the activation instead (ONNX
      Runtime drops a Relu in front of a Q whose zero point is the type minimum);
    * transformer-safe (``QuantizeOptions.transformer_safe``, default): an Add/Mul/pool unit only
      where one of its inputs is already a quantized unit output; a MatMul/Gemm whose output feeds
      a float op keeps a float output (``DQ -> MatMul`` runs as MatMulIntegerToFloat) instead of
      being requantized; residual-stream Adds and GELU/SiLU gating products stay float (see
      :func:`find_float_nodes`);
    * activations: uint8 asymmetric per tensor over ``[min, max]`` (clipped to the method's
      ``amax``) -- ONNX Runtime's CPU kernels run symmetric int8 activations slower than FP32 and
      u8 asymmetric ones faster (docs/benchmarks.md, "INT8 on the CPU (issue 4)"); without measured min/max a tensor that is provably non-negative (after Relu,
      Softmax, pooling of those, ...) gets ``[0, amax]``, any other ``[-amax, amax]``;
    * weights: int8 per output channel, symmetric, stored as int8 initializers behind a DQ;
      biases of Conv/Gemm as int32 with scale ``s_x * s_w`` (what QLinearConv/QGemm need); a
      channel whose bias does not fit int32 there (a near-dead channel: tiny weights, large bias)
      gets a larger weight scale instead of a clipped or overflowing bias (:func:`_bias_scale_floors`);
    * a dense Conv with a tiny reduction (``Cin * kh * kw < 16``, the first conv of a one-channel
      image model) stays float: ONNX Runtime's float kernel is faster there
      (:func:`keep_float_small_conv`);
    * network outputs are never quantized.

Both targets, transformer-aware (:func:`find_float_nodes`, reported in the plan's ``auto_float``
and ``float_tensors``, with a warning naming the mask tensors): tensors whose range is non-finite
or absurdly large next to the others (an additive attention mask holding ``finfo.min``) and
everything downstream of them up to the Softmax stay float; so do Softmax, LayerNormalization,
GEMV MatMuls and, unless ``quantize_attention``, the activation-activation MatMuls of attention
(Q.K^T, P.V) with the scale/mask ops between Q.K^T and the Softmax.

The placement is a list of named rule functions (a registered :class:`QdqTarget`'s ``rules``:
:data:`QDQ_TARGETS` holds ``tensorrt``, ``onnxruntime`` and the plug-ins' targets), each returning
:class:`QuantPoint` s for one node; :func:`plan_qdq` runs them and :func:`insert_qdq` rewrites
the graph in one pass. Nothing here patches ONNX Runtime or imports ModelOpt.

Stable API::

    QuantizeOptions(target="tensorrt", exclude_ops=(), exclude_nodes=(), per_channel=True, quantize_attention=False)
    ActivationRange(amax, lo=None, hi=None)
    plan_qdq(model, options, ranges=None) -> QdqPlan
    find_float_nodes(view, options, ranges=None) -> FloatReasons     # what stays float, and why
    insert_qdq(model, ranges, options) -> QuantizedModel     # in memory; ranges: {tensor: amax | ActivationRange}
    quantize_model(onnx_path, ranges, out_path, options) -> QuantizeResult   # file in, file out (atomic)
    ranges_from_cache(path, model) -> {tensor: amax};  ranges_from_json(path) -> {tensor: ActivationRange}
"""

from __future__ import annotations

from .detector import TASKS as DETECTOR_TASKS
from .detector import decode_head_nodes, detector_outputs, find_decode_heads
from .graph import GraphView, load_model, model_tensor_names, prepare_model, weight_axis, weights_as_inputs
from .insert import QParams, QuantizedModel, activation_qparams, insert_qdq, quantize_weight, warn_float, weight_qparams
from .modelfiles import (
    QuantizeResult,
    RangesFile,
    quantize_model,
    quantize_result,
    ranges_from_cache,
    ranges_from_json,
    save_model,
)
from .options import (
    CHECK_FULL_BYTES,
    MIN_OPSET,
    ORT_FUSED_ACTIVATIONS,
    ORT_UNIT_OPS,
    QDQ_TARGETS,
    WEIGHTED_OPS,
    ActivationRange,
    QdqTarget,
    QuantizeOptions,
    QuantPoint,
    RangeLike,
    as_range,
    backend_target,
    qdq_target,
    register_target,
    target_names,
)
from .plan import NothingToQuantize, QdqPlan, plan_qdq
from .rules import (
    MASK_CONSTANT,
    OUTLIER_FLOOR,
    REQUIRED_RULES,
    FloatReasons,
    Rule,
    conv_silu_input,
    find_float_nodes,
    gating_product,
    keep_float_small_conv,
    residual_stream_add,
    rule_node_unit,
    rule_residual_add,
    rule_weighted_op_inputs,
    unquantizable_ranges,
)

__all__ = [
    "conv_silu_input",
    "DETECTOR_TASKS",
    "decode_head_nodes",
    "detector_outputs",
    "find_decode_heads",
    "ActivationRange",
    "CHECK_FULL_BYTES",
    "FloatReasons",
    "GraphView",
    "MASK_CONSTANT",
    "MIN_OPSET",
    "NothingToQuantize",
    "ORT_FUSED_ACTIVATIONS",
    "ORT_UNIT_OPS",
    "OUTLIER_FLOOR",
    "QParams",
    "QdqPlan",
    "QuantPoint",
    "QuantizeOptions",
    "RangesFile",
    "QuantizeResult",
    "QuantizedModel",
    "REQUIRED_RULES",
    "RangeLike",
    "Rule",
    "QDQ_TARGETS",
    "QdqTarget",
    "WEIGHTED_OPS",
    "as_range",
    "quantize_result",
    "activation_qparams",
    "find_float_nodes",
    "gating_product",
    "insert_qdq",
    "keep_float_small_conv",
    "load_model",
    "model_tensor_names",
    "plan_qdq",
    "prepare_model",
    "backend_target",
    "qdq_target",
    "quantize_model",
    "quantize_weight",
    "ranges_from_cache",
    "ranges_from_json",
    "register_target",
    "residual_stream_add",
    "rule_node_unit",
    "rule_residual_add",
    "rule_weighted_op_inputs",
    "save_model",
    "target_names",
    "unquantizable_ranges",
    "warn_float",
    "weight_axis",
    "weight_qparams",
    "weights_as_inputs",
]
