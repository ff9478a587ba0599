"""ONNX's node tests run through discovery: the ``torq-gen-config conformance`` command and
``benchmarks/conformance.py`` share this package.

cases (collect and select the node tests, their inputs, expected outputs and fingerprint),
expected (an output against a test's expected output with its rtol/atol), discovery (one
``discover`` subprocess per test, reading its files back, re-running a compiled layer),
evaluate (one test's record per executor), matrix (op type x executor aggregation,
expected-failure lists), render (Markdown and HTML), runner (the resumable, parallel run).
"""
