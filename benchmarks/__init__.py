"""Every performance figure of relif-ray: the suites, the harness they share, the CPU run
(`python -m benchmarks.run`) and the prepared GPU check (`python -m benchmarks.gpu_check`),
run from the repository root (docs/benchmarks.md)."""
