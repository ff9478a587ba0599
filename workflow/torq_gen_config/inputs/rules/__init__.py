"""The rules table: ``(domain, op type, formal input name) -> rule`` (docs/inputs.md)."""

from __future__ import annotations

from ..site import Rule
from .axes import _dft_axis, _pad_axes, _reduce_axes, _single_axis, _squeeze_axes, _unsqueeze_axes
from .indices import (
    _attention_kv_len, _bounded_by, _compress_condition, _false, _gathernd_indices, _indices_along_axis,
    _loop_trip_count, _maxunpool_indices, _maxunpool_output_shape, _onehot_depth, _onehot_indices, _revseq_time,
    _rnn_time, _seq_lens, _tensorscatter_indices, _true,
)
from .nms import _nms_boxes, _nms_input, _nms_max_boxes
from .shapes import (
    _affine_grid_size, _center_crop_pad_shape, _col2im_block_shape, _col2im_image_shape, _constant_of_shape,
    _expand_shape, _pad_pads, _range_delta, _range_limit, _range_start, _reshape_shape, _resize_roi, _resize_scales,
    _resize_sizes, _split_sizes, _split_to_sequence_sizes, _tile_repeats, _topk_k,
)
from .signal import (
    _dft_length, _mel_dft_length, _mel_lower, _mel_num_bins, _mel_sample_rate, _mel_upper, _stft_frame_length,
    _stft_frame_step, _window_size,
)
from .slice import _slice_inputs
from .values import (
    _bitshift_amount, _clip_bound, _dropout_ratio, _int_exponent, _nonzero_divisor, _nonzero_input, _positive_scale,
    _roi_align_rois, _string_normalizer_input, _string_split_input, _unique_input, _unit_interval, _variance,
)


def _reduce_ops():
    return ("ReduceL1", "ReduceL2", "ReduceLogSum", "ReduceLogSumExp", "ReduceMax", "ReduceMean", "ReduceMin",
            "ReduceProd", "ReduceSum", "ReduceSumSquare")


#: (domain, op type, formal input name) -> rule. Domain "" is ai.onnx. Each rule's
#: docstring states its constraint and the spec page; docs/inputs.md has the table.
RULES: dict[tuple[str, str, str], Rule] = {
    # axes
    **{("", op, "axes"): _reduce_axes for op in _reduce_ops()},
    ("", "Squeeze", "axes"): _squeeze_axes,
    ("", "Unsqueeze", "axes"): _unsqueeze_axes,
    ("", "CumSum", "axis"): _single_axis("x", "CumSum"),
    ("", "CumProd", "axis"): _single_axis("x", "CumProd"),
    ("", "DFT", "axis"): _dft_axis,
    ("", "Pad", "axes"): _pad_axes,
    # indices
    ("", "Gather", "indices"): _indices_along_axis("data", "Gather"),
    ("", "GatherElements", "indices"): _indices_along_axis("data", "GatherElements"),
    ("", "ScatterElements", "indices"): _indices_along_axis("data", "ScatterElements", unique_if_no_reduction=True),
    ("", "Scatter", "indices"): _indices_along_axis("data", "Scatter", unique_if_no_reduction=True),
    ("", "GatherND", "indices"): _gathernd_indices(False, "GatherND"),
    ("", "ScatterND", "indices"): _gathernd_indices(True, "ScatterND"),
    ("", "OneHot", "depth"): _onehot_depth,
    ("", "OneHot", "indices"): _onehot_indices,
    ("", "TensorScatter", "write_indices"): _tensorscatter_indices,
    ("", "NegativeLogLikelihoodLoss", "target"): _bounded_by("input", 1, "NegativeLogLikelihoodLoss", "target"),
    ("", "SoftmaxCrossEntropyLoss", "labels"): _bounded_by("scores", 1, "SoftmaxCrossEntropyLoss", "labels"),
    ("", "RoiAlign", "batch_indices"): _bounded_by("X", 0, "RoiAlign", "batch_indices"),
    ("", "RotaryEmbedding", "position_ids"): _bounded_by("cos_cache", 0, "RotaryEmbedding", "position_ids"),
    ("ai.onnx.ml", "ArrayFeatureExtractor", "Y"): _bounded_by(
        "X", -1, "ArrayFeatureExtractor", "Y",
        "https://onnx.ai/onnx/operators/onnx_aionnxml_ArrayFeatureExtractor.html"),
    ("", "MaxUnpool", "I"): _maxunpool_indices,
    ("", "MaxUnpool", "output_shape"): _maxunpool_output_shape,
    ("", "ReverseSequence", "sequence_lens"): _seq_lens(_revseq_time, "ReverseSequence"),
    ("", "RNN", "sequence_lens"): _seq_lens(_rnn_time, "RNN"),
    ("", "GRU", "sequence_lens"): _seq_lens(_rnn_time, "GRU"),
    ("", "LSTM", "sequence_lens"): _seq_lens(_rnn_time, "LSTM"),
    ("", "Attention", "nonpad_kv_seqlen"): _attention_kv_len,
    ("", "Loop", "M"): _loop_trip_count,
    ("", "Loop", "cond"): _true,
    ("", "Compress", "condition"): _compress_condition,
    # shapes, sizes, counts
    ("", "Reshape", "shape"): _reshape_shape,
    ("", "Expand", "shape"): _expand_shape,
    ("", "ConstantOfShape", "input"): _constant_of_shape,
    ("", "Tile", "repeats"): _tile_repeats,
    ("", "Resize", "scales"): _resize_scales,
    ("", "Resize", "sizes"): _resize_sizes,
    ("", "Resize", "roi"): _resize_roi,
    ("", "Upsample", "scales"): _resize_scales,
    ("", "Range", "start"): _range_start,
    ("", "Range", "delta"): _range_delta,
    ("", "Range", "limit"): _range_limit,
    ("", "Slice", "starts"): _slice_inputs,
    ("", "Slice", "ends"): _slice_inputs,
    ("", "Slice", "axes"): _slice_inputs,
    ("", "Slice", "steps"): _slice_inputs,
    ("", "Pad", "pads"): _pad_pads,
    ("", "Split", "split"): _split_sizes,
    ("", "SplitToSequence", "split"): _split_to_sequence_sizes,
    ("", "CenterCropPad", "shape"): _center_crop_pad_shape,
    ("", "Col2Im", "image_shape"): _col2im_image_shape,
    ("", "Col2Im", "block_shape"): _col2im_block_shape,
    ("", "AffineGrid", "size"): _affine_grid_size,
    ("", "HannWindow", "size"): _window_size,
    ("", "HammingWindow", "size"): _window_size,
    ("", "BlackmanWindow", "size"): _window_size,
    ("", "MelWeightMatrix", "num_mel_bins"): _mel_num_bins,
    ("", "MelWeightMatrix", "dft_length"): _mel_dft_length,
    ("", "MelWeightMatrix", "sample_rate"): _mel_sample_rate,
    ("", "MelWeightMatrix", "lower_edge_hertz"): _mel_lower,
    ("", "MelWeightMatrix", "upper_edge_hertz"): _mel_upper,
    ("", "STFT", "frame_length"): _stft_frame_length,
    ("", "STFT", "frame_step"): _stft_frame_step,
    ("", "DFT", "dft_length"): _dft_length,
    ("", "TopK", "K"): _topk_k,
    ("", "StringSplit", "X"): _string_split_input,
    ("", "StringNormalizer", "X"): _string_normalizer_input,
    ("", "Unique", "X"): _unique_input,
    ("", "NonZero", "X"): _nonzero_input,
    # value ranges
    ("", "NonMaxSuppression", "boxes"): _nms_input(_nms_boxes),
    ("", "NonMaxSuppression", "scores"): _nms_input(_unit_interval("NonMaxSuppression", "scores")),
    ("", "NonMaxSuppression", "max_output_boxes_per_class"): _nms_input(_nms_max_boxes),
    ("", "NonMaxSuppression", "iou_threshold"): _nms_input(_unit_interval("NonMaxSuppression", "iou_threshold")),
    ("", "NonMaxSuppression", "score_threshold"): _nms_input(_unit_interval("NonMaxSuppression", "score_threshold")),
    ("", "Dropout", "ratio"): _dropout_ratio,
    ("", "Dropout", "training_mode"): _false,
    ("", "Bernoulli", "input"): _unit_interval("Bernoulli", "input"),
    ("", "Div", "B"): _nonzero_divisor("Div"),
    ("", "Mod", "B"): _nonzero_divisor("Mod"),
    ("", "BitShift", "Y"): _bitshift_amount,
    ("", "Pow", "Y"): _int_exponent,
    ("", "Clip", "min"): _clip_bound(False),
    ("", "Clip", "max"): _clip_bound(True),
    ("", "QuantizeLinear", "y_scale"): _positive_scale("QuantizeLinear", "y_scale"),
    ("", "DequantizeLinear", "x_scale"): _positive_scale("DequantizeLinear", "x_scale"),
    ("", "QLinearConv", "x_scale"): _positive_scale("QLinearConv", "x_scale"),
    ("", "QLinearConv", "w_scale"): _positive_scale("QLinearConv", "w_scale"),
    ("", "QLinearConv", "y_scale"): _positive_scale("QLinearConv", "y_scale"),
    ("", "QLinearMatMul", "a_scale"): _positive_scale("QLinearMatMul", "a_scale"),
    ("", "QLinearMatMul", "b_scale"): _positive_scale("QLinearMatMul", "b_scale"),
    ("", "QLinearMatMul", "y_scale"): _positive_scale("QLinearMatMul", "y_scale"),
    ("", "BatchNormalization", "input_var"): _variance,
    ("", "RoiAlign", "rois"): _roi_align_rois,
}

