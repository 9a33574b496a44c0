"""Where rows run: one executor protocol (loop.py) in this process, over worker processes and over Ray."""
