"""Rules for the signal-processing ops' sizes (windows, MelWeightMatrix, STFT, DFT length)."""

from __future__ import annotations

from ..site import InputSite


def _window_size(site: InputSite):
    """Hann/Hamming/BlackmanWindow ``size``: the declared output length, else in [1, 16];
    positive. Spec: https://onnx.ai/onnx/operators/onnx__HannWindow.html."""
    out = site.out_shape(0)
    return [out[0]] if out is not None and len(out) == 1 and out[0] else [int(site.rng.integers(1, 17))]


def _mel_num_bins(site: InputSite):
    """MelWeightMatrix ``num_mel_bins``: the declared output's dim 1 (else in [2, 9]).
    Spec: https://onnx.ai/onnx/operators/onnx__MelWeightMatrix.html (output
    [floor(dft_length/2) + 1, num_mel_bins])."""
    out = site.out_shape(0)
    return [out[1]] if out is not None and len(out) == 2 and out[1] else [int(site.rng.integers(2, 10))]


def _mel_dft_length(site: InputSite):
    """MelWeightMatrix ``dft_length``: 2 * (out[0] - 1) for the declared output (else 16)."""
    out = site.out_shape(0)
    return [2 * (out[0] - 1)] if out is not None and len(out) == 2 and out[0] and out[0] > 1 else [16]


def _mel_sample_rate(site: InputSite):
    """MelWeightMatrix ``sample_rate``: in [8000, 16000] Hz."""
    return [int(site.rng.integers(8000, 16001))]


def _mel_lower(site: InputSite):
    """MelWeightMatrix ``lower_edge_hertz``: in [0, 100) Hz."""
    return [float(site.rng.uniform(0.0, 100.0))]


def _mel_upper(site: InputSite):
    """MelWeightMatrix ``upper_edge_hertz``: in [0.5, 0.9) * sample_rate / 2 (below Nyquist,
    so that the highest triangle lies inside the spectrum). Spec:
    https://onnx.ai/onnx/operators/onnx__MelWeightMatrix.html."""
    sr = site.value_of("sample_rate")
    if sr is None or sr.size != 1:
        return None
    return [float(sr.reshape(-1)[0]) / 2 * float(site.rng.uniform(0.5, 0.9))]


def _stft_frame_length(site: InputSite):
    """STFT ``frame_length``: the window's length, else from the declared output's bins
    (onesided: 2 * (bins - 1)), else min(signal length, 8). Spec:
    https://onnx.ai/onnx/operators/onnx__STFT.html."""
    sig = site.shape_of("signal")
    if sig is None or len(sig) < 2 or sig[1] is None:
        return None
    win = site.shape_of("window")
    if win is not None and len(win) == 1 and win[0]:
        return [win[0]]
    out = site.out_shape(0)
    if out is not None and len(out) == 4 and out[2]:
        fl = 2 * (out[2] - 1) if int(site.attr("onesided", 1)) else out[2]
        if 0 < fl <= sig[1]:
            return [fl]
    return [min(sig[1], 8)]


def _stft_frame_step(site: InputSite):
    """STFT ``frame_step``: a positive step giving the declared number of frames,
    (length - frame_length) // step + 1, else frame_length // 2. Spec:
    https://onnx.ai/onnx/operators/onnx__STFT.html."""
    sig = site.shape_of("signal")
    if sig is None or len(sig) < 2 or sig[1] is None:
        return None
    fl = site.value_of("frame_length")
    win = site.shape_of("window")
    flen = int(fl.reshape(-1)[0]) if fl is not None and fl.size == 1 else (win[0] if win and win[0] else None)
    if not flen or flen > sig[1]:
        return None
    out = site.out_shape(0)
    if out is not None and len(out) == 4 and out[1]:
        for s in range(1, sig[1] + 1):
            if (sig[1] - flen) // s + 1 == out[1]:
                return [s]
    return [max(1, flen // 2)]


def _dft_length(site: InputSite):
    """DFT ``dft_length``: the signal's length on the transformed axis (positive). Spec:
    https://onnx.ai/onnx/operators/onnx__DFT.html."""
    x = site.shape_of("input")
    if x is None or len(x) < 2:
        return None
    av = site.value_of("axis") if site.input_name("axis") else None
    a = int(av.reshape(-1)[0]) if av is not None and av.size else int(site.attr("axis", 1))
    a = a + len(x) if a < 0 else a
    return [x[a]] if 0 <= a < len(x) and x[a] else None

