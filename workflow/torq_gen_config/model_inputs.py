"""The model's input values: moved to :mod:`torq_gen_config.inputs.model_inputs`.

This module re-exports every name it defined (public and private) so that old imports
(``rules/common.smk``, jobs, reference) keep working.
"""

from __future__ import annotations

from .inputs.model_inputs import (  # noqa: F401
    MODEL_INPUTS_FILE, _fits, _input_data_to_bf16, _kind, _raw_npz_member, cast_to_model_inputs, input_data_shapes,
    load_input_data, load_model_inputs, model_input_values, open_input_data, save_model_inputs,
)
