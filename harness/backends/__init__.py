"""The backends: the registry of everything a row can call (kernels, engine paths, peers, plugins), with the built-ins and the peers."""
