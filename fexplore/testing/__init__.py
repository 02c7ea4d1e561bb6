"""Testing helpers that ship with fexplore: conformance harnesses shared by the test suite and the
benchmarks (``opinfo``: PyTorch's own OpInfo samples, one op at a time, through every stage;
``mutants``: faults injected into the passes, and the check that catches each;
``fuzz``, ``fuzz_check``, ``fuzz_shrink``: the differential fuzzer, random modules from a seed
compiled through every stage and compared with eager, failures shrunk to a minimal module)."""
