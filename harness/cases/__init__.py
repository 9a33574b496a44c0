"""The cases: the case-file format, the packaged suites, the attention variants and each case's deterministic inputs."""
