"""Every performance figure of relif-ray: the suites, the harness they share, the CPU run
(`python -m benchmarks.run`) and the prepared GPU check (`python -m benchmarks.gpu_check`);
and the fidelity experiment, what ReLiF is for (`python -m benchmarks.fidelity`), with the
harness's rows, targets and record. Run from the repository root (docs/benchmarks.md)."""
