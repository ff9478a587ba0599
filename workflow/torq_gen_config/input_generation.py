"""Op-aware deterministic inputs: moved to the package :mod:`torq_gen_config.inputs`.

This module re-exports every name it defined (public and private) so that old imports
keep working; new code imports from :mod:`torq_gen_config.inputs`.
"""

from __future__ import annotations

from .inputs.generate import (  # noqa: F401
    _ALPHABET, _Generator, DEFAULT_INPUT_SETTINGS, generate_inputs, make_inputs,
)
from .inputs.rules import _reduce_ops, RULES  # noqa: F401
from .inputs.rules.axes import (  # noqa: F401
    _dft_axis, _pad_axes, _reduce_axes, _single_axis, _squeeze_axes, _unsqueeze_axes,
)
from .inputs.rules.helpers import (  # noqa: F401
    _axis, _choose_axes, _composition, _factorize, _norm_axes, _signed, _spatial_out, _SPEC,
)
from .inputs.rules.indices import (  # noqa: F401
    _attention_kv_len, _bounded_by, _compress_condition, _false, _gathernd_indices, _indices_along_axis,
    _loop_trip_count, _maxunpool_indices, _maxunpool_output_shape, _onehot_depth, _onehot_indices, _revseq_time,
    _rnn_time, _seq_lens, _tensorscatter_indices, _true,
)
from .inputs.rules.nms import _nms_boxes, _nms_input, _nms_max_boxes, _nms_solution, _solve_nms  # noqa: F401
from .inputs.rules.shapes import (  # noqa: F401
    _affine_grid_size, _broadcast_ok, _center_crop_pad_shape, _col2im_block_shape, _col2im_blocks,
    _col2im_image_shape, _constant_of_shape, _expand_shape, _pad_pads, _range_delta, _range_limit, _range_start,
    _reshape_shape, _resize_roi, _resize_scales, _resize_sizes, _resize_targets, _split_sizes,
    _split_to_sequence_sizes, _tile_repeats, _topk_k,
)
from .inputs.rules.signal import (  # noqa: F401
    _dft_length, _mel_dft_length, _mel_lower, _mel_num_bins, _mel_sample_rate, _mel_upper, _stft_frame_length,
    _stft_frame_step, _window_size,
)
from .inputs.rules.slice import _INT64_MAX, _slice_inputs, _slice_len, _slice_solution, _solve_slice  # noqa: F401
from .inputs.rules.values import (  # noqa: F401
    _bitshift_amount, _clip_bound, _dropout_ratio, _int_exponent, _nonzero_divisor, _nonzero_input, _positive_scale,
    _roi_align_rois, _string_normalizer_input, _string_split_input, _unique_input, _unit_interval, _variance,
    _words,
)
from .inputs.site import _formal_names, _Graph, InputSite, Rule  # noqa: F401
from .inputs.tensor_types import (  # noqa: F401
    _dims, _int_info, _is_float, _is_int, _known, _match, _SUB_BYTE_INTS, input_shape,
)

__all__ = ["generate_inputs", "InputSite", "RULES", "input_shape"]
