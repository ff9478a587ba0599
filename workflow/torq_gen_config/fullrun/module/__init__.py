"""The assignment compiled and run as ONE IREE program with per-op devices (``run
--run-mode module``/``auto``): mode (module or partitions, and why; the module plan),
program (compile: flow-level pins, the shared-executable split), run (run, read back where
each op ran, the verdict; the partitions when it fails), bisect (the first differing
output and layer of a module that differs)."""
